"""The typed stage direction and its strict, repairing interpretation of model output."""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field
from pydantic.json_schema import SkipJsonSchema

from mascot.graphs.reply import strip_reasoning
from mascot.rosters import USER, Roster

logger = logging.getLogger(__name__)

FALLBACK_ACTION = "Respond to the latest message from your own perspective, adding something not yet said."
FALLBACK_TONE = "natural"
_DEFAULT_TONE = "natural"
_USER_WORDS = {USER, "human", "person", "the_user", "the_person", "client"}
_FENCE = re.compile(r"```(?:json)?\s*(.*?)```", re.DOTALL)


class StageDirection(BaseModel):
    """Who speaks next and how.

    Attributes:
        speaker: A persona id of the roster, or ``"user"`` to hand the turn back.
        action: What the speaker should do in this turn (free text).
        tone: How the speaker should sound (free text).
        addressee: Whom the speaker addresses, if anyone in particular.
        rationale: Why the Director chose this.
        sees: What the voice sees of the conversation for this turn: ``person`` (the
            person's messages only), ``round`` (the person's messages and the voices heard
            since the person's latest message) or ``conversation`` (everything); ``None``:
            the roster's ``voices_see``. Read when a model adds it; not in the schema.
        fallback: Set by mascot, never by the model: why the model's direction was
            repaired or replaced; ``None`` when it was used as given.
        offered: Set by mascot, never by the model: the speakers the Director was
            offered, in the order its prompt and schema listed them (``None`` for a
            direction that offered no choice, or one recorded before offers were kept).
        guard: Set by mascot, never by the model: in a round a safety rule governs, the
            rule's name (``rule``) and, on the direction of the voice that gives them, the
            resource text (``resources``); ``None`` in other rounds.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    speaker: str = Field(min_length=1)
    action: str = Field(min_length=1)
    tone: str = Field(min_length=1)
    addressee: str | None = None
    rationale: str | None = None
    sees: SkipJsonSchema[Literal["person", "round", "conversation"] | None] = None
    fallback: SkipJsonSchema[str | None] = None
    offered: SkipJsonSchema[list[str] | None] = None
    guard: SkipJsonSchema[dict[str, Any] | None] = None


#: What a voice may see of the conversation (``StageDirection.sees``, ``Roster.voices_see``).
VIEWS = ("person", "round", "conversation")
#: JSON schema of a stage direction (``fallback``, ``offered`` and ``guard`` are not part of it).
DIRECTION_SCHEMA: dict[str, Any] = StageDirection.model_json_schema()
#: Longest action and tone a model may write under structured output (characters):
#: enough for one instruction, short enough that a weak model cannot ramble to its limit.
ACTION_MAX_CHARS = 240
TONE_MAX_CHARS = 60


def direction_schema(speakers: Sequence[str]) -> dict[str, Any]:
    """The JSON schema a Director's model fills under structured output.

    The speaker is restricted to ``speakers`` (an ``enum``), so constrained decoding
    (xgrammar locally, vLLM's structured outputs, OpenAI's JSON schema) can only name a
    voice that may speak now; ``addressee`` and ``rationale`` are left out to keep the
    reply short (a prompted reply may still carry them).

    Args:
        speakers: The valid speakers: persona ids, and ``USER`` when handing back is allowed.

    Returns:
        A JSON schema object with ``speaker``, ``action`` and ``tone``, all required.
    """
    return {
        "title": "StageDirection",
        "type": "object",
        "properties": {
            "speaker": {"type": "string", "enum": list(speakers)},
            "action": {"type": "string", "minLength": 1, "maxLength": ACTION_MAX_CHARS},
            "tone": {"type": "string", "minLength": 1, "maxLength": TONE_MAX_CHARS},
        },
        "required": ["speaker", "action", "tone"],
        "additionalProperties": False,
    }


class DirectionError(ValueError):
    """Model output that cannot be read as a stage direction at all."""


def read_direction_json(output: str) -> tuple[dict[str, Any], str | None]:
    """Read the JSON object of a director reply.

    Accepts bare JSON, JSON in a code fence, or one JSON object inside prose; reasoning
    blocks (``<think>...</think>``) are ignored.

    Args:
        output: The model's text.

    Returns:
        The object, and a note when it had to be extracted from surrounding text.

    Raises:
        DirectionError: if the text holds no JSON object.
    """
    text = strip_reasoning(output)
    if not text:
        raise DirectionError("empty reply")
    try:
        value = json.loads(text, strict=False)  # a raw control character in a string: vLLM's grammar lets one through
    except json.JSONDecodeError:
        pass
    else:
        if isinstance(value, dict):
            return value, None
        raise DirectionError(f"JSON is a {type(value).__name__}, not an object")
    for candidate in [m.group(1) for m in _FENCE.finditer(text)] + _balanced_objects(text):
        try:
            value = json.loads(candidate, strict=False)
        except json.JSONDecodeError:
            continue
        if isinstance(value, dict):
            return value, "extracted JSON from surrounding text"
    raise DirectionError("reply is not JSON")


def interpret_direction(
    output: str | Mapping[str, Any],
    roster: Roster,
    *,
    recent_speakers: Sequence[str],
    round_turns: int,
    min_speakers_per_round: int = 1,
    heard_this_round: Sequence[str] = (),
) -> StageDirection:
    """Turn a director model's output into a valid stage direction; never raises.

    Repairs what can be repaired (JSON inside prose, a persona named by its display
    name or role, a missing tone or action) and replaces what cannot (no JSON, an
    unknown speaker, a persona who already spoke since the person's last message,
    handing back before any persona spoke) with the fallback: the least recently
    heard persona with a neutral instruction. Either way the reason is recorded in
    ``StageDirection.fallback``.

    Args:
        output: The model's text, or an already parsed object (structured output).
        roster: The roster whose persona ids are valid speakers.
        recent_speakers: Persona ids in the order they spoke so far, oldest first.
        round_turns: Persona turns already taken in the current round.
        min_speakers_per_round: Persona turns required before the turn may return to
            the user.
        heard_this_round: Persona ids that spoke since the person's last message; each
            persona speaks at most once per round.

    Returns:
        A direction whose speaker is a persona id of the roster or ``USER``.
    """
    notes: list[str] = []
    if isinstance(output, Mapping):
        data: dict[str, Any] = dict(output)
    else:
        try:
            data, note = read_direction_json(output)
        except DirectionError as exc:
            return fallback_direction(roster, recent_speakers, reason=str(exc))
        if note:
            notes.append(note)
    data = {str(k).strip().lower(): v for k, v in data.items()}
    raw_speaker = data.get("speaker")
    if not isinstance(raw_speaker, str) or not raw_speaker.strip():
        return fallback_direction(roster, recent_speakers, reason="no speaker named")
    speaker = resolve_speaker(raw_speaker, roster)
    if speaker is None:
        return fallback_direction(
            roster, recent_speakers, reason=f"unknown speaker '{raw_speaker.strip()[:60]}'"
        )
    if speaker in heard_this_round:
        return fallback_direction(
            roster, recent_speakers, reason=f"'{speaker}' already spoke this round"
        )
    if speaker != raw_speaker:
        notes.append(f"speaker '{raw_speaker.strip()[:60]}' read as '{speaker}'")
    if speaker == USER and round_turns < min_speakers_per_round:
        return fallback_direction(
            roster, recent_speakers, reason="handed back before a persona spoke"
        )
    action = _text(data.get("action"))
    if action is None:
        action = FALLBACK_ACTION if speaker != USER else "Hand the turn back to the person."
        notes.append("missing action")
    tone = _text(data.get("tone"))
    if tone is None:
        tone = _DEFAULT_TONE
        notes.append("missing tone")
    sees = _text(data.get("sees"))
    if sees is not None and sees.lower() not in VIEWS:
        notes.append(f"sees '{sees[:40]}' is not one of {', '.join(VIEWS)}; left to the roster")
        sees = None
    return StageDirection(
        speaker=speaker,
        action=action,
        tone=tone,
        addressee=_text(data.get("addressee")),
        rationale=_text(data.get("rationale")),
        sees=sees.lower() if sees else None,
        fallback="repaired: " + "; ".join(notes) if notes else None,
    )


def fallback_direction(
    roster: Roster, recent_speakers: Sequence[str], *, reason: str
) -> StageDirection:
    """The documented fallback: the least recently heard persona, neutral instruction.

    Personas that never spoke come first, in roster order.

    Args:
        roster: The roster to choose from.
        recent_speakers: Persona ids in the order they spoke so far, oldest first.
        reason: Why the fallback was needed; recorded in the direction.

    Returns:
        The fallback direction.
    """
    last_turn = {pid: -1 for pid in roster.persona_ids}
    for index, pid in enumerate(recent_speakers):
        if pid in last_turn:
            last_turn[pid] = index
    speaker = min(roster.persona_ids, key=lambda pid: last_turn[pid])
    logger.warning("director fallback to '%s': %s", speaker, reason)
    return StageDirection(
        speaker=speaker, action=FALLBACK_ACTION, tone=FALLBACK_TONE, fallback=reason
    )


def resolve_speaker(name: str, roster: Roster) -> str | None:
    """Map a speaker as a model wrote it to a persona id, ``USER``, or ``None``.

    Matches ids exactly, then case-insensitively ids, display names (with or without
    a leading "The") and role labels.
    """
    if name in roster.persona_ids or name == USER:
        return name
    key = _key(name)
    if key in _USER_WORDS:
        return USER
    for persona in roster.personas:
        names = {persona.id, _key(persona.name), _key(persona.role)}
        names.add(_key(re.sub(r"^the\s+", "", persona.name, flags=re.IGNORECASE)))
        if key in names:
            return persona.id
    return None


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def _text(value: object) -> str | None:
    if isinstance(value, str) and value.strip():
        return value.strip()
    return None


def _balanced_objects(text: str) -> list[str]:
    """Return each top-level ``{...}`` span of the text, in order."""
    spans, depth, start, in_string, escaped = [], 0, -1, False, False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"' and depth:
            in_string = True
        elif char == "{":
            if depth == 0:
                start = index
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                spans.append(text[start : index + 1])
    return spans
