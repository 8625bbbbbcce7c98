"""Rejection-sampled warm-start data: several samples per train decision point and persona
turn, from the policy itself and from a teacher, kept only when they pass the checks.

An untrained small model writes refusals as the Director's actions ("I'm sorry, but I can't
help with that."), sentences as tones, and replies that copy the person, an earlier voice
or the roster's own style example. Fine-tuned on its best-judged outputs it learns those
too, since a judge of the same size hardly tells them apart. Here every sample is checked
by its text instead, and only the ones that pass become SFT rows (``mascot train-sft
--samples``):

- a **direction** (``direction_fault``) must be valid JSON naming a voice that may speak
  (not repaired, not replaced: ``invalid``, ``repaired``), an action of at least
  ``MIN_ACTION_WORDS`` words (``short_action``), and none of ``faults.DIRECTION_FAULTS``
  (a refusal, the first person, the voice named instead of instructed, words copied from
  its prompt, a tone that is a sentence). A hand-back needs no action.
- a **reply** (``reply_sample_fault``) must not be empty (``empty``) and have none of
  ``faults.REPLY_FAULTS`` (a refusal anywhere, help-desk talk, as the person, a copy of the
  person, of an earlier voice, of a persona's text or of its own direction).

Which of the passing samples are kept, and how they pair, is ``selection``'s work: ranked by
measured outcomes (with ``play``, a direction by the reply its voice then gave).
``samples.jsonl`` holds every sample with its
fault (``null`` for a kept one), so the counts can be read back and a run resumes where it
stopped (by source, context and sample index).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import HumanMessage

from mascot.graphs.decider import Decider
from mascot.graphs.direction import StageDirection, interpret_direction
from mascot.graphs.faults import DIRECTION_FAULTS as TEXT_DIRECTION_FAULTS
from mascot.graphs.faults import REPLY_FAULTS as TEXT_REPLY_FAULTS
from mascot.graphs.faults import direction_faults, persona_texts, reply_faults, voice_names
from mascot.graphs.prompts import speaker_messages
from mascot.graphs.reply import word_count
from mascot.graphs.state import round_speakers
from mascot.messages import chat_messages
from mascot.rosters import USER, Roster
from mascot.training.data.block_rollout import DecisionPoint
from mascot.training.data.candidates import CandidateContext, clean_sample
from mascot.training.jsonl import JsonlAppender, check_writable, exclusive, read_jsonl

#: Fewest words of an action that says what to do ("Ask what went wrong").
MIN_ACTION_WORDS = 3
#: The fields of a direction the Director learns to write.
WRITTEN_FIELDS = ("speaker", "action", "tone", "addressee")
#: What a direction sample can fail on, in the order checked.
DIRECTION_FAULTS = ("invalid", "repaired", "short_action", *TEXT_DIRECTION_FAULTS)
#: What a reply sample can fail on.
REPLY_FAULTS = ("empty", *TEXT_REPLY_FAULTS)


def direction_fault(text: str, point: DecisionPoint, roster: Roster, *, min_speakers_per_round: int = 1) -> str | None:
    """What is wrong with a sampled direction at ``point``, or ``None`` for one worth learning.

    Args:
        text: The model's reply.
        point: The decision point it was written at (its prompt is what the action must not copy).
        roster: The roster.
        min_speakers_per_round: Persona turns before a hand-back is valid.

    Returns:
        One of ``DIRECTION_FAULTS``, or ``None``.
    """
    direction = _interpret(text, point, roster, min_speakers_per_round=min_speakers_per_round)
    if direction.fallback and not direction.fallback.startswith("repaired"):
        return "invalid"
    if direction.fallback:
        return "repaired"
    if direction.speaker == USER:
        return None
    if word_count(direction.action) < MIN_ACTION_WORDS:
        return "short_action"
    found = direction_faults(direction.action, direction.tone, names=voice_names(roster),
                             shown=[m["content"] for m in point.prompt])
    return found[0] if found else None


def reply_sample_fault(text: str, context: CandidateContext, roster: Roster) -> str | None:
    """What is wrong with a sampled reply (already cleaned as the speaker node cleans it), or
    ``None``; one of ``REPLY_FAULTS``."""
    if not text.strip():
        return "empty"
    person = next((m["content"] for m in reversed(context.context) if m.get("role") == "user"), "")
    found = reply_faults(text, person=person, voices=_round_voices(context, roster), personas=persona_texts(roster),
                         instructions=[context.direction.action, context.direction.tone])
    return found[0] if found else None


@dataclass
class SampleReport:
    """What a sampling run did: per ``source/role`` (role ``director`` or ``speakers``) the
    samples drawn, kept and each fault's count; rows kept in all; samples already on file."""

    out: Path
    counts: dict[str, dict[str, int]] = field(default_factory=dict)
    skipped: int = 0
    started: float = field(default_factory=time.perf_counter, repr=False)
    elapsed_s: float = 0.0

    def count(self, source: str, role: str, fault: str | None) -> None:
        """Count one sample."""
        row = self.counts.setdefault(f"{source}/{role}", {"sampled": 0, "passed": 0})
        row["sampled"] += 1
        if fault is None:
            row["passed"] += 1
        else:
            row[fault] = row.get(fault, 0) + 1


