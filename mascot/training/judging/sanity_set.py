"""Judge sanity sets: fixed contrasts a judge must get right before its labels are trained on.

A sanity set is hand-written YAML, one per shipped roster (``mascot.training.judging.sanity``), or a
file of the same format for another roster. Its ``replies`` are for rubrics that judge a
reply (``persona``): per item, a conversation, the Director's stage direction to a persona,
a ``better`` reply in that persona's voice that answers the person, and ``worse`` replies,
one per contrast of ``KINDS["reply"]``. Its ``blocks`` are for rubrics that judge a block
(``group``): a ``better`` block of distinct voices against the contrasts of
``KINDS["block"]``. Every side is built as the judge sees it in training (``reply_target``,
``BlockTarget``) and as ``mascot pairs`` reads it (a ``JudgedCandidate`` with the speaker's
prompt, or the block's prefix and ``id: text`` paragraphs). ``judge_sanity`` runs a judge on
a set and gates it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from mascot.graphs.direction import StageDirection
from mascot.graphs.prompts import speaker_messages
from mascot.messages import langchain_message, openai_messages
from mascot.rosters import Roster
from mascot.rosters.yaml_file import YamlFileError, read_model
from mascot.training.judging.judgement import JudgedCandidate
from mascot.training.judging.metric_judge import GROUP
from mascot.training.judging.targets import BlockTarget, Target, conversation_turns, render_block, reply_target

#: The contrasts of a sanity set, per kind of target the rubric judges.
KINDS: dict[str, tuple[str, ...]] = {
    "reply": ("echoed_cue", "one_word", "other_persona", "off_persona", "refusal", "as_person", "copies_voice",
              "off_topic"),
    "block": ("one_voice", "same_thing", "echoed_cue", "refusal", "off_topic"),
}
#: Contrasts that need a voice in the item's conversation (the one copied).
NEEDS_A_VOICE = frozenset({"copies_voice"})
#: The speaker key of the person's turns in a sanity file.
PERSON = "person"
_DATA = "sanity"

TargetKind = Literal["reply", "block"]


class SanityError(ValueError):
    """A sanity set or report cannot be used; the message is one line naming the file."""


class _Direction(BaseModel):
    model_config = ConfigDict(extra="forbid")
    action: str = Field(min_length=1)
    tone: str = Field(min_length=1)


class _ReplyItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    persona: str
    conversation: list[dict[str, str]] = Field(min_length=1)
    direction: _Direction
    better: str = Field(min_length=1)
    worse: dict[str, str] = Field(min_length=1)


class _BlockItem(BaseModel):
    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    conversation: list[dict[str, str]] = Field(min_length=1)
    better: list[dict[str, str]] = Field(min_length=1)
    worse: dict[str, list[dict[str, str]]] = Field(min_length=1)


class _SanityFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    roster: str
    replies: list[_ReplyItem] = Field(default_factory=list)
    blocks: list[_BlockItem] = Field(default_factory=list)


@dataclass(frozen=True)
class SanityPair:
    """One contrast: the same context, a better and a worse side.

    Attributes:
        id: ``item/kind``, e.g. ``anchor-driving-test/echoed_cue``.
        kind: The contrast (one of ``KINDS``).
        better, worse: The two sides as judge targets.
        better_candidate, worse_candidate: The two sides as judged candidates (unjudged),
            what ``mascot pairs`` and the metric judge read.
    """

    id: str
    kind: str
    better: Target
    worse: Target
    better_candidate: JudgedCandidate
    worse_candidate: JudgedCandidate


@dataclass(frozen=True)
class SanitySet:
    """The sanity pairs of one roster for one kind of target, and where they came from."""

    roster: str
    target: TargetKind
    source: str
    pairs: list[SanityPair]

    def targets(self) -> list[Target]:
        """The distinct targets of the pairs (a better side shared by pairs counts once)."""
        return list({t.model_dump_json(): t for p in self.pairs for t in (p.better, p.worse)}.values())


def list_sanity_sets() -> list[str]:
    """The ids of the rosters with a shipped sanity set, sorted."""
    root = resources.files(__package__).joinpath(_DATA)
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_sanity_set(roster: Roster, target: TargetKind, *, path: str | Path | None = None) -> SanitySet:
    """The sanity pairs of a roster for rubrics that judge ``target`` (``reply``/``block``).

    Args:
        roster: The roster; its shipped set is used unless ``path`` is given.
        target: ``reply`` (the ``persona`` rubric) or ``block`` (the ``group`` rubric).
        path: A sanity set file of the shipped format, for a roster without a shipped set.

    Returns:
        The set, pairs in file order (items, then contrasts).

    Raises:
        SanityError: with no shipped set for the roster and no ``path``, or a file that is
            unreadable, of another roster, names an unknown speaker or contrast, or has no
            item for ``target``.
    """
    if target not in KINDS:
        raise SanityError(f"no sanity pairs for a '{target}' target; valid: {', '.join(KINDS)}")
    if path is None:
        if roster.id not in list_sanity_sets():
            raise SanityError(f"no shipped sanity set for roster '{roster.id}' (shipped: "
                              f"{', '.join(list_sanity_sets())}); write one in their format and pass it as a file")
        path = Path(str(resources.files(__package__).joinpath(_DATA, f"{roster.id}.yaml")))
    path = Path(path).expanduser()
    data = _read(path)
    if data.roster != roster.id:
        raise SanityError(f"{path}: a sanity set of roster '{data.roster}', not '{roster.id}'")
    if target == "reply":
        pairs = [p for item in data.replies for p in _reply_pairs(item, roster, path)]
    else:
        pairs = [p for item in data.blocks for p in _block_pairs(item, roster, path)]
    if not pairs:
        raise SanityError(f"{path}: no {'replies' if target == 'reply' else 'blocks'} to judge")
    return SanitySet(roster=roster.id, target=target, source=str(path), pairs=pairs)


def _read(path: Path) -> _SanityFile:
    try:
        return read_model(path, _SanityFile)
    except YamlFileError as exc:
        raise SanityError(str(exc)) from None


def _messages(turns: Sequence[Mapping[str, str]], roster: Roster, where: str) -> list[dict[str, str]]:
    """One-key ``{speaker: text}`` turns as OpenAI chat messages with persona names."""
    messages = []
    for turn in turns:
        if len(turn) != 1:
            raise SanityError(f"{where}: a turn is one 'speaker: text' pair, got {sorted(turn)}")
        [(speaker, text)] = turn.items()
        if speaker == PERSON:
            messages.append({"role": "user", "content": text})
        elif speaker in roster.persona_ids:
            messages.append({"role": "assistant", "name": speaker, "content": text})
        else:
            raise SanityError(f"{where}: unknown speaker '{speaker}'; valid: {PERSON}, {', '.join(roster.persona_ids)}")
    return messages


def _check_kinds(kinds: Sequence[str], target: str, where: str) -> None:
    unknown = [k for k in kinds if k not in KINDS[target]]
    if unknown:
        raise SanityError(f"{where}: unknown contrast '{unknown[0]}'; valid: {', '.join(KINDS[target])}")


def _reply_pairs(item: _ReplyItem, roster: Roster, path: Path) -> list[SanityPair]:
    where = f"{path}: reply '{item.id}'"
    if item.persona not in roster.persona_ids:
        raise SanityError(f"{where}: unknown persona '{item.persona}'; valid: {', '.join(roster.persona_ids)}")
    _check_kinds(list(item.worse), "reply", where)
    context = _messages(item.conversation, roster, where)
    if NEEDS_A_VOICE & set(item.worse) and not any(m["role"] == "assistant" for m in context):
        raise SanityError(f"{where}: contrast 'copies_voice' needs a voice's turn in the conversation to copy")
    direction = StageDirection(speaker=item.persona, action=item.direction.action, tone=item.direction.tone)
    history = [langchain_message(m["role"], m["content"], m.get("name")) for m in context]
    prompt = openai_messages(speaker_messages(roster, roster.persona(item.persona), direction, history))
    episode = f"sanity:{item.id}"

    def side(reply: str, sample: int) -> tuple[Target, JudgedCandidate]:
        target = reply_target(roster, episode_id=episode, persona=item.persona, context=context, reply=reply,
                              direction=direction.model_dump(exclude_none=True), sample=sample)
        return target, JudgedCandidate(context_id=episode, prompt=prompt, persona=item.persona, reply=reply)

    better = side(item.better, 0)
    return [SanityPair(f"{item.id}/{kind}", kind, better[0], worse[0], better[1], worse[1])
            for n, (kind, text) in enumerate(item.worse.items(), start=1) for worse in [side(text, n)]]


def _block_pairs(item: _BlockItem, roster: Roster, path: Path) -> list[SanityPair]:
    where = f"{path}: block '{item.id}'"
    _check_kinds(list(item.worse), "block", where)
    context = _messages(item.conversation, roster, where)
    episode = f"sanity:{item.id}"

    def side(turns: list[dict[str, str]], sample: int) -> tuple[Target, JudgedCandidate]:
        block = _messages(turns, roster, where)
        target = BlockTarget(episode_id=episode, start=len(context), end=len(context) + len(block), sample=sample,
                             personas=list(roster.personas), context=conversation_turns(context, roster),
                             block=conversation_turns(block, roster))
        reply = render_block(block)
        return target, JudgedCandidate(context_id=episode, prompt=context, persona=GROUP, reply=reply)

    better = side(item.better, 0)
    return [SanityPair(f"{item.id}/{kind}", kind, better[0], worse[0], better[1], worse[1])
            for n, (kind, turns) in enumerate(item.worse.items(), start=1) for worse in [side(turns, n)]]
