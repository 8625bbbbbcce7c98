"""Policy files: which model answers for which role (YAML, validated)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from mascot.rosters import Roster
from mascot.rosters.yaml_file import YamlFileError, first_error_line, read_model

#: Roles every roster has besides its personas. ``default`` answers for any role the
#: file does not name.
FIXED_ROLES = ("director", "user", "judge", "default")


#: Default reply budget (tokens) of each role when its spec sets none; every other role
#: (the personas, ``default``) gets ``SPEAKER_MAX_TOKENS``. Sized on a real small model:
#: a constrained direction is at most ~100 tokens, a two-to-four-sentence reply ~40-120,
#: a judge's scores with a short rationale ~150-350.
ROLE_MAX_TOKENS = {"director": 160, "user": 96, "judge": 512}
SPEAKER_MAX_TOKENS = 160


def role_max_tokens(role: str) -> int:
    """The default reply budget of ``role`` (``ROLE_MAX_TOKENS``, else the speakers')."""
    return ROLE_MAX_TOKENS.get(role, SPEAKER_MAX_TOKENS)


class PolicyError(ValueError):
    """A policy file or flag combination is invalid; the message is one line."""


class PolicySpec(BaseModel):
    """How one role is answered.

    Attributes:
        kind: ``local`` (the in-process transformers backend) or ``openai`` (any
            OpenAI-compatible endpoint: OpenAI, vLLM, the local server).
        model: Hub id or directory of the base model (``local``), or the served model
            name (``openai``; with vLLM this names the LoRA adapter).
        adapter: PEFT adapter directory (``local`` only); relative paths are taken from
            the policy file's folder, as are ``local`` model paths starting with ``.``.
        version: Adapter version recorded with each reply.
        base_url: Endpoint URL (``openai`` only); ``None`` means OpenAI's own. A list names
            replicas of the same server: requests spread over them and skip a failing one
            (``mascot.policies.replicas``).
        api_key_env: Name of the environment variable holding the API key (``openai``
            only). The key itself is never written to a file or a log.
        temperature: Sampling temperature.
        max_tokens: Length limit per reply; ``None`` gives the role its own default
            budget (``ROLE_MAX_TOKENS``): a Director's JSON, a persona's reply, a simulated
            person's message and a judge's verdict differ in length.
        timeout: Seconds per request (``openai`` only).
        max_retries: Retries on connection errors, 429 and 5xx (``openai`` only).
        dtype: Precision of a ``local`` model; ``None`` picks bfloat16 where the device
            computes it natively, float32 elsewhere (``auto``: the model config's).
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["local", "openai"] = "local"
    model: str = Field(min_length=1)
    adapter: str | None = None
    version: str | None = None
    base_url: str | list[str] | None = None
    api_key_env: str | None = Field(default=None, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$")
    temperature: float = Field(default=0.7, ge=0.0, le=2.0)
    max_tokens: int | None = Field(default=None, ge=1)
    timeout: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=2, ge=0)
    dtype: Literal["auto", "bfloat16", "float16", "float32"] | None = None

    @property
    def urls(self) -> list[str]:
        """The endpoint URLs: none, one, or the replicas of a list ``base_url``."""
        if self.base_url is None:
            return []
        return [self.base_url] if isinstance(self.base_url, str) else list(self.base_url)

    @model_validator(mode="after")
    def _fields_fit_kind(self) -> PolicySpec:
        if isinstance(self.base_url, list) and (not self.base_url or not all(u.strip() for u in self.base_url)):
            raise ValueError("base_url: a list needs at least one URL, none of them empty")
        if self.kind == "openai" and self.dtype:
            raise ValueError("dtype is for kind 'local'; a server chooses its own precision")
        if self.kind == "local" and (self.base_url or self.api_key_env):
            raise ValueError("base_url and api_key_env are for kind 'openai', not 'local'")
        if self.kind == "openai" and self.adapter:
            raise ValueError(
                "adapter is for kind 'local'; with a server, name the adapter in 'model'"
            )
        return self


class PolicyFile(BaseModel):
    """A policy file: ``defaults`` merged into every entry of ``roles``."""

    model_config = ConfigDict(extra="forbid")

    version: Literal[1] = 1
    defaults: dict[str, object] = Field(default_factory=dict)
    roles: dict[str, dict[str, object]] = Field(default_factory=dict)


def load_policy_specs(path: str | Path, roster: Roster | None) -> dict[str, PolicySpec]:
    """Read a policy file and validate every role against the roster.

    Args:
        path: The YAML policy file.
        roster: The roster whose persona ids are valid roles (besides ``FIXED_ROLES``);
            ``None`` accepts any role name (a server serves whatever the file names).

    Returns:
        Role -> spec, with ``defaults`` applied and adapter paths made absolute. Roles
        the file does not name fall back to ``default`` when the caller asks for them.

    Raises:
        PolicyError: on a missing file, malformed YAML, an unknown role or an invalid
            entry; the message names the file, the role and the field.
    """
    path = Path(path).expanduser()
    try:
        policy_file = read_model(path, PolicyFile)
    except YamlFileError as exc:
        raise PolicyError(str(exc)) from None
    valid = (*FIXED_ROLES, *(roster.persona_ids if roster else ()))
    specs: dict[str, PolicySpec] = {}
    for role, entry in policy_file.roles.items():
        if roster is not None and role not in valid:
            raise PolicyError(
                f"{path}: unknown role '{role}' for roster '{roster.id}'; valid: {', '.join(valid)}"
            )
        try:
            spec = PolicySpec.model_validate({**policy_file.defaults, **(entry or {})})
        except ValidationError as exc:
            raise PolicyError(f"{path}: role '{role}': {first_error_line(exc)}") from None
        if spec.adapter:
            spec = spec.model_copy(update={"adapter": str((path.parent / spec.adapter).resolve())})
        if spec.kind == "local" and spec.model.startswith("."):
            spec = spec.model_copy(update={"model": str((path.parent / spec.model).resolve())})
        specs[role] = spec
    if not specs:
        raise PolicyError(f"{path}: no roles defined")
    return specs

