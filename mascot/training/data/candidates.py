"""Candidate replies: K samples per (context, persona) at the Director's stage direction.

For every persona turn of an episode, the speaker policy of that persona is asked again,
with the same conversation and the same stage direction, ``k`` times. Judged, the
candidates of one context become preference pairs (better vs worse reply to the same
prompt). Like rollouts, sampling is concurrent and resumable: each candidate has a stable
key (context id, sample index) and keys already in the output file are skipped.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field

from mascot.graphs import StageDirection, clean_reply
from mascot.graphs.prompts import speaker_messages
from mascot.graphs.reply import speaker_labels, user_labels
from mascot.messages import chat_messages, langchain_message
from mascot.rosters import Roster
from mascot.training.episodes.episode import Episode, TurnPolicy
from mascot.training.jsonl import JsonlAppender, check_writable, exclusive, read_jsonl, read_records

logger = logging.getLogger(__name__)



class Candidate(BaseModel):
    """One sampled reply of a persona to a conversation prefix (one JSONL line).

    Attributes:
        context_id: Stable id of (episode, turn): the candidates of one context compete.
        episode_id: The episode the context comes from.
        turn: Index of the original persona turn in ``episode.messages``.
        persona: Persona id.
        stage_direction: The Director's direction the reply follows.
        context: The conversation before the turn (OpenAI messages with names).
        prompt: What the speaker model saw (OpenAI messages), the ``prompt`` of a pair.
        reply: The cleaned reply.
        sample: Index of the sample in its context (0..k-1).
        policy: The policy that wrote it.
    """

    model_config = ConfigDict(extra="forbid")

    context_id: str
    episode_id: str
    turn: int
    persona: str
    stage_direction: dict[str, Any]
    context: list[dict[str, Any]]
    prompt: list[dict[str, str]]
    reply: str
    sample: int = Field(ge=0)
    policy: TurnPolicy | None = None

    @property
    def key(self) -> tuple[str, int]:
        """What makes a candidate unique in a file."""
        return self.context_id, self.sample


@dataclass(frozen=True)
class CandidateContext:
    """A persona turn of an episode, ready to be sampled again."""

    context_id: str
    episode_id: str
    turn: int
    persona: str
    direction: StageDirection
    context: list[dict[str, Any]]
    prompt: list[BaseMessage]


@dataclass
class CandidateReport:
    """What a sampling run did."""

    contexts: int
    wanted: int
    skipped: int
    out: Path
    written: int = 0
    empty: int = 0
    started: float = field(default_factory=time.perf_counter, repr=False)
    elapsed_s: float = 0.0


def candidate_contexts(episodes: Sequence[Episode], roster: Roster) -> list[CandidateContext]:
    """Every persona turn of ``episodes`` that has a stage direction, as a context.

    Raises:
        ValueError: if an episode belongs to another roster.
    """
    contexts = []
    for episode in episodes:
        if episode.roster != roster.id:
            raise ValueError(f"episode {episode.id} is of roster '{episode.roster}', not '{roster.id}'")
        history: list[BaseMessage] = []
        for turn, message in enumerate(episode.messages):
            if message.role == "assistant" and message.name in roster.persona_ids and message.stage_direction:
                persona = roster.persona(message.name)
                direction = StageDirection.model_validate(message.stage_direction)
                contexts.append(
                    CandidateContext(
                        context_id=hashlib.sha256(f"{episode.id}|{turn}".encode()).hexdigest()[:16],
                        episode_id=episode.id,
                        turn=turn,
                        persona=persona.id,
                        direction=direction,
                        context=[m.model_dump(include={"role", "content", "name"}, exclude_none=True)
                                 for m in episode.messages[:turn]],
                        prompt=speaker_messages(roster, persona, direction, list(history)),
                    )
                )
            history.append(langchain_message(message.role, message.content, message.name))
    return contexts


async def sample_candidates(
    contexts: Sequence[CandidateContext],
    roster: Roster,
    speakers: Mapping[str, BaseChatModel],
    *,
    k: int,
    out: str | Path,
    concurrency: int = 8,
    policies: Mapping[str, TurnPolicy] | None = None,
    on_progress: Callable[[CandidateReport], None] | None = None,
) -> CandidateReport:
    """Sample ``k`` replies per context from its persona's speaker model into ``out``.

    Args:
        contexts: From ``candidate_contexts``.
        roster: The roster of the episodes.
        speakers: Persona id -> chat model (sample with temperature > 0).
        k: Replies per context.
        out: Candidate file (JSONL), appended to; candidates already in it are skipped.
        concurrency: Model calls at once.
        policies: Persona id -> policy, recorded with each candidate.
        on_progress: Called with the report after each candidate.

    Returns:
        The report. Empty replies are counted and not written.

    Raises:
        ValueError: on ``k`` or ``concurrency`` < 1 or a persona without a speaker.
        JsonlError: if ``out`` cannot be written or another run writes to it.
    """
    if k < 1 or concurrency < 1:
        raise ValueError(f"k and concurrency must be >= 1, got {k} and {concurrency}")
    missing = sorted({c.persona for c in contexts} - set(speakers))
    if missing:
        raise ValueError(f"no speaker model for persona {', '.join(missing)}")
    out = check_writable(out)
    with exclusive(out):
        done = {(r.get("context_id"), r.get("sample")) for _, r in read_jsonl(out)}
        jobs = [(c, s) for c in contexts for s in range(k) if (c.context_id, s) not in done]
        report = CandidateReport(contexts=len(contexts), wanted=len(contexts) * k,
                                 skipped=len(contexts) * k - len(jobs), out=out)
        limit = asyncio.Semaphore(concurrency)
        policies = dict(policies or {})

        async def one(context: CandidateContext, sample: int) -> None:
            # the metadata varies a seeded local model's sampling per candidate
            config = {"metadata": {"episode_id": context.context_id, "sample": sample}}
            async with limit:
                reply = await speakers[context.persona].ainvoke(context.prompt, config)
            text = clean_sample(reply.text, roster, context.persona)
            if not text:
                report.empty += 1
            else:
                appender.write(Candidate(
                    context_id=context.context_id, episode_id=context.episode_id, turn=context.turn,
                    persona=context.persona, stage_direction=context.direction.model_dump(exclude_none=True),
                    context=context.context, prompt=chat_messages(context.prompt), reply=text,
                    sample=sample, policy=policies.get(context.persona),
                ).model_dump(mode="json", exclude_none=True))
                report.written += 1
            report.elapsed_s = time.perf_counter() - report.started
            if on_progress is not None:
                on_progress(report)

        with JsonlAppender(out) as appender:
            await asyncio.gather(*(one(c, s) for c, s in jobs))
    report.elapsed_s = time.perf_counter() - report.started
    return report


def read_candidates(path: str | Path) -> list[Candidate]:
    """The candidates of a file (unreadable lines are skipped with a warning)."""
    return [record for _, record in read_records(path, Candidate, "a candidate", skip_invalid=True)]


def clean_sample(text: str, roster: Roster, persona_id: str) -> str:
    """A sampled reply of ``persona_id`` cleaned as the speaker node cleans it (its own label
    cut, lines for the person or another voice dropped)."""
    persona = roster.persona(persona_id)
    others = user_labels() + speaker_labels(
        *(label for p in roster.personas if p.id != persona_id for label in (p.id, p.name))
    )
    return clean_reply(text, own=speaker_labels(persona.id, persona.name), others=others)


