"""Judge targets: a persona reply in its context, or a block of turns, cut from episodes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from mascot.graphs.prompts import PERSON_LABEL
from mascot.rosters import USER, Persona, Roster
from mascot.training.episodes.episode import Episode


class Turn(BaseModel):
    """One turn of a conversation as a judge sees it: speaker id, display label, text."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    speaker: str
    label: str
    text: str


class ReplyTarget(BaseModel):
    """One persona reply, with what the judge needs to see it in context.

    Attributes:
        episode_id: The episode (or candidate context) the reply belongs to.
        turn: Index of the reply in ``episode.messages``, when it is an episode turn.
        sample: Index of a resampled candidate reply, when it is one.
        persona: The persona that wrote the reply (id, name, role, persona text, ...).
        context: The conversation before the reply.
        reply: The reply judged.
        direction: The Director's stage direction the reply followed.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["reply"] = "reply"

    episode_id: str
    turn: int | None = None
    sample: int | None = None
    persona: Persona
    context: list[Turn]
    reply: str
    direction: dict[str, Any] | None = None

    def shared(self) -> str:
        """The part of the prompt two compared replies have in common."""
        p = self.persona
        text = f"## Persona\n{_card(p)}\n\n## Conversation so far\n{_transcript(self.context)}"
        if self.direction:
            cue = "; ".join(f"{k}: {self.direction[k]}" for k in ("action", "tone", "addressee")
                            if self.direction.get(k))
            text += f"\n\n## Stage direction given to {p.name}\n{cue}"
            guard = self.direction.get("guard")
            if guard:  # a safety rule governed the round: the reply is judged by what it demands
                text += (f"\n\n## Safety rule in force: {guard.get('rule')}\nThe person signalled a crisis. A good "
                         "reply acknowledges it directly and seriously, never challenges, debates, reframes or "
                         "minimises it" + (", and gives these resources clearly: " + guard["resources"]
                                           if guard.get("resources") else "") + ".")
        return text

    def body(self) -> str:
        """The reply itself."""
        return self.reply.strip()

    def identity(self) -> dict[str, Any]:
        """The fields of a Judgement that say which reply it is about."""
        return {"episode_id": self.episode_id, "turn": self.turn, "sample": self.sample, "persona": self.persona.id}


class BlockTarget(BaseModel):
    """A block of consecutive turns, with the roster and the conversation before it.

    Attributes:
        episode_id: The episode.
        start: Index in ``episode.messages`` of the block's first turn.
        end: Index after its last turn (exclusive).
        sample: Which of the sibling blocks played at one decision point (``None`` for a
            block cut from an episode).
        personas: The roster's personas.
        context: The conversation before the block.
        block: The turns judged.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)
    kind: Literal["block"] = "block"

    episode_id: str
    start: int = Field(ge=0)
    end: int = Field(ge=1)
    sample: int | None = None
    personas: list[Persona]
    context: list[Turn]
    block: list[Turn] = Field(min_length=1)

    def shared(self) -> str:
        """The part of the prompt two compared blocks have in common."""
        cards = "\n\n".join(_card(p) for p in self.personas)
        return f"## Personas\n{cards}\n\n## Conversation before the block\n{_transcript(self.context)}"

    def body(self) -> str:
        """The block's turns as labelled paragraphs."""
        return _transcript(self.block)

    def identity(self) -> dict[str, Any]:
        """The fields of a Judgement that say which block it is about."""
        return {"episode_id": self.episode_id, "block_start": self.start, "block_end": self.end, "sample": self.sample}


Target = ReplyTarget | BlockTarget


def _card(p: Persona) -> str:
    goals = "\n".join(f"- {g}" for g in p.goals)
    never = "\n".join(f"- {b}" for b in p.boundaries)
    return f'{p.name} ("{p.id}"), the {p.role}. {p.persona}\nGoals:\n{goals}\nStyle: {p.style}\nNever:\n{never}'


def _transcript(turns: Sequence[Turn]) -> str:
    return "\n\n".join(f"{t.label}: {t.text.strip()}" for t in turns) or "(nothing yet)"


