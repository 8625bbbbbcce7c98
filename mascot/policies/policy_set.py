"""The chat models of every role, built from policy specs (file, flags or code)."""

from __future__ import annotations

import logging
import os
from collections.abc import AsyncIterator, Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from langchain_core.outputs import ChatGenerationChunk, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import SecretStr

from mascot.policies.call_seed import call_seed
from mascot.policies.spec import PolicyError, PolicySpec, load_policy_specs, role_max_tokens
from mascot.policies.thinking import chat_template_kwargs
from mascot.rosters import Roster

if TYPE_CHECKING:
    from mascot.policies.local.backend import LocalBackend

logger = logging.getLogger(__name__)

#: Key sent to OpenAI-compatible servers that need none (vLLM, the local server).
_NO_KEY = "EMPTY"


class Policies:
    """Role -> chat model for one roster. Models are built on first use and cached.

    All ``local`` roles on the same base model share one ``LocalBackend``: one copy of
    the base weights in memory, each role's adapter loaded beside the others.
    """

    def __init__(
        self,
        specs: Mapping[str, PolicySpec],
        roster: Roster,
        *,
        seed: int | None = None,
        http_client: httpx.Client | None = None,
        http_async_client: httpx.AsyncClient | None = None,
        origin: Policies | None = None,
    ) -> None:
        """Hold the specs; nothing is loaded or contacted yet.

        Args:
            specs: Role -> spec; ``default`` answers for roles not named.
            roster: The roster whose personas are roles.
            seed: Seed for sampling (local backend) and the ``seed`` request field.
            http_client: Sync HTTP client for OpenAI-compatible roles (tests, proxies).
            http_async_client: Async HTTP client for OpenAI-compatible roles.
            origin: The policies these serve on an engine (``vllm.on_vllm``): turns
                are recorded as written by them (base model, adapter folder, version).
        """
        self.specs = dict(specs)
        self.origin = origin
        self.roster = roster
        self.seed = seed
        self._http_client = http_client
        self._http_async_client = http_async_client
        self._models: dict[str, BaseChatModel] = {}
        self._backends: dict[str, LocalBackend] = {}
        self._adapter_names: dict[str, str] = {}  # adapter path -> name in its backend

    @classmethod
    def from_file(cls, path: str | Path, roster: Roster, **kwargs: object) -> Policies:
        """Load a policy file (see ``load_policy_specs``); keyword args as for ``__init__``."""
        return cls(load_policy_specs(path, roster), roster, **kwargs)  # type: ignore[arg-type]

    @classmethod
    def single(cls, spec: PolicySpec, roster: Roster, **kwargs: object) -> Policies:
        """Every role answered by the same model."""
        return cls({"default": spec}, roster, **kwargs)  # type: ignore[arg-type]

    def spec(self, role: str) -> PolicySpec:
        """The spec of a role, or of ``default`` when the role is not named.

        Raises:
            PolicyError: if neither the role nor ``default`` has a spec.
        """
        spec = self.specs.get(role) or self.specs.get("default")
        if spec is None:
            raise PolicyError(
                f"no policy for role '{role}' and no 'default' role; named: {', '.join(sorted(self.specs))}"
            )
        return spec

    def without_adapters(self) -> Policies:
        """Every role on the bare base of this file's ``default`` role (adapters off), each
        with its own reply budget (``max_tokens``), so a baseline writes under the same
        budgets as the trained roles.

        A local base is not loaded twice: the new policies answer from this object's
        backend (one copy of the weights), loaded here first if it was not yet.

        Raises:
            PolicyError: if there is no ``default`` role, or its model cannot be loaded.
        """
        spec = self.spec("default").model_copy(update={"adapter": None, "version": None})
        if spec.kind == "local":
            self.chat_model("default")  # loads the shared backend with every adapter of the file
        origin = None
        if self.origin is not None:  # on an engine: recorded as the bare local base, which is never loaded
            local = self.origin.spec("default")
            if local.adapter:
                raise PolicyError("on an engine, the bare base is served by the 'default' role's name: "
                                  "give 'default' no adapter (name the roles that use one)")
            origin = Policies({"default": local}, self.roster, seed=self.seed)
        budgets = {role: spec.model_copy(update={"max_tokens": given.max_tokens})
                   for role, given in self.specs.items() if role != "default" and given.max_tokens != spec.max_tokens}
        bare = Policies({"default": spec, **budgets}, self.roster, seed=self.seed, http_client=self._http_client,
                        http_async_client=self._http_async_client, origin=origin)
        bare._backends = self._backends
        return bare

    def chat_model(self, role: str) -> BaseChatModel:
        """The chat model that answers for ``role``.

        Raises:
            PolicyError: if the role has no spec, an API key variable is unset, or the
                local model cannot be loaded.
        """
        if role not in self._models:
            spec = self.spec(role)
            if spec.kind == "openai":
                self._models[role] = openai_chat_model(
                    spec,
                    max_tokens=self.max_tokens(role),
                    seed=self.seed,
                    http_client=self._http_client,
                    http_async_client=self._http_async_client,
                )
            else:
                self._models[role] = self._local_model(role, spec)
        return self._models[role]

    def speakers(self) -> dict[str, BaseChatModel]:
        """Persona id -> chat model, for ``create_director_graph(speakers=...)``."""
        return {pid: self.chat_model(pid) for pid in self.roster.persona_ids}

    def max_tokens(self, role: str) -> int:
        """The reply budget of ``role``: its spec's ``max_tokens``, else the role's default."""
        return self.spec(role).max_tokens or role_max_tokens(role)

    def describe(self, role: str) -> str:
        """A short, secret-free description of a role's policy, for logs and output."""
        spec = self.spec(role)
        where = (",".join(spec.urls) or "openai") if spec.kind == "openai" else "local"
        adapter = f" + {Path(spec.adapter).name}" if spec.adapter else ""
        return f"{spec.model}{adapter} ({where})"

    def record(self, role: str) -> dict[str, str | None]:
        """What produced a role's turns, for episode records: ``model`` (the base model,
        or the served name of an OpenAI-compatible model), ``adapter`` (its folder name)
        and ``adapter_version``. Secret-free."""
        if self.origin is not None:
            return self.origin.record(role)
        spec = self.spec(role)
        return {
            "model": spec.model,
            "adapter": Path(spec.adapter).name if spec.adapter else None,
            "adapter_version": spec.version,
        }

    def _local_model(self, role: str, spec: PolicySpec) -> BaseChatModel:
        # Imported here: the local backend needs torch, which the rest of policies must not.
        from mascot.policies.local.backend import LocalBackend
        from mascot.policies.local.chat_model import LocalChatModel

        if spec.model not in self._backends:
            adapters: dict[str, str] = {}
            versions: dict[str, str | None] = {}
            for other_role, other in self._local_roles(spec.model).items():
                if other.adapter and other.adapter not in self._adapter_names:
                    self._adapter_names[other.adapter] = other_role
                    adapters[other_role] = other.adapter
                    versions[other_role] = other.version
            self._backends[spec.model] = LocalBackend.load(
                spec.model, adapters=adapters, adapter_versions=versions, dtype=spec.dtype
            )
        return LocalChatModel(
            backend=self._backends[spec.model],
            adapter=self._adapter_names[spec.adapter] if spec.adapter else None,
            max_new_tokens=self.max_tokens(role),
            temperature=spec.temperature,
            seed=self.seed,
        )

    def _local_roles(self, model: str) -> dict[str, PolicySpec]:
        roles = {*self.specs, *self.roster.persona_ids, "director", "user", "judge"}
        local = {}
        for role in sorted(roles):
            spec = self.specs.get(role) or self.specs.get("default")
            if spec is not None and spec.kind == "local" and spec.model == model:
                local[role] = spec
        return local