async def sample_warm_start(
    points: Sequence[DecisionPoint],
    contexts: Sequence[CandidateContext],
    roster: Roster,
    sources: Mapping[str, Mapping[str, BaseChatModel]],
    *,
    k: int,
    out: str | Path,
    concurrency: int = 8,
    structured_output: bool = True,
    play: Mapping[str, BaseChatModel] | None = None,
    on_progress: Callable[[SampleReport], None] | None = None,
) -> SampleReport:
    """Sample ``k`` directions per decision point and ``k`` replies per persona turn from
    every source into ``out`` (``samples.jsonl``), each with its fault.

    Args:
        points: The train decision points (``block_rollout.decision_points``).
        contexts: The train persona turns (``candidates.candidate_contexts``).
        roster: Their roster.
        sources: Source name (``policy``, ``teacher``) -> role (``director`` or a persona id)
            -> chat model sampling with temperature.
        k: Samples per context and source.
        out: The samples file (JSONL), appended to; samples already in it are not drawn again.
        concurrency: Model calls at once.
        structured_output: Ask the Director's models for structured output, as the graph
            does (a model without it is prompted for JSON).
        play: Persona id -> the speaker that plays each passing direction as a one-turn
            block: its reply, the voices before it and the reply's faults are recorded
            (``block_reply``, ``block_voices``, ``block_faults``) for ``selection`` to rank by.
        on_progress: Called with the report after each sample.

    Returns:
        The report of this run's samples (``sample_counts`` reads the whole file).

    Raises:
        ValueError: on ``k`` or ``concurrency`` below 1, or no source.
        JsonlError: if ``out`` cannot be written or another run writes to it.
    """
    if k < 1 or concurrency < 1 or not sources:
        raise ValueError(f"k and concurrency must be >= 1 and a source given, got k={k}, concurrency={concurrency}, "
                         f"sources={list(sources)}")
    roles = {"director"} if points else set()
    roles |= {c.persona for c in contexts}
    for name, models in sources.items():
        if missing := sorted(roles - set(models)):
            raise ValueError(f"source '{name}' has no model for {', '.join(missing)}")
    out = check_writable(out)
    report = SampleReport(out=out)
    with exclusive(out):
        done = {(r.get("source"), r.get("context_id"), r.get("sample")) for _, r in read_jsonl(out)}
        jobs = [(name, item, s) for name in sources for item in [*points, *contexts] for s in range(k)
                if (name, item.context_id, s) not in done]
        report.skipped = (len(points) + len(contexts)) * k * len(sources) - len(jobs)
        limit = asyncio.Semaphore(concurrency)
        deciders = {name: Decider(roster, models["director"], structured_output=structured_output)
                    for name, models in sources.items() if points}

        async def one(source: str, item: DecisionPoint | CandidateContext, sample: int) -> None:
            director = isinstance(item, DecisionPoint)
            config = {"metadata": {"episode_id": f"{source}|{item.context_id}", "sample": sample}}
            async with limit:
                if director:  # as the graph asks: structured output over the voices offered there
                    text = (await deciders[source].awrite(item.messages, round_turns=item.round_turns,
                                                              config=config)).strip()
                else:
                    reply = await sources[source][item.persona].ainvoke(item.prompt, config)
            extra: dict[str, Any] = {}
            if director:
                fault = direction_fault(text, item, roster)
                completion = _direction_json(text, item, roster) if fault is None else text
                if fault is None and play:
                    async with limit:
                        extra = await _play(_interpret(text, item, roster), item, roster, play, config)
            else:
                completion = text = clean_sample(reply.text, roster, item.persona)
                fault = reply_sample_fault(text, item, roster)
                extra = {"voices": _round_voices(item, roster)}
            role = "director" if director else "speakers"
            appender.write({"source": source, "context_id": item.context_id, "sample": sample, "role": role,
                            "persona": "director" if director else item.persona,
                            "prompt": list(item.prompt) if director else chat_messages(item.prompt),
                            "completion": completion, "fault": fault, **extra})
            report.count(source, role, fault)
            report.elapsed_s = time.perf_counter() - report.started
            if on_progress is not None:
                on_progress(report)

        with JsonlAppender(out) as appender:
            await asyncio.gather(*(one(*job) for job in jobs))
    report.elapsed_s = time.perf_counter() - report.started
    return report


