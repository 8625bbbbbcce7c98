"""The director graph's routes: where the graph starts, and where a stage direction sends it.

The Director node returns a ``Command`` whose ``goto`` is the voice a direction names or the
person's turn (``route``); the graph starts at the Director when the person just spoke, else
at the person's turn (``entry``); ``hand_back`` is the direction that returns the turn to
the person when a round is over.
"""

from __future__ import annotations

from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.types import Command

from mascot.graphs.direction import StageDirection
from mascot.graphs.state import DirectorState
from mascot.graphs.user import USER_NODE
from mascot.rosters import USER

#: Name of the Director node.
DIRECTOR_NODE = "director"


def entry(state: DirectorState) -> str:
    """Start with the Director when the person just spoke, else with the person's turn."""
    messages = state.get("messages", [])
    return DIRECTOR_NODE if messages and isinstance(messages[-1], HumanMessage) else USER_NODE


def route(state: DirectorState, direction: StageDirection) -> Command:
    """Go to the voice ``direction`` names (or the person's turn), recording the direction
    and, when it was repaired or replaced, the Director's fallback with its reason."""
    update: dict[str, Any] = {"directions": [direction.model_dump(exclude_none=True)]}
    if direction.fallback:
        update["fallbacks"] = [
            {"node": DIRECTOR_NODE, "round": state.get("round", 0), "reason": direction.fallback}
        ]
    goto = USER_NODE if direction.speaker == USER else direction.speaker
    return Command(goto=goto, update=update)


def hand_back() -> StageDirection:
    """The direction that hands the turn back to the person (the round's limit reached)."""
    return StageDirection(
        speaker=USER,
        action="Hand the turn back to the person.",
        tone="natural",
        rationale="turn limit of the round reached",
    )