def openai_chat_model(
    spec: PolicySpec,
    *,
    max_tokens: int | None = None,
    seed: int | None = None,
    http_client: httpx.Client | None = None,
    http_async_client: httpx.AsyncClient | None = None,
) -> ChatOpenAI:
    """A ``ChatOpenAI`` for an OpenAI-compatible endpoint (OpenAI, vLLM, local server).

    Args:
        spec: A spec of kind ``openai``.
        max_tokens: Reply budget when the spec sets none (default: the speakers').
        seed: The run's seed; each request sends it mixed with the call's place in the run
            (``call_seed``), so the calls of a rollout do not all draw the same numbers.
        http_client: Sync HTTP client to use (e.g. with ``httpx.MockTransport``).
        http_async_client: Async HTTP client to use.

    Returns:
        The chat model (a ``SeededChatOpenAI``: each call sends its own seed). The API key
        is read from ``spec.api_key_env`` now and held as a secret; without
        ``api_key_env`` no key is sent.

    Raises:
        PolicyError: if ``api_key_env`` names an unset variable.
    """
    key = _NO_KEY
    if spec.api_key_env:
        key = os.environ.get(spec.api_key_env, "")
        if not key:
            raise PolicyError(
                f"environment variable {spec.api_key_env} (the API key for {spec.model}) is not set"
            )
    urls = spec.urls
    if len(urls) > 1 and http_client is None and http_async_client is None:
        from mascot.policies.replicas import AsyncReplicaTransport, ReplicaTransport

        http_client = httpx.Client(transport=ReplicaTransport(urls), timeout=spec.timeout)
        http_async_client = httpx.AsyncClient(transport=AsyncReplicaTransport(urls), timeout=spec.timeout)
    return SeededChatOpenAI(
        model=spec.model,
        base_url=urls[0] if urls else None,
        api_key=SecretStr(key),
        temperature=spec.temperature,
        max_tokens=spec.max_tokens or max_tokens or role_max_tokens("default"),
        timeout=spec.timeout,
        max_retries=spec.max_retries,
        seed=seed,
        # vLLM and the local server render the chat template with these variables (thinking
        # off, as in training); OpenAI's own API has no such field
        extra_body={"chat_template_kwargs": chat_template_kwargs()} if spec.base_url else None,
        http_client=http_client,
        http_async_client=http_async_client,
    )


class SeededChatOpenAI(ChatOpenAI):
    """``ChatOpenAI`` that sends each call its own seed: ``seed`` mixed with the call's run
    metadata (episode, sample, LangGraph node and step) and the served model name, as the
    local backend seeds its calls (``call_seed``). A ``seed`` given to the call wins."""

    def _seeded(self, run_manager: CallbackManagerForLLMRun | AsyncCallbackManagerForLLMRun | None,
                kwargs: dict[str, Any]) -> dict[str, Any]:
        if self.seed is not None and "seed" not in kwargs:
            kwargs["seed"] = call_seed(self.seed, run_manager.metadata if run_manager else None, self.model_name)
        return kwargs

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return super()._generate(messages, stop, run_manager, **self._seeded(run_manager, kwargs))

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        return await super()._agenerate(messages, stop, run_manager, **self._seeded(run_manager, kwargs))

    def _stream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> Iterator[ChatGenerationChunk]:
        return super()._stream(messages, stop, run_manager, **self._seeded(run_manager, kwargs))

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        async for chunk in super()._astream(messages, stop, run_manager, **self._seeded(run_manager, kwargs)):
            yield chunk