def _round_voices(context: CandidateContext, roster: Roster) -> list[str]:
    """The voices heard in a persona turn's round before it."""
    last_person = max((i for i, m in enumerate(context.context) if m.get("role") == "user"), default=-1)
    return [m["content"] for m in context.context[last_person + 1:] if m.get("name") in roster.persona_ids]


async def _play(direction: StageDirection, point: DecisionPoint, roster: Roster, play: Mapping[str, BaseChatModel],
                config: dict[str, Any]) -> dict[str, Any]:
    """A passing direction played as a one-turn block: its voice's reply (cleaned as the
    speaker node cleans it), the voices of the round before it, and the reply's faults."""
    if direction.speaker == USER or direction.speaker not in play:
        return {}
    persona = roster.persona(direction.speaker)
    messages = list(point.messages)
    last = max((i for i, m in enumerate(messages) if isinstance(m, HumanMessage)), default=-1)
    person = messages[last].text if last >= 0 else ""
    voices = [m.text for m in messages[last + 1:] if getattr(m, "name", None) in roster.persona_ids]
    reply = await play[direction.speaker].ainvoke(speaker_messages(roster, persona, direction, messages), config)
    text = clean_sample(reply.text, roster, direction.speaker)
    faults = reply_faults(text, person=person, voices=voices, personas=persona_texts(roster),
                          instructions=[direction.action, direction.tone]) if text else ("empty",)
    return {"block_speaker": direction.speaker, "block_reply": text, "block_voices": voices,
            "block_faults": list(faults)}


def _interpret(text: str, point: DecisionPoint, roster: Roster, *, min_speakers_per_round: int = 1) -> StageDirection:
    """The direction the graph would take from ``text`` at ``point`` (its fallback warnings
    left out: a rejected sample is counted, not logged)."""
    messages = list(point.messages)
    spoken = [getattr(m, "name", None) for m in messages if getattr(m, "name", None) in roster.persona_ids]
    quiet = logging.getLogger("mascot.graphs.direction")
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        return interpret_direction(text, roster, recent_speakers=spoken, round_turns=point.round_turns,
                                   min_speakers_per_round=min_speakers_per_round,
                                   heard_this_round=round_speakers(messages))
    finally:
        quiet.setLevel(level)


def _direction_json(text: str, point: DecisionPoint, roster: Roster) -> str:
    """A passing direction as the compact JSON the Director learns to write (its fields only)."""
    direction = _interpret(text, point, roster)
    fields = direction.model_dump(include=set(WRITTEN_FIELDS), exclude_none=True)
    return json.dumps(fields, ensure_ascii=False)


def sample_counts(path: str | Path) -> dict[str, dict[str, int]]:
    """Per ``source/role``: samples in the file, how many passed, and each fault's count."""
    report = SampleReport(out=Path(path))
    for _, row in read_jsonl(path):
        report.count(str(row.get("source")), str(row.get("role")), row.get("fault"))
    return report.counts
