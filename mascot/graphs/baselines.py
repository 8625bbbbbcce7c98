"""Baseline conversation graphs the trained Director is compared against."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langgraph.graph import StateGraph
from langgraph.types import Command, RetryPolicy

from mascot.graphs.assembly import assemble_graph, check_limits
from mascot.graphs.direction import FALLBACK_ACTION, StageDirection
from mascot.graphs.node import Node
from mascot.graphs.routes import DIRECTOR_NODE, hand_back, route
from mascot.graphs.state import DirectorState, persona_speakers
from mascot.graphs.user import UserKind
from mascot.rosters import USER, Persona, Roster

#: The baselines by name: a zero-shot single assistant, fixed round-robin order,
#: random order, and every persona speaking every round.
BASELINES = ("single", "round_robin", "random", "all")

ASSISTANT = Persona(
    id="assistant",
    name="Assistant",
    role="helpful assistant",
    persona="A helpful, harmless and honest general-purpose assistant that answers the person directly.",
    goals=["Help the person with what they bring up."],
    style="Clear and friendly.",
    boundaries=["Never writes lines for the person."],
)
#: A rule that picks the next direction without a model (the baselines use these).
DirectionRule = Callable[[DirectorState], StageDirection]


def create_baseline_graph(
    kind: str,
    roster: Roster,
    *,
    speakers: BaseChatModel | Mapping[str, BaseChatModel],
    user: UserKind = None,
    max_speakers_per_round: int = 3,
    max_rounds: int = 5,
    seed: int = 0,
    retry_policy: RetryPolicy | None = None,
) -> StateGraph:
    """Build a baseline graph with the same state and user turn as the director graph.

    Args:
        kind: One of ``BASELINES``. ``single`` replaces the personas with one generic
            assistant (``speakers`` must then be one chat model).
        roster: The roster (its user profiles and domain are kept for ``single``).
        speakers: One chat model for every persona, or one per persona id.
        user: Who speaks for the person (see ``create_director_graph``).
        max_speakers_per_round: Persona turns per round (``round_robin``, ``random``).
        max_rounds: Rounds after which the conversation ends.
        seed: Seed of the ``random`` order.
        retry_policy: Retry policy of every node (see ``create_director_graph``).

    Returns:
        The uncompiled ``StateGraph``.

    Raises:
        ValueError: on an unknown kind, or a speaker mapping given for ``single``.
    """
    if kind not in BASELINES:
        raise ValueError(f"unknown baseline '{kind}'; valid: {', '.join(BASELINES)}")
    if kind == "single":
        if not isinstance(speakers, BaseChatModel):
            raise ValueError("the 'single' baseline takes one chat model as speakers")
        single = roster.model_copy(update={"id": f"{roster.id}_single", "personas": [ASSISTANT]})
        node = rule_director(lambda state: _direct(ASSISTANT.id, "single"), max_speakers_per_round=1)
        return assemble_graph(
            single, node, speakers=speakers, user=user, max_rounds=max_rounds, retry_policy=retry_policy
        )
    ids = roster.persona_ids
    if kind == "all":
        max_speakers_per_round = len(ids)

    def round_robin(state: DirectorState) -> StageDirection:
        return _direct(ids[len(persona_speakers(state)) % len(ids)], "round-robin order")

    def random_order(state: DirectorState) -> StageDirection:
        spoken = _spoken_this_round(state)
        rng = random.Random(f"{seed}:{len(state.get('directions', []))}")
        return _direct(rng.choice([i for i in ids if i not in spoken] or ids), "random order")

    def all_speak(state: DirectorState) -> StageDirection:
        spoken = _spoken_this_round(state)
        remaining = [i for i in ids if i not in spoken]
        return _direct(remaining[0], "every persona speaks") if remaining else _direct(USER, "round done")

    rule = {"round_robin": round_robin, "random": random_order, "all": all_speak}[kind]
    node = rule_director(rule, max_speakers_per_round=max_speakers_per_round)
    return assemble_graph(
        roster, node, speakers=speakers, user=user, max_rounds=max_rounds, retry_policy=retry_policy
    )


def rule_director(
    rule: DirectionRule, *, max_speakers_per_round: int, min_speakers_per_round: int = 1
) -> Runnable:
    """A Director node that follows a rule instead of a model (for baselines).

    Args:
        rule: Picks the next direction from the state.
        max_speakers_per_round: Persona turns before the turn returns to the person.
        min_speakers_per_round: Persona turns before the rule may hand back.

    Returns:
        A node to pass to ``assemble_graph``.
    """
    check_limits(max_speakers_per_round, min_speakers_per_round, 1)

    def direct(state: DirectorState) -> Command:
        if state.get("round_turns", 0) >= max_speakers_per_round:
            return route(state, hand_back())
        direction = rule(state)
        if direction.speaker == USER and state.get("round_turns", 0) < min_speakers_per_round:
            raise ValueError("a direction rule handed back before a persona spoke")
        return route(state, direction)

    return Node(DIRECTOR_NODE, direct)


def _direct(speaker: str, rationale: str) -> StageDirection:
    return StageDirection(speaker=speaker, action=FALLBACK_ACTION, tone="natural", rationale=rationale)


def _spoken_this_round(state: DirectorState) -> set[str]:
    """Speakers chosen since the last hand-back to the person."""
    spoken: set[str] = set()
    for direction in reversed(state.get("directions", [])):
        if direction["speaker"] == USER:
            break
        spoken.add(direction["speaker"])
    return spoken
