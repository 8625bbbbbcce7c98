"""The state shared by the director graph, its speakers and the user turn."""

from __future__ import annotations

import hashlib
import operator
import random
from collections.abc import Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, AnyMessage
from langgraph.graph.message import add_messages

from mascot.graphs.direction import StageDirection
from mascot.rosters import USER, Roster


class Fallback(TypedDict):
    """A recorded repair or replacement of model output (never silent)."""

    node: str
    round: int
    reason: str


class DirectorState(TypedDict, total=False):
    """State of a directed conversation.

    Everything stored is plain JSON data, so any checkpointer serialises it without
    registering types.

    Attributes:
        messages: The conversation. Persona turns are ``AIMessage`` with
            ``name=<persona id>`` and the direction that produced them under
            ``additional_kwargs["stage_direction"]``; the person's turns are
            ``HumanMessage``.
        directions: Every Director decision in order (``StageDirection.model_dump()``),
            hand-backs to the person included.
        fallbacks: Every repaired or replaced model output.
        round: Completed rounds (a round ends when the turn returns to the person).
        round_turns: Persona turns taken in the current round.
        scenario: The opening scenario (``Scenario.model_dump()``), for simulated users.
        user_profile: The simulated person (``UserProfile.model_dump()``).
        guard: The safety rule that governs the current round (``SafetyGuard.check``:
            rule, route, forbidden voices, resources), or ``None``; set at the round's
            first decision.
        guards: Every rule that fired, with the ``round`` it governed, in order.
        safety_risk: The conversation's running risk per safety rule after the person's
            latest message (``mascot.graphs.risk``): an app reads it, and clears a rule
            (0) or raises one (``risk.PEAK``) with ``graph.update_state``.
        proposed: The direction waiting for the app's approval (``approve=True``), or ``None``.
        approvals: Every answer of the app to an approval interrupt: ``round``, ``cut`` (the
            messages before the decision), ``decision`` (``approved``, ``edited`` or
            ``rejected``), ``proposed`` and ``played``.
    """

    messages: Annotated[list[AnyMessage], add_messages]
    directions: Annotated[list[dict[str, Any]], operator.add]
    fallbacks: Annotated[list[Fallback], operator.add]
    round: int
    round_turns: int
    scenario: dict[str, Any] | None
    user_profile: dict[str, Any] | None
    guard: dict[str, Any] | None
    guards: Annotated[list[dict[str, Any]], operator.add]
    safety_risk: dict[str, float] | None
    proposed: dict[str, Any] | None
    approvals: Annotated[list[dict[str, Any]], operator.add]


def stage_directions(state: DirectorState) -> list[StageDirection]:
    """The Director's decisions of a state as typed objects."""
    return [StageDirection.model_validate(d) for d in state.get("directions", [])]


def persona_speakers(state: DirectorState) -> list[str]:
    """Persona ids in the order their turns appear in the conversation."""
    return [
        m.name for m in state.get("messages", []) if isinstance(m, AIMessage) and m.name
    ]


def round_messages(messages: Sequence[AnyMessage]) -> list[AIMessage]:
    """The persona turns since the person's last message, in order."""
    heard: list[AIMessage] = []
    for message in messages:
        if message.type == "human":
            heard = []
        elif isinstance(message, AIMessage) and message.name:
            heard.append(message)
    return heard


def round_directions(state: DirectorState) -> list[dict[str, Any]]:
    """The Director's directions since the turn last went back to the person, in order."""
    directions = state.get("directions", [])
    back = [i for i, d in enumerate(directions) if d.get("speaker") == USER]
    return directions[back[-1] + 1:] if back else list(directions)


def round_speakers(messages: Sequence[AnyMessage]) -> list[str]:
    """Persona ids that spoke since the person's last message, in order."""
    return [str(message.name) for message in round_messages(messages)]


def allowed_speakers(
    roster: Roster, messages: Sequence[AnyMessage], *, round_turns: int, min_speakers_per_round: int
) -> tuple[str, ...]:
    """Who a direction may name now: the personas not heard since the person's last
    message (each speaks at most once per round), in roster order, then ``USER`` once
    ``min_speakers_per_round`` personas spoke."""
    heard = set(round_speakers(messages))
    choices = tuple(pid for pid in roster.persona_ids if pid not in heard)
    return choices + ((USER,) if round_turns >= min_speakers_per_round else ())


def offered_speakers(
    roster: Roster,
    messages: Sequence[AnyMessage],
    *,
    round_turns: int,
    min_speakers_per_round: int,
    seed: int | None = 0,
) -> tuple[str, ...]:
    """``allowed_speakers`` in the order the Director is offered them, in its prompt and its
    schema alike: the voices shuffled for each decision, the hand-back (``USER``) last.

    A model that names the first voice it reads learns nothing about who fits; shuffled,
    position carries no information. The order is drawn from ``seed`` and the conversation
    so far, so the same conversation is always offered in the same order (a replayed or
    resumed run decides alike, and training prompts match the graph's). ``seed=None``
    keeps roster order.
    """
    allowed = allowed_speakers(roster, messages, round_turns=round_turns,
                               min_speakers_per_round=min_speakers_per_round)
    if seed is None:
        return allowed
    voices = [pid for pid in allowed if pid != USER]
    history = "\x1f".join(f"{m.type}:{getattr(m, 'name', None) or ''}:{m.text}" for m in messages)
    random.Random(hashlib.sha256(f"{seed}|{round_turns}|{history}".encode()).digest()).shuffle(voices)
    return (*voices, *((USER,) if USER in allowed else ()))
