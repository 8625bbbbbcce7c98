"""Judgements: reading a judge's answer into scores, the record on disk, and its cache; and
the judged candidate reply that ``mascot pairs`` and the metric judge read.

The overall score of a judgement is the plain mean of its criterion scores (1..5) mapped to
0-100: ``overall = (mean - 1) / 4 * 100``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from collections.abc import Mapping, Sequence
from contextlib import ExitStack
from pathlib import Path
from typing import Any, Literal

from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field, model_validator

from mascot.graphs import DirectionError, read_direction_json
from mascot.training.jsonl import JsonlAppender, check_writable, exclusive, read_records
from mascot.training.judging.rubric import LEVELS, Rubric

logger = logging.getLogger(__name__)


class JudgeOutputError(ValueError):
    """A judge model's answer that cannot be used; the message says why."""


class Message(BaseModel):
    """One OpenAI chat message of a prompt (other keys, such as ``name``, are kept)."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant"]
    content: str


class JudgedCandidate(BaseModel):
    """One candidate reply to a context, with its judged score.

    Attributes:
        context_id: The context the reply answers; candidates of one context share it,
            and they must share ``prompt`` and ``persona`` too.
        prompt: The prompt as the speaker saw it (OpenAI chat messages: the persona's
            system prompt and the conversation so far).
        persona: The persona id of the speaker.
        reply: The candidate reply text.
        overall: The judged overall score on 0-100, or ``None`` when the judgement failed.
        judgement: Provenance of the score (judge model, rubric id and version, criterion
            scores, cache key, ...); copied into the pairs as is.
    """

    model_config = ConfigDict(extra="forbid")

    context_id: str = Field(min_length=1)
    prompt: list[Message] = Field(min_length=1)
    persona: str = Field(min_length=1)
    reply: str
    overall: float | None = Field(default=None, ge=0.0, le=100.0)
    judgement: dict[str, Any] = Field(default_factory=dict)


class Judgement(BaseModel):
    """A rubric judge's verdict on one target (one JSONL line).

    ``ok``: ``scores`` holds every criterion (1..5) and ``overall`` is
    ``(mean - 1) / 4 * 100``; a relative judgement (``mode`` ranking or pairwise) has only
    ``overall``. ``failed``: no scores, ``error`` says why.
    ``turn``/``sample``/``persona`` are set for replies, ``block_start``/``block_end``
    (message indices, end exclusive) for blocks.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    episode_id: str
    turn: int | None = None
    sample: int | None = None
    persona: str | None = None
    block_start: int | None = None
    block_end: int | None = None
    rubric: str
    rubric_version: int
    judge_model: str
    scores: dict[str, int] = Field(default_factory=dict)
    rationale: str = ""
    overall: float | None = Field(default=None, ge=0, le=100)
    content_hash: str
    status: Literal["ok", "failed"]
    error: str | None = None
    attempts: int = Field(ge=0)
    # absolute: the rubric's scores; ranking/pairwise: an overall score relative to the other
    # candidates of the context, no criterion scores (judging.relative)
    mode: Literal["absolute", "ranking", "pairwise"] = "absolute"

    @model_validator(mode="after")
    def _consistent(self) -> Judgement:
        if self.status == "ok" and (self.overall is None or self.error
                                    or (self.mode == "absolute" and not self.scores)):
            raise ValueError("an ok judgement has an overall score (and, absolute, the criterion scores) and no error")
        if self.status == "failed" and (self.scores or self.overall is not None or not self.error):
            raise ValueError("a failed judgement has an error and no scores")
        if any(isinstance(v, bool) or v not in LEVELS for v in self.scores.values()):
            raise ValueError(f"scores must be integers 1..5, got {self.scores}")
        return self

    @property
    def key(self) -> tuple[str, str, int, str]:
        """The cache key: (content hash, rubric id, rubric version, judge model)."""
        return self.content_hash, self.rubric, self.rubric_version, self.judge_model

    def record(self) -> dict[str, Any]:
        """The JSON object written to disk (``None`` fields and the absolute mode left out)."""
        return self.model_dump(mode="json", exclude_none=True, exclude={"mode"} if self.mode == "absolute" else None)


def read_judgements(path: str | Path) -> list[Judgement]:
    """Read a judgement file; records that do not validate are skipped with a warning."""
    return [record for _, record in read_records(path, Judgement, "a judgement", skip_invalid=True)]