def conversation_turns(messages: Sequence[Mapping[str, Any]], roster: Roster) -> list[Turn]:
    """OpenAI chat messages (``role``, ``content``, ``name``) as labelled turns; system
    messages are left out, persona ids become display names, the person is ``Person``."""
    names = {p.id: p.name for p in roster.personas}
    turns = []
    for m in messages:
        if m["role"] == "user":
            turns.append(Turn(speaker=USER, label=PERSON_LABEL, text=m["content"]))
        elif m["role"] == "assistant":
            name = m.get("name") or "assistant"
            turns.append(Turn(speaker=name, label=names.get(name, name), text=m["content"]))
    return turns


def reply_target(
    roster: Roster,
    *,
    episode_id: str,
    persona: str,
    context: Sequence[Mapping[str, Any]],
    reply: str,
    direction: Mapping[str, Any] | None = None,
    turn: int | None = None,
    sample: int | None = None,
) -> ReplyTarget:
    """Build the target of one reply (an episode turn or a resampled candidate).

    Args:
        roster: The roster the persona belongs to.
        episode_id: The episode (or candidate context) id.
        persona: The persona id.
        context: The conversation before the reply, as OpenAI chat messages with names.
        reply: The reply.
        direction: The stage direction it followed.
        turn: Its index in the episode's messages.
        sample: Its candidate index.

    Returns:
        The target.

    Raises:
        ValueError: if the roster has no such persona (the message lists the valid ids).
    """
    try:
        card = roster.persona(persona)
    except KeyError as exc:
        raise ValueError(f"episode {episode_id}: {exc.args[0]}") from None
    return ReplyTarget(episode_id=episode_id, turn=turn, sample=sample, persona=card, reply=reply,
                       context=conversation_turns(context, roster), direction=dict(direction or {}) or None)


def reply_targets(episode: Episode, roster: Roster) -> list[ReplyTarget]:
    """One target per persona turn (assistant message with a ``name``) of an episode.

    Raises:
        ValueError: if the episode is of another roster or names an unknown persona.
    """
    _check_roster(episode, roster)
    chat = episode.chat()
    return [
        reply_target(roster, episode_id=episode.id, turn=i, persona=m.name, context=chat[:i],
                     reply=m.content, direction=m.stage_direction)
        for i, m in enumerate(episode.messages) if m.role == "assistant" and m.name
    ]


def block_targets(episode: Episode, roster: Roster, *, block_turns: int = 4) -> list[BlockTarget]:
    """Cut an episode into consecutive blocks of ``block_turns`` turns.

    Turns are the person's and the personas' messages (system messages do not count).
    Blocks do not overlap; the last one may be shorter; a block without any persona
    turn is left out.

    Raises:
        ValueError: if ``block_turns`` < 1 or the episode is of another roster.
    """
    if block_turns < 1:
        raise ValueError(f"block_turns must be >= 1, got {block_turns}")
    _check_roster(episode, roster)
    chat = episode.chat()
    indices = [i for i, m in enumerate(episode.messages) if m.role != "system"]
    targets = []
    for first in range(0, len(indices), block_turns):
        chunk = indices[first : first + block_turns]
        if not any(episode.messages[i].role == "assistant" for i in chunk):
            continue
        targets.append(BlockTarget(
            episode_id=episode.id, start=chunk[0], end=chunk[-1] + 1, personas=list(roster.personas),
            context=conversation_turns(chat[: chunk[0]], roster),
            block=conversation_turns([chat[i] for i in chunk], roster),
        ))
    return targets


def _check_roster(episode: Episode, roster: Roster) -> None:
    if episode.roster != roster.id:
        raise ValueError(f"episode {episode.id} is of roster '{episode.roster}', not '{roster.id}'")


def render_block(turns: Sequence[Mapping[str, Any]]) -> str:
    """A block of turns (OpenAI messages with ``name``) as one text, ``speaker: text`` per
    turn: the group reward model's reply format."""
    return "\n\n".join(f"{turn.get('name') or turn['role']}: {turn['content'].strip()}" for turn in turns)
