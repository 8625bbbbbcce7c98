"""The safety guard's routing in the director graph: how a rule in force shapes the round.

When a safety rule is in force the round follows its route whatever the Director writes:
the Director is offered only the routed voice still to speak (``pending_voices``) and
reads why (``guard_note``), a direction to another voice is replaced by the routed one,
and the voice that gives the resources carries them in its action (``within_guard``).
``safety_guard`` turns ``create_director_graph``'s ``safety`` argument into the guard, and
``running_risk`` reads the conversation's running risk from the graph state.
"""

from __future__ import annotations

import logging
from typing import Any

from langchain_core.language_models import BaseChatModel

from mascot.graphs.direction import StageDirection
from mascot.graphs.moderation import AppDetector, ModeratedDetector
from mascot.graphs.risk import PEAK
from mascot.graphs.routes import hand_back
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.safety_detector import SafetyDetector
from mascot.graphs.state import DirectorState, round_directions
from mascot.rosters import USER, Roster

logger = logging.getLogger(__name__)


def safety_guard(roster: Roster, safety: SafetyGuard | bool | AppDetector | BaseChatModel) -> SafetyGuard | None:
    """The guard a graph of ``roster`` runs: ``True`` the roster's own, a given guard as is
    (for this roster), an app's detector (callable or chat model) in the roster's guard,
    ``False`` none (a warning when the roster has rules).

    Raises:
        ValueError: if a given guard holds another roster's rules.
    """
    if safety is False:
        if roster.safety:
            logger.warning("the safety guard is off: roster '%s' has safety rules (%s) that this graph will not "
                           "enforce", roster.id, ", ".join(r.name for r in roster.safety))
        return None
    if safety is True:
        return SafetyGuard(roster) if roster.safety else None
    if isinstance(safety, BaseChatModel) or (callable(safety) and not isinstance(safety, SafetyGuard)):
        if not roster.safety:
            raise ValueError(f"a safety detector was given, but roster '{roster.id}' has no safety rules")
        return SafetyGuard(roster, detector=ModeratedDetector(roster.safety, safety,
                                                               fallback=SafetyDetector.for_roster(roster)))
    if safety.roster.safety != roster.safety:
        raise ValueError(f"the safety guard holds the rules of roster '{safety.roster.id}', not of '{roster.id}'")
    return safety


def pending_voices(state: DirectorState, record: dict[str, Any]) -> list[str]:
    """The route's voices not yet directed this round, in route order."""
    directed = {d.get("speaker") for d in round_directions(state)}
    return [voice for voice in record["route"] if voice not in directed]


def running_risk(state: DirectorState) -> dict[str, float]:
    """The conversation's running safety risk before the person's latest message: the
    state's ``safety_risk``; in a conversation checkpointed before the state had it, each
    rule of the last guarded round at ``risk.PEAK`` (it stays in force as it did)."""
    if state.get("safety_risk") is not None:
        return dict(state["safety_risk"])
    last = state.get("round", 0) - 1
    return {g["rule"]: PEAK for g in state.get("guards") or [] if g.get("round") == last and g.get("rule")}


def guard_note(roster: Roster, record: dict[str, Any] | None) -> str | None:
    """What the Director reads in a guarded round: the rule, and who may not speak."""
    if not record:
        return None
    rule = roster.safety_rule(record["rule"])
    forbidden = ", ".join(roster.persona(v).name for v in record["forbidden"])
    if record.get("via") == "persists":  # one line: why the offer is narrower than usual
        return (f"Safety still applies: earlier in this conversation the person's words called for care ("
                f"{rule.description.rstrip('.')})" + (f"; {forbidden} do not speak." if forbidden else "."))
    return (f"Safety comes first in this round: {rule.description} The voices speak in this order: "
            f"{' then '.join(roster.persona(v).name for v in record['route'])}"
            + (f"; {forbidden} do not speak in this round." if forbidden else ".")
            + " Write the instruction for the voice offered now.")


def within_guard(direction: StageDirection, record: dict[str, Any], offered: tuple[str, ...]) -> StageDirection:
    """``direction`` kept inside the guard's offer (another voice is replaced by the routed
    one, with the model's action and tone, or by the hand-back), marked with the rule, and
    for the voice that gives them, carrying the resources in its action."""
    update: dict[str, Any] = {"guard": {"rule": record["rule"],
                                        **({"persists": True} if record.get("via") == "persists" else {})}}
    if direction.speaker not in offered:
        speaker = offered[0]
        reason = (f"safety rule '{record['rule']}': the Director chose {direction.speaker}, the round's route "
                  f"or limits allow {', '.join(offered)}; {speaker} speaks")
        update.update(speaker=speaker, fallback="; ".join(filter(None, [direction.fallback, reason])))
        if speaker == USER:
            update.update(action=hand_back().action, tone=hand_back().tone)
    if update.get("speaker", direction.speaker) == record["giver"]:
        update["guard"]["resources"] = record["resources"]
        update["action"] = (f"{update.get('action', direction.action).rstrip()} Give the person these resources "
                            f"clearly, in these words: {record['resources']}")
    return direction.model_copy(update=update)

