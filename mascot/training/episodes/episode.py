"""Episode records: one conversation on disk (JSONL), from a rollout or an app's logs."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import AIMessage, BaseMessage
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mascot.rosters import Scenario, UserProfile
from mascot.rosters.yaml_file import first_error_line
from mascot.training.jsonl import JsonlError, read_jsonl

logger = logging.getLogger(__name__)

#: Version of the on-disk format written by this release. Readers accept it and older.
SCHEMA_VERSION = 1


class EpisodeError(JsonlError):
    """An episode file cannot be read; the message is one line naming file and line."""


class TurnPolicy(BaseModel):
    """Which policy produced a turn: base (or served) model, adapter and its version."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: str | None = None
    adapter: str | None = None
    adapter_version: str | None = None


class Usage(BaseModel):
    """Token counts, where the model reported them."""

    model_config = ConfigDict(extra="forbid")

    input_tokens: int = 0
    output_tokens: int = 0


class EpisodeMessage(BaseModel):
    """One message in OpenAI chat format, plus how a persona turn came about.

    ``role``, ``content`` and ``name`` (the persona id) are the OpenAI fields; a persona
    turn also carries the stage direction it followed, its policy, token counts and the
    model call's latency.
    """

    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str
    name: str | None = None
    stage_direction: dict[str, Any] | None = None
    policy: TurnPolicy | None = None
    usage: Usage | None = None
    latency_s: float | None = None


class EpisodeSource(BaseModel):
    """Where an episode came from: a rollout (seed, repeat) or a checkpointer thread."""

    model_config = ConfigDict(extra="forbid")

    kind: Literal["rollout", "checkpoint"]
    seed: int | None = None
    repeat: int | None = None
    thread_id: str | None = None
    checkpoint_id: str | None = None


class Episode(BaseModel):
    """A whole conversation as stored on disk (one JSONL line).

    Attributes:
        schema_version: Format version; files of a newer version are refused.
        id: Stable id (from seed, scenario, profile and repeat; or from the thread).
        roster: Roster id.
        scenario: The opening scenario, when known.
        user_profile: The (simulated) person, when known.
        messages: The conversation in OpenAI chat format with persona names.
        directions: Every Director decision, hand-backs to the person included.
        fallbacks: Every repaired or replaced model output.
        guards: Every safety rule that fired (``mascot.graphs.safety``), with the round it governed.
        approvals: The app's answers to approval interrupts (``create_director_graph(approve=True)``):
            ``round``, ``decision`` (approved, edited, rejected), ``proposed``, ``played``.
        policies: Role -> policy for the roles that took part.
        source: Rollout or imported checkpoint thread.
        created_at: When the record was written (UTC, ISO 8601).
        duration_s: Wall time of the rollout, when known.
        usage: Token totals over the persona turns.
    """

    model_config = ConfigDict(extra="forbid")

    schema_version: int = SCHEMA_VERSION
    id: str = Field(min_length=1)
    roster: str
    scenario: Scenario | None = None
    user_profile: UserProfile | None = None
    messages: list[EpisodeMessage]
    directions: list[dict[str, Any]] = Field(default_factory=list)
    fallbacks: list[dict[str, Any]] = Field(default_factory=list)
    guards: list[dict[str, Any]] = Field(default_factory=list)
    approvals: list[dict[str, Any]] = Field(default_factory=list)
    policies: dict[str, TurnPolicy] = Field(default_factory=dict)
    source: EpisodeSource
    created_at: str = Field(default_factory=lambda: datetime.now(UTC).isoformat(timespec="seconds"))
    duration_s: float | None = None
    usage: Usage = Field(default_factory=Usage)

    def chat(self) -> list[dict[str, str]]:
        """The messages as plain OpenAI chat messages (``role``, ``content``, ``name``)."""
        return [m.model_dump(include={"role", "content", "name"}, exclude_none=True) for m in self.messages]

    def record(self) -> dict[str, Any]:
        """The JSON object written to disk (``None`` fields left out)."""
        return self.model_dump(mode="json", exclude_none=True)


