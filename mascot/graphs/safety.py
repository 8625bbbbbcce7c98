"""The safety guard: a crisis in the person's message sends the round down the roster's route.

A roster's safety rules (``Roster.safety``) say which voices must speak, in which order,
which must not, and which gives the resource text when a person signals a crisis. The
detector (``mascot.graphs.safety_detector.SafetyDetector``, or an app's own:
``mascot.graphs.moderation``) decides whether a message calls for a rule. Beside it, the
conversation's running risk (``mascot.graphs.risk``) adds up signals over messages, each
harmless alone, and fires a rule when they reach its level; a rule that fired stays in force
while that risk stays up (and at most its ``persists_rounds``), so it ends after several calm
rounds. No LLM is asked: a small Director cannot be trusted with this, and a trained one could
unlearn it. ``SafetyGuard`` is what the director graph holds: the detector, the deployment's
resource texts, and whether the guard is on (off only when a deployment says so).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from langchain_core.messages import BaseMessage

from mascot.graphs import risk as running
from mascot.graphs.safety_detector import Detection, SafetyDetector
from mascot.rosters import DEFAULT_RESOURCES, Roster, SafetyRule

logger = logging.getLogger(__name__)


class Opinion(Protocol):
    """What the guard asks of a second opinion (``mascot.graphs.moderation.SecondOpinion``)."""

    def ask(self, said: Sequence[str]) -> str | None:
        """The rule the person's messages call for, or ``None``."""


class Detector(Protocol):
    """What the guard asks of a detector: ``SafetyDetector``, or an app's own
    (``mascot.graphs.moderation.ModeratedDetector``)."""

    def detect(self, message: str, context: Sequence[str] = ()) -> Detection | None:
        """The rule the person's latest message calls for, or ``None``."""

    def signal(self, message: str, context: Sequence[str] = ()) -> dict[str, float]:
        """Each rule's probability after ``message`` (the running risk's signal)."""

    def describe(self) -> str:
        """One line on what detects."""