class JudgementCache:
    """Final judgements in a JSONL file, keyed by ``Judgement.key``; one writer at a time.

    Opening takes the file's lock (``PATH.lock``) and reads it; ``put`` appends one
    crash-safe line. Only ``ok`` judgements are stored, so failures are retried next run.
    Use it as a context manager or call ``close``; several judges may share one.
    """

    def __init__(self, path: str | Path) -> None:
        """Open (or create) the cache file.

        Raises:
            JsonlError: if it cannot be written or another run holds its lock.
        """
        self.path = check_writable(path)
        with ExitStack() as stack:  # released again if anything below fails
            stack.enter_context(exclusive(self.path))
            self._log = stack.enter_context(JsonlAppender(self.path))  # repairs a torn tail first
            self._entries = {j.key: j for j in read_judgements(self.path) if j.status == "ok"}
            self._stack = stack.pop_all()

    def get(self, key: tuple[str, str, int, str]) -> Judgement | None:
        """The cached judgement for a key, or ``None``."""
        return self._entries.get(key)

    def put(self, judgement: Judgement) -> None:
        """Store an ok judgement.

        Raises:
            ValueError: if it is ``failed`` (failures are not final).
        """
        if judgement.status != "ok":
            raise ValueError("failed judgements are not cached; they are retried on the next run")
        self._entries[judgement.key] = judgement
        self._log.write(judgement.record())

    def __len__(self) -> int:
        return len(self._entries)

    def close(self) -> None:
        """Close the file and release its lock."""
        self._stack.close()

    def __enter__(self) -> JudgementCache:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def parse_scores(output: str | Mapping[str, Any], rubric: Rubric) -> tuple[dict[str, int], str]:
    """Read a judge's answer strictly: every criterion of the rubric, integers 1..5.

    Accepts ``{"rationale": ..., "scores": {criterion: score}}`` or the scores at the top
    level, as bare JSON, in a code fence or inside prose; criteria by id or by name;
    scores as ``4``, ``4.0``, ``"4"`` or ``{"score": 4}``.

    Args:
        output: The model's text, or the object its structured output parsed.
        rubric: The rubric whose criteria must all be scored.

    Returns:
        Criterion id -> score, and the rationale (empty when none was given).

    Raises:
        JudgeOutputError: on no JSON object, a missing or unknown criterion, or a score
            that is not an integer 1..5.
    """
    data = judge_json(output)
    if "scores" in data:
        raw = data["scores"]
    else:
        raw = {k: v for k, v in data.items() if k != "rationale"}
    if not isinstance(raw, Mapping) or not raw:
        raise JudgeOutputError("'scores' is not an object of criterion scores")
    ids = {_key(c.id): c.id for c in rubric.criteria} | {_key(c.name): c.id for c in rubric.criteria}
    scores: dict[str, int] = {}
    unknown = []
    for name, value in raw.items():
        criterion = ids.get(_key(str(name)))
        if criterion is None:
            key = str(name)  # quoted when it holds newlines or control characters
            unknown.append((key if key.isprintable() else json.dumps(key))[:60])
        else:
            scores[criterion] = _score(value, criterion)
    missing = [c for c in rubric.criterion_ids if c not in scores]
    if unknown or missing:
        raise JudgeOutputError(
            f"unknown criteria: {', '.join(unknown) or '-'}; missing criteria: {', '.join(missing) or '-'} "
            f"(the criteria are {', '.join(rubric.criterion_ids)})"
        )
    rationale = data.get("rationale")
    return scores, rationale.strip() if isinstance(rationale, str) else ""


def judge_json(output: str | Mapping[str, Any]) -> Mapping[str, Any]:
    if isinstance(output, Mapping):
        return output
    try:
        return read_direction_json(output)[0]  # bare, fenced or in prose; <think> dropped
    except DirectionError as exc:
        raise JudgeOutputError(str(exc)) from None


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def _score(value: Any, criterion: str) -> int:
    if isinstance(value, Mapping) and "score" in value:
        value = value["score"]
    number: float | None = None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        number = value
    elif isinstance(value, str):
        try:
            number = float(value.strip())
        except ValueError:
            number = None
    if number is None or not float(number).is_integer() or int(number) not in LEVELS:
        raise JudgeOutputError(f"score of '{criterion}' must be an integer 1-5, got {json.dumps(value)}")
    return int(number)


def content_hash(messages: Sequence[BaseMessage]) -> str:
    """A stable hash of a prompt (message types and texts)."""
    payload = json.dumps([[m.type, m.text] for m in messages], ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()[:32]