def episode_from_state(
    state: Mapping[str, Any],
    *,
    id: str,
    roster: str,
    source: EpisodeSource,
    policies: Mapping[str, TurnPolicy] | None = None,
    duration_s: float | None = None,
) -> Episode:
    """Turn the final state of a conversation graph into an Episode.

    Works on the director graph's state and on any state with a ``messages`` list:
    persona turns are AI messages with ``name``; tool calls and tool results are left
    out. ``directions``, ``fallbacks``, ``guards``, ``approvals``, ``scenario`` and ``user_profile`` are kept where
    the state has them and they validate.

    Args:
        state: The graph state (``messages`` holds LangChain messages).
        id: The episode id.
        roster: The roster id.
        source: Where the conversation came from.
        policies: Role -> policy; fills in what a reply's metadata does not say.
        duration_s: Wall time of the run.

    Returns:
        The episode.

    Raises:
        ValueError: if the state has no ``messages`` list.
    """
    raw_messages = state.get("messages")
    if not isinstance(raw_messages, list):
        raise ValueError("the state has no 'messages' list")
    policies = dict(policies or {})
    messages = [m for m in (_message(m, policies) for m in raw_messages) if m is not None]
    usage = Usage(
        input_tokens=sum(m.usage.input_tokens for m in messages if m.usage),
        output_tokens=sum(m.usage.output_tokens for m in messages if m.usage),
    )
    return Episode(
        id=id,
        roster=roster,
        scenario=_valid(Scenario, state.get("scenario")),
        user_profile=_valid(UserProfile, state.get("user_profile")),
        messages=messages,
        directions=list(state.get("directions") or []),
        fallbacks=list(state.get("fallbacks") or []),
        guards=list(state.get("guards") or []),
        approvals=list(state.get("approvals") or []),
        policies=policies,
        source=source,
        duration_s=duration_s,
        usage=usage,
    )


def _message(message: BaseMessage, policies: Mapping[str, TurnPolicy]) -> EpisodeMessage | None:
    if message.type == "human":
        return EpisodeMessage(role="user", content=message.text)
    if message.type == "system":
        return EpisodeMessage(role="system", content=message.text)
    if not isinstance(message, AIMessage) or message.tool_calls or not message.text:
        return None  # tool traffic is not conversation
    meta = message.response_metadata or {}
    role = policies.get(message.name or "") or TurnPolicy()
    # the role's record names the adapter by its folder; a backend's own name for a shared
    # adapter is the first role it was loaded for, which would credit one persona's name
    policy = TurnPolicy(
        model=meta.get("model_name") or role.model,
        adapter=role.adapter or meta.get("adapter"),
        adapter_version=role.adapter_version or meta.get("adapter_version"),
    )
    usage = message.usage_metadata
    direction = message.additional_kwargs.get("stage_direction")
    return EpisodeMessage(
        role="assistant",
        content=message.text,
        name=message.name,
        stage_direction=direction if isinstance(direction, dict) else None,
        policy=policy if policy != TurnPolicy() else None,
        usage=Usage(input_tokens=usage["input_tokens"], output_tokens=usage["output_tokens"]) if usage else None,
        latency_s=meta.get("latency_s"),
    )


def _valid(model: type[BaseModel], data: Any) -> Any:
    if not data:
        return None
    try:
        return model.model_validate(data)
    except ValidationError:
        logger.warning("state field of type %s does not validate; left out", model.__name__)
        return None


def parse_episode(record: Mapping[str, Any], where: str) -> Episode:
    """Validate one JSON record as an Episode.

    Raises:
        EpisodeError: if it was written by a newer format version (upgrade mascot).
        ValueError: if it is not a valid episode (the message names ``where``).
    """
    version = record.get("schema_version")
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise EpisodeError(
            f"{where}: written by a newer mascot (episode schema_version {version}; "
            f"this one reads up to {SCHEMA_VERSION}); upgrade mascot"
        )
    try:
        return Episode.model_validate(record)
    except ValidationError as exc:
        raise ValueError(f"{where}: not an episode ({first_error_line(exc)})") from None


def read_episodes(path: str | Path) -> list[Episode]:
    """Read an episode file; unreadable lines are skipped with a warning naming them.

    Args:
        path: A JSONL file of episodes.

    Returns:
        The episodes, in file order (a missing file gives none).

    Raises:
        EpisodeError: if a record was written by a newer format version.
    """
    episodes = []
    for number, record in read_jsonl(path):
        try:
            episodes.append(parse_episode(record, f"{path}:{number}"))
        except EpisodeError:
            raise
        except ValueError as exc:
            logger.warning("%s; skipped", exc)
    return episodes