class SafetyGuard:
    """The director graph's safety guard: the roster's rules, their detector and the
    deployment's resource texts."""

    def __init__(self, roster: Roster, *, resources: Mapping[str, str] | None = None,
                 detector: Detector | None = None, second_opinion: Opinion | None = None) -> None:
        """Args:
            roster: The roster whose ``safety`` rules apply.
            resources: Resource text per rule name (or ``"*"`` for every rule), overriding
                the rule's own and ``DEFAULT_RESOURCES``: a deployment's country's numbers.
            detector: Default a ``SafetyDetector`` of the roster's rules; an app's own is a
                ``mascot.graphs.moderation.ModeratedDetector``.
            second_opinion: Asked about the whole conversation where no rule fired and a
                rule's running risk is from ``risk.ASK`` to ``risk.FIRE``
                (``mascot.graphs.moderation.SecondOpinion``); a rule it names fires.

        Raises:
            ValueError: on resources for a rule the roster lacks.
        """
        self.roster = roster
        self.resources = dict(resources or {})
        unknown = sorted(set(self.resources) - {"*", *(r.name for r in roster.safety)})
        if unknown:
            raise ValueError(f"resources for unknown safety rules {', '.join(unknown)} of roster "
                             f"'{roster.id}'; valid: *, {', '.join(r.name for r in roster.safety) or '-'}")
        self.detector = detector or SafetyDetector.for_roster(roster)
        self.second_opinion = second_opinion
        self._described = False

    def resource_text(self, rule: SafetyRule) -> str:
        """The resources the rule's giver must give in this deployment."""
        return self.resources.get(rule.name) or self.resources.get("*") or rule.resources or DEFAULT_RESOURCES

    def check(self, messages: Sequence[BaseMessage], earlier: Sequence[Mapping[str, Any]] = (),
              round_index: int = 0, risk: Mapping[str, float] | None = None) -> dict[str, Any] | None:
        """The guard record of a round that starts after ``messages`` (the person spoke
        last), or ``None`` when no rule is in force (``assess``, without the risk)."""
        return self.assess(messages, earlier, round_index, risk)[0]

    def assess(self, messages: Sequence[BaseMessage], earlier: Sequence[Mapping[str, Any]] = (),
               round_index: int = 0, risk: Mapping[str, float] | None = None
               ) -> tuple[dict[str, Any] | None, dict[str, float] | None]:
        """The guard record of a round that starts after ``messages`` (the person spoke
        last), or ``None`` when no rule is in force, and the conversation's running risk
        after the person's latest message (``mascot.graphs.risk``).

        The record holds ``rule``, ``via`` (``pattern``, ``classifier``, ``context``,
        ``running``: the running risk reached ``risk.FIRE``; ``second_opinion``; or ``persists``), ``score``,
        ``route``, ``forbidden``, ``giver``, ``resources``, the rule's ``risk`` and the
        detector's ``seconds``.

        Args:
            messages: The conversation so far.
            earlier: The records of earlier rounds (the graph state's ``guards``).
            round_index: This round's index (the ``round`` of those records).
            risk: The running risk before the latest message (the graph state's
                ``safety_risk``): a rule that fired stays in force while its risk stays at
                ``risk.RELEASE`` or more, and at most its ``persists_rounds``. ``None``
                (risk not followed): a rule that fired stays in force for the rest of the
                conversation, or its ``persists_rounds``; the risk returned is ``None``.
        """
        said = [m.text for m in messages if m.type == "human"]
        if not said or not self.roster.safety:
            return None, None if risk is None else dict(risk)
        if not self._described:
            self._described = True
            logger.info("%s", self.detector.describe())
        start = time.perf_counter()
        found = self.detector.detect(said[-1], said[:-1])
        after = None if risk is None else running.update(
            risk, said[-1], self.detector.signal(said[-1], said[:-1]), fired=found.rule if found else None)
        if found is None:
            held = self._in_force(earlier, round_index) if after is None else self._running(after, earlier, round_index)
            if held is None and after is not None and self.second_opinion is not None:
                unsure = [r for r, v in after.items() if running.ASK <= v < running.FIRE]
                named = self.second_opinion.ask(said) if unsure else None
                if named is not None:
                    after[named] = max(after.get(named, 0.0), running.PEAK)
                    held = {"rule": named, "via": "second_opinion", "risk": after[named]}
            if held is None or held["via"] == "persists":
                return held, after
            found = Detection(held["rule"], held["via"], held["risk"], said[-1])
        rule = self.roster.safety_rule(found.rule)
        logger.warning("safety rule '%s' fired (%s, %.2f, %r): the round follows its route %s", rule.name,
                       found.via, found.score, found.matched[:80], " -> ".join(rule.route))
        return ({"rule": rule.name, "via": found.via, "score": found.score, "matched": found.matched,
                 "route": list(rule.route), "forbidden": list(rule.forbidden), "giver": rule.giver,
                 "resources": self.resource_text(rule), **({} if after is None else {"risk": after[rule.name]}),
                 "seconds": round(time.perf_counter() - start, 4)}, after)

    def _running(self, risk: Mapping[str, float], earlier: Sequence[Mapping[str, Any]],
                 round_index: int) -> dict[str, Any] | None:
        """The rule the running risk puts in force, the riskiest first: one that was in force
        in the round before stays (a ``persists`` record) while it is at ``risk.RELEASE``
        or more and within its ``persists_rounds``; another fires at ``risk.FIRE`` (a
        record with ``via`` "running", completed by ``assess``)."""
        before = {r["rule"]: r for r in earlier if r.get("round") == round_index - 1 and r.get("rule")}
        for name in sorted(risk, key=lambda n: -risk[n]):
            if name not in {r.name for r in self.roster.safety}:
                continue
            rule = self.roster.safety_rule(name)
            was = before.get(name)
            fired = self._fired_round(earlier, name)
            expired = (was is not None and rule.persists_rounds is not None
                       and round_index - fired > rule.persists_rounds)
            if expired or not running.in_force(risk, name, was_in_force=was is not None):
                continue
            if was is None:
                return {"rule": name, "via": "running", "risk": risk[name]}
            return {"rule": name, "via": "persists", "score": was.get("score"), "fired_round": fired,
                    "matched": was.get("matched"), "route": [], "forbidden": list(rule.forbidden), "giver": None,
                    "resources": None, "risk": risk[name], "seconds": 0.0}
        return None

    @staticmethod
    def _fired_round(earlier: Sequence[Mapping[str, Any]], rule: str) -> int:
        """The round in which ``rule`` last fired (not a round it only persisted in)."""
        rounds = [int(r.get("round", 0)) for r in earlier if r.get("rule") == rule and r.get("via") != "persists"]
        return rounds[-1] if rounds else 0

    def _in_force(self, earlier: Sequence[Mapping[str, Any]], round_index: int) -> dict[str, Any] | None:
        """The record of the latest rule that fired before and is still in force, if any."""
        for record in reversed(earlier):
            if record.get("via") == "persists" or record.get("rule") not in {r.name for r in self.roster.safety}:
                continue
            rule = self.roster.safety_rule(record["rule"])
            fired = int(record.get("round", 0))
            if rule.persists_rounds is not None and round_index - fired > rule.persists_rounds:
                continue  # expired; an earlier rule may still be in force
            return {"rule": rule.name, "via": "persists", "score": record.get("score"), "fired_round": fired,
                    "matched": record.get("matched"), "route": [], "forbidden": list(rule.forbidden), "giver": None,
                    "resources": None, "seconds": 0.0}
        return None


def has_resources(reply: str, resources: str) -> bool:
    """Whether a reply gives the resource text: all of it, or every number and the words
    'emergency' or 'crisis' that it holds (a reply may word the rest its own way)."""
    if _squash(resources) in _squash(reply):
        return True
    numbers = re.findall(r"\d[\d\s\-]{1,}\d|\d+", resources)
    keys = [w for w in ("emergency", "crisis") if w in resources.lower()]
    if not numbers and not keys:
        return False
    text = reply.lower()
    return all(re.sub(r"\D", "", n) in re.sub(r"\D", "", reply) for n in numbers) and all(k in text for k in keys)


def _squash(text: str) -> str:
    return " ".join(re.findall(r"\w+", text.lower()))
