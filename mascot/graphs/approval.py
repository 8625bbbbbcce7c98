"""The approval step: the app approves, edits or rejects each direction before its voice speaks.

``create_director_graph(approve=True)`` puts ``approval_node`` between the Director and the
voices: it interrupts with the proposed direction, reads the app's answer
(``read_approval``), checks an edit as the graph checks a direction, records the answer in
``state["approvals"]`` and routes the played direction (a rejected one goes back to the
Director).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from langgraph.types import Command, interrupt

from mascot.graphs.direction import StageDirection
from mascot.graphs.node import Node
from mascot.graphs.routes import DIRECTOR_NODE, route
from mascot.graphs.state import DirectorState, round_speakers
from mascot.rosters import USER, Roster

logger = logging.getLogger(__name__)

#: Name of the node that asks the app to approve a direction (``approve=True``).
APPROVAL_NODE = "approve"
#: Fields of a direction an app's edit may set.
EDITABLE = ("speaker", "action", "tone", "addressee", "sees")


def approval_node(roster: Roster) -> Node:
    """The node that asks the app to approve the Director's direction before its voice
    speaks (``create_director_graph(approve=True)``).

    It interrupts with ``{"direction", "round", "roster"}`` and reads the answer the app
    resumes with: ``"approve"``, ``"reject"`` or ``{"edit": {field: value}}``. An approved
    or edited direction is routed as any direction is; a rejected one goes back to the
    Director. Each answer is appended to ``state["approvals"]``: ``{round, cut (the
    messages before the decision), decision (approved | edited | rejected), proposed,
    played}``.

    An answer of another shape, or an edit naming a voice that may not speak now, is not
    played: the node asks again, the reason in the interrupt's ``error``.
    """
    def approve(state: DirectorState) -> Command:
        proposed = state["proposed"]
        question: dict[str, Any] = {"direction": proposed, "round": state.get("round", 0), "roster": roster.id}
        while True:
            answer = interrupt(question)
            try:
                decision, fields = read_approval(answer)
                direction = StageDirection.model_validate(proposed)
                if decision == "edited":
                    direction = _edited(direction, fields, state, roster)
                break
            except ValueError as exc:  # asked again, with the reason
                logger.warning("%s", exc)
                question = {**question, "error": str(exc)}
        entry: dict[str, Any] = {"round": state.get("round", 0), "cut": len(state.get("messages", [])),
                                 "decision": decision, "proposed": proposed}
        if decision == "rejected":
            return Command(goto=DIRECTOR_NODE, update={"approvals": [entry], "proposed": None})
        entry["played"] = direction.model_dump(exclude_none=True)
        command = route(state, direction)
        return Command(goto=command.goto, update={**command.update, "approvals": [entry], "proposed": None})

    return Node(APPROVAL_NODE, approve)


def read_approval(answer: Any) -> tuple[str, dict[str, Any]]:
    """An app's answer to an approval interrupt as ``(decision, edited fields)``.

    Raises:
        ValueError: if the answer is not ``"approve"``, ``"reject"``, ``{"approve": true}``,
            ``{"reject": true}`` or ``{"edit": {field: value, ...}}`` with fields among ``EDITABLE``.
    """
    if isinstance(answer, str) and answer.strip().lower() in ("approve", "reject"):
        return ("approved" if answer.strip().lower() == "approve" else "rejected"), {}
    if isinstance(answer, Mapping) and len(answer) == 1:
        (key, value), = answer.items()
        if key in ("approve", "reject") and value is True:
            return ("approved" if key == "approve" else "rejected"), {}
        if key == "edit" and isinstance(value, Mapping) and value and set(value) <= set(EDITABLE):
            return "edited", dict(value)
    raise ValueError(f"approval: resume with 'approve', 'reject' or {{'edit': {{field: value}}}} (fields "
                     f"{', '.join(EDITABLE)}); got {str(answer)[:120]!r}")


def _edited(direction: StageDirection, fields: dict[str, Any], state: DirectorState, roster: Roster) -> StageDirection:
    """``direction`` with an app's edit applied, checked as the graph checks a direction."""
    speaker = fields.get("speaker", direction.speaker)
    heard = round_speakers(state.get("messages", []))
    allowed = [pid for pid in roster.persona_ids if pid not in heard] + [USER]
    if speaker not in allowed:
        raise ValueError(f"approval: the edit names '{str(speaker)[:60]}', not a voice of {roster.id} that may "
                         f"speak now ({', '.join(allowed)})")
    if state.get("guard") and speaker != direction.speaker:
        raise ValueError(f"approval: safety rule '{state['guard']['rule']}' routes this turn to "
                         f"'{direction.speaker}'; an edit may change its action and tone, not the voice")
    try:
        edited = StageDirection.model_validate({**direction.model_dump(exclude_none=True), **fields})
    except ValueError as exc:
        raise ValueError(f"approval: the edit is not a stage direction: {str(exc).splitlines()[0]}") from None
    return edited.model_copy(update={"action": edited.action.strip(), "tone": edited.tone.strip()})
