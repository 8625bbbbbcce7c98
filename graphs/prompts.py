"""Prompts of the Director, the persona speakers and the user simulator.

Each role sees the shared conversation from its own seat: its own earlier turns are
``assistant`` messages, everyone else's are labelled lines in ``user`` messages. That
keeps strict role alternation for any chat template.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage

from mascot.graphs.direction import StageDirection
from mascot.rosters import USER, Persona, Roster, Scenario, UserProfile

PERSON_LABEL = "Person"


def speaker_label(message: BaseMessage, roster: Roster) -> str:
    """The display label of a message's author: a persona name or ``Person``."""
    if isinstance(message, AIMessage) and message.name in roster.persona_ids:
        return roster.persona(message.name).name
    if isinstance(message, AIMessage):
        return message.name or "Assistant"
    return PERSON_LABEL


def transcript(messages: Sequence[BaseMessage], roster: Roster) -> str:
    """The conversation as labelled lines, one turn per paragraph."""
    return "\n\n".join(
        f"{speaker_label(m, roster)}: {m.text.strip()}"
        for m in messages
        if isinstance(m, (AIMessage, HumanMessage))
    )


def director_messages(
    roster: Roster,
    messages: Sequence[BaseMessage],
    *,
    round_turns: int,
    max_speakers_per_round: int,
    min_speakers_per_round: int,
) -> list[BaseMessage]:
    """The Director's prompt: roster, guidance, output format, and the conversation."""
    voices = "\n".join(
        f'- "{p.id}": {p.name}, the {p.role}. {p.persona.split(". ")[0].rstrip(".")}.'
        for p in roster.personas
    )
    example = {
        "speaker": roster.persona_ids[0],
        "action": "what the speaker should do in this turn",
        "tone": "how the speaker should sound",
        "addressee": "optional: whom to address",
        "rationale": "optional: why this speaker now",
    }
    hand_back = (
        f'or "{USER}" to hand the turn back to the person'
        if round_turns >= min_speakers_per_round
        else "(at least one voice must speak before the turn returns to the person)"
    )
    system = (
        f"You are the Director of a conversation between a person and several voices "
        f"({roster.domain}). Each turn you decide who speaks next and how, so that the voices "
        f"complement each other instead of repeating or simply agreeing with each other.\n\n"
        f"{roster.director.guidance}\n\nThe voices:\n{voices}\n\n"
        f"{round_turns} of at most {max_speakers_per_round} voices have spoken since the "
        f"person's last message.\n"
        f"Answer with one JSON object and nothing else, for example:\n{json.dumps(example)}\n"
        f"The speaker must be one of: {', '.join(json.dumps(i) for i in roster.persona_ids)}, "
        f"{hand_back}."
    )
    conversation = transcript(messages, roster) or "(no messages yet)"
    return [
        SystemMessage(system),
        HumanMessage(f"Conversation so far:\n\n{conversation}\n\nWho speaks next, and how?"),
    ]


def speaker_messages(
    roster: Roster,
    persona: Persona,
    direction: StageDirection,
    messages: Sequence[BaseMessage],
) -> list[BaseMessage]:
    """A persona speaker's prompt: persona system prompt, conversation, stage direction."""
    others = ", ".join(f"{p.name} ({p.role})" for p in roster.personas if p.id != persona.id)
    system = (
        f"You are {persona.name}, the {persona.role}, one of several voices talking with a "
        f"person ({roster.domain}). The other voices are {others}.\n\n"
        f"{persona.persona}\n\nYour goals:\n" + _bullets(persona.goals) + "\n\n"
        f"Your style: {persona.style}\n\nYou never:\n" + _bullets(persona.boundaries) + "\n\n"
        "Add what only you can add; do not repeat what the other voices said. Write only your "
        "own reply, without a name prefix, and never write lines for the other voices or "
        "for the person."
    )
    cue = f"(Director to {persona.name} - action: {direction.action}; tone: {direction.tone}"
    if direction.addressee:
        cue += f"; address: {direction.addressee}"
    cue += ")"
    return [SystemMessage(system), *_seat(messages, roster, own=persona.id, cue=cue)]


def user_simulator_messages(
    roster: Roster,
    profile: UserProfile,
    scenario: Scenario | None,
    messages: Sequence[BaseMessage],
) -> list[BaseMessage]:
    """The user simulator's prompt: who to play, the situation, the conversation."""
    voices = ", ".join(p.name for p in roster.personas)
    background = f"\nBackground: {scenario.context}" if scenario else ""
    system = (
        f"You are role-playing {profile.name}, a person talking with a group of voices "
        f"({voices}) about something in your life.\n"
        f"Who you are: {profile.situation}{background}\n"
        f"Personality: {profile.ocean.describe()}.\nHow you write: {profile.style}\n\n"
        "Stay in character. Write only your next message (one to three sentences), without "
        "a name prefix; never write lines for the voices."
    )
    return [
        SystemMessage(system),
        *_seat(messages, roster, own=USER, cue="(Write your next message.)"),
    ]


def _seat(
    messages: Sequence[BaseMessage], roster: Roster, *, own: str, cue: str
) -> list[BaseMessage]:
    """The conversation seen by ``own``: its turns as assistant, others merged as user."""
    seated: list[BaseMessage] = []
    pending: list[str] = []
    for message in messages:
        is_own = (own == USER and isinstance(message, HumanMessage)) or (
            isinstance(message, AIMessage) and message.name == own
        )
        if is_own:
            if pending:
                seated.append(HumanMessage("\n\n".join(pending)))
                pending = []
            seated.append(AIMessage(message.text.strip()))
        elif isinstance(message, (AIMessage, HumanMessage)):
            pending.append(f"{speaker_label(message, roster)}: {message.text.strip()}")
    pending.append(cue)
    seated.append(HumanMessage("\n\n".join(pending)))
    return seated


def _bullets(items: Sequence[str]) -> str:
    return "\n".join(f"- {item}" for item in items)
