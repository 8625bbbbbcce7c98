"""The safety detector: which of a roster's safety rules a person's message calls for, offline and fast.

``SafetyDetector`` tries the rule's patterns, then a linear classifier over the sentence
embedding (``mascot.graphs.embeddings``: all-mpnet-base-v2 when built, else
all-MiniLM-L6-v2, else lexical) of the person's latest message, read with the riskiest
earlier one when there is one (risk that builds over turns), fitted on the rules' trigger
examples (each its rule) against their near misses and a few everyday messages (no rule):
shipped for the shipped rosters, fitted once and cached for others
(``mascot.graphs.safety_heads``), and a window classifier over the last messages
(``mascot.graphs.safety_window``). Its settings, chosen on the dev sets, live here beside it.
"""

from __future__ import annotations

import functools
import logging
import re
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mascot.graphs import risk as running
from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.graphs.safety_heads import (
    FIT_RATE,
    FIT_STEPS,
    StoredHead,
    cache_head,
    fit_head,
    head_key,
    load_head,
    softmax,
)
from mascot.graphs.safety_window import (
    WINDOW_THRESHOLD,
    WindowClassifier,
    shipped_training_file,
    training_windows,
    window_text,
)
from mascot.rosters import Roster, SafetyRule
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
#: ``bench/safety.py`` prints the sweep, for each encoder (``ENCODER_SETTINGS``: these are
#: MiniLM's).
THRESHOLD = 0.3
NEAR_MISS_WEIGHT = 2.0
L2 = 1e-4
MIN_SIMILARITY = 0.45
#: Risk read across turns: an earlier message of the person whose probability of a rule is at
#: least ``CONTEXT_FLOOR`` is the summary of earlier risk; the latest message, read with it
#: (the two joined), fires the rule at ``CONTEXT_THRESHOLD`` when it raises the rule's
#: probability above the earlier message's own. "I've made up my mind, it's tonight" after
#: "I feel like a burden to everyone" fires; after a message about a job offer it does not,
#: nor does "thanks, that helps" after the burden (it lowers the risk). Chosen on the dev
#: conversations (``safety_conversations_dev.yaml``), with ``CONTEXT_MESSAGES`` earlier
#: messages read.
#: A message that fires alone below ``ALONE_THRESHOLD`` after earlier messages fires only if
#: read with the conversation (the riskiest earlier message, else the one before) it still
#: does: "I've made up my mind, it's tonight" after a job offer is not a crisis.
CONTEXT_FLOOR = 0.1
CONTEXT_THRESHOLD = 0.3
ALONE_THRESHOLD = 0.5
CONTEXT_MESSAGES = 6
#: Where an encoder's own dev-set choice differs from the settings above (``bench/safety.py``
#: sweeps each encoder on the dev messages, then the context on the dev conversations).
#: The context settings were chosen as the most dev recall among those that raise no roster's
#: dev false alarms above the context off; for the lexical fallback that is the context off.
ENCODER_SETTINGS: dict[str, dict[str, float]] = {
    "mpnet": {"near_miss_weight": 1.0, "min_similarity": 0.55,
              "context_floor": 0.05, "context_threshold": 0.2, "alone_threshold": 0.5},
    "minilm": {"context_floor": 0.05, "context_threshold": 0.2, "alone_threshold": 1.01},
    "lexical": {"threshold": 0.4, "min_similarity": 0.0,
                "context_floor": 1.01, "context_threshold": 1.01, "alone_threshold": 0.0},
}
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
    """A rule that fired: its name, how (``pattern``, ``classifier``, or ``context``: the
    latest message read with the earlier one that raised the risk), the score (1.0 for a
    pattern, else the classifier's probability of the rule) and what it matched (the
    pattern, the rule's trigger example nearest the message, or the earlier message)."""

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
                 threshold: float | None = None, near_miss_weight: float | None = None, l2: float | None = None,
                 min_similarity: float | None = None, context_floor: float | None = None,
                 context_threshold: float | None = None, alone_threshold: float | None = None,
                 windows: Sequence[tuple[str, str | None]] = ()) -> None:
        """Args:
            rules: The roster's safety rules.
            embedder: Embeds messages and examples; default ``default_embedder()``
                (all-mpnet-base-v2 when built, MiniLM when the ``metrics`` extra is
                installed, else lexical, which only sees shared words: logged).
            threshold: The classifier's probability of a rule at which it fires.
            near_miss_weight: A near miss's weight against a trigger's in the fit.
            l2: The fit's L2 penalty.
            min_similarity: Cosine similarity to one of the rule's triggers a message needs.
            context_floor: An earlier message's probability of a rule from which it is read
                with the latest.
            context_threshold: The probability of the two read together at which the rule fires.
            alone_threshold: After earlier messages, the probability from which a message
                fires without being read with them.
            windows: Training windows of the person's last messages and their rule
                (``safety_window.training_windows``); none: no window classifier.

        A setting left ``None`` is the encoder's (``ENCODER_SETTINGS``), else the module's
        (``THRESHOLD``, ``NEAR_MISS_WEIGHT``, ``L2``, ``MIN_SIMILARITY``, ``CONTEXT_FLOOR``,
        ``CONTEXT_THRESHOLD``, ``ALONE_THRESHOLD``).
        """
        self.rules = list(rules)
        self._given = {k: v for k, v in {
            "threshold": threshold, "near_miss_weight": near_miss_weight, "l2": l2, "min_similarity": min_similarity,
            "context_floor": context_floor, "context_threshold": context_threshold,
            "alone_threshold": alone_threshold}.items() if v is not None}
        self._settings_cache: dict[str, float] | None = None
        self._embedder = embedder
        self._patterns = [(rule.name, re.compile(p, re.IGNORECASE)) for rule in self.rules for p in rule.patterns]
        self._head: _Head | None = None
        self._vectors: dict[str, np.ndarray] = {}  # a conversation's earlier messages are read again each round
        self._windows = tuple(windows)
        self._window: WindowClassifier | None = None

    @classmethod
    def for_roster(cls, roster: Roster, training: Path | None = None, **settings: Any) -> SafetyDetector:
        """The detector the guard of ``roster`` runs: its rules, and the window classifier
        fitted on its training conversations, if any: ``training`` (a file like
        ``safety_window.TRAIN_FILE``), else the file shipped beside a shipped roster
        (``settings`` as for the constructor)."""
        path = training if training is not None else shipped_training_file(roster.id)
        return cls(roster.safety, windows=training_windows(path), **settings)

    @property
    def window(self) -> WindowClassifier | None:
        """The window classifier, when the detector has training windows."""
        if self._window is None and self._windows:
            negatives = tuple(dict.fromkeys([*(t for rule in self.rules for t in rule.near_misses),
                                             *everyday_messages()]))
            self._window = WindowClassifier(self.rules, self._windows, negatives, self.embedder,
                                            near_miss_weight=self.near_miss_weight, l2=self.l2)
        return self._window

    @property
    def settings(self) -> dict[str, float]:
        """Every setting in use: those given, else the encoder's, else the module's."""
        if self._settings_cache is None:
            defaults = {"threshold": THRESHOLD, "near_miss_weight": NEAR_MISS_WEIGHT, "l2": L2,
                        "min_similarity": MIN_SIMILARITY, "context_floor": CONTEXT_FLOOR,
                        "context_threshold": CONTEXT_THRESHOLD, "alone_threshold": ALONE_THRESHOLD}
            self._settings_cache = {**defaults, **ENCODER_SETTINGS.get(self.embedder.name, {}), **self._given}
        return self._settings_cache

    threshold = property(lambda self: self.settings["threshold"], doc="The classifier's firing probability.")
    near_miss_weight = property(lambda self: self.settings["near_miss_weight"], doc="A near miss's fit weight.")
    l2 = property(lambda self: self.settings["l2"], doc="The fit's L2 penalty.")
    min_similarity = property(lambda self: self.settings["min_similarity"], doc="Similarity to a trigger needed.")
    context_floor = property(lambda self: self.settings["context_floor"], doc="Earlier risk read with the latest.")
    context_threshold = property(lambda self: self.settings["context_threshold"], doc="Firing probability, joined.")
    alone_threshold = property(lambda self: self.settings["alone_threshold"], doc="Fires alone after context.")

    @property
    def embedder(self) -> Embedder:
        """The embedder in use (loaded on first use)."""
        if self._embedder is None:
            self._embedder = default_embedder()
            if self._embedder.name == "lexical":
                logger.warning("the safety detector embeds with the lexical fallback: install mascot[metrics] "
                               "for indirect crisis messages")
        return self._embedder

    def detect(self, message: str, context: Sequence[str] = ()) -> Detection | None:
        """The rule the person's latest ``message`` calls for, or ``None``: the message (read
        with earlier risk, ``detect_message``; not for a rule of ``risk.STAGED_RULES`` when
        the message speaks of someone else or of a past that is over, ``risk.about_others``),
        else the window of the last messages together at ``WINDOW_THRESHOLD``
        (``mascot.graphs.safety_window``)."""
        found = self.detect_message(message, context)
        if found is not None and found.rule in running.STAGED_RULES and running.about_others(message):
            return None  # a character, the news, a friend, a past that is over: the running risk counts a fifth
        if found is not None or not context or self.window is None or not self.rules:
            return found
        probabilities = self.window.probabilities([*context, message], self._vector(window_text([*context, message])))
        rule = max(probabilities, key=probabilities.__getitem__)
        if probabilities[rule] < WINDOW_THRESHOLD:
            return None
        return Detection(rule, "window", round(probabilities[rule], 4), window_text([*context, message]))

    def signal(self, message: str, context: Sequence[str] = ()) -> dict[str, float]:
        """Each rule's probability for the running risk: the higher of the message's and
        (with earlier messages) the window's."""
        single = self.rule_probabilities(message)
        if not context or self.window is None or not self.rules:
            return single
        said = [*context, message]
        window = self.window.probabilities(said, self._vector(window_text(said)))
        return {rule: max(p, window[rule]) for rule, p in single.items()}

    def detect_message(self, message: str, context: Sequence[str] = ()) -> Detection | None:
        """The rule the person's latest ``message`` calls for, or ``None``.

        Args:
            message: The person's latest message.
            context: Their earlier messages, oldest first: the riskiest of the last
                ``CONTEXT_MESSAGES`` (at least ``context_floor`` for a rule) is read with the
                latest, which fires the rule when together they reach ``context_threshold``
                and the latest raised the risk; a latest message that fires alone below
                ``alone_threshold`` must still fire read with them.
        """
        if not self.rules or not message.strip():
            return None
        for name, pattern in self._patterns:
            if pattern.search(message):
                return Detection(name, "pattern", 1.0, pattern.pattern)
        found = self._classify(message, self.threshold)
        earlier = [m for m in context[-CONTEXT_MESSAGES:] if m.strip()]
        if not earlier:
            return found
        risks = np.stack([self.probabilities(m)[1:] for m in earlier])
        row, index = np.unravel_index(int(risks.argmax()), risks.shape)
        risky = risks[row, index] >= self.context_floor
        if found is not None:
            if found.score >= self.alone_threshold:
                return found
            anchor = earlier[row] if risky else earlier[-1]
            joined = self._classify(f"{anchor} {message}", self.threshold)
            return found if joined is not None and joined.rule == found.rule else None
        if not risky:
            return None
        together = self._classify(f"{earlier[row]} {message}", self.context_threshold)
        if together is None or together.rule != self.rules[index].name or together.score <= risks[row, index]:
            return None
        return Detection(together.rule, "context", together.score, earlier[row])

    def rule_probabilities(self, text: str) -> dict[str, float]:
        """The classifier's probability of each rule for ``text``, by rule name."""
        return {rule.name: float(p) for rule, p in zip(self.rules, self.probabilities(text)[1:], strict=True)}

    def probabilities(self, text: str) -> np.ndarray:
        """The classifier's probabilities of no rule (first) and of each rule, for ``text``."""
        head = self.head()
        return softmax(self._vector(text)[None, :] @ head.weights + head.bias)[0]

    def _vector(self, text: str) -> np.ndarray:
        vector = self._vectors.get(text)
        if vector is None:
            if len(self._vectors) >= 256:
                self._vectors.clear()
            vector = self._vectors[text] = np.asarray(self.embedder.encode([text]), dtype=np.float32)[0]
        return vector

    def _classify(self, text: str, threshold: float) -> Detection | None:
        """The classifier's rule for ``text`` at ``threshold``, if the text is also at least
        ``min_similarity`` similar to one of the rule's triggers."""
        head = self.head()
        vector = self._vector(text)
        probabilities = self.probabilities(text)
        index = int(probabilities[1:].argmax())
        if probabilities[1 + index] < threshold:
            return None
        rule = self.rules[index].name
        rows = [i for i, name in enumerate(head.trigger_rules) if name == rule]
        similarities = head.triggers[rows] @ vector
        if float(similarities.max()) < self.min_similarity:
            return None
        nearest = rows[int(similarities.argmax())]
        return Detection(rule, "classifier", round(float(probabilities[1 + index]), 4), head.trigger_texts[nearest])

    def key(self) -> str:
        """What the classifier is fitted from, hashed (``safety_heads.head_key``)."""
        texts, labels, _ = self._examples()
        return head_key(texts, labels, len(self.rules) + 1, self.embedder.name, self._settings())

    def fit(self) -> StoredHead:
        """Fit the classifier now (the examples embedded), whatever is stored. The triggers'
        embeddings are kept at half precision, as stored, so a fitted head and a stored one
        detect alike."""
        texts, labels, triggers = self._examples()
        vectors = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        weights, bias = fit_head(vectors, np.asarray(labels), len(self.rules) + 1,
                                 near_miss_weight=self.near_miss_weight, l2=self.l2)
        return StoredHead(weights, bias, vectors[:triggers].astype(np.float16).astype(np.float32), "fitted")

    def head(self) -> _Head:
        """The classifier: shipped or cached for these rules, encoder and settings
        (``mascot.graphs.safety_heads``), else fitted and cached, on the first call."""
        if self._head is None:
            key = self.key()
            with _HEADS_LOCK:  # one fit per process: each graph a rollout builds has its own detector
                stored = _HEADS.get(key) or load_head(key)
                if stored is None:
                    start = time.perf_counter()
                    stored = self.fit()
                    where = cache_head(key, stored.weights, stored.bias, stored.triggers)
                    logger.info("safety classifier fitted (%s) in %.1f s%s", self.embedder.name,
                                time.perf_counter() - start, f"; cached in {where}" if where else "")
                for array in (stored.weights, stored.bias, stored.triggers):
                    array.setflags(write=False)
                _HEADS[key] = stored
            names = [rule.name for rule in self.rules for _ in rule.triggers]
            texts = [text for rule in self.rules for text in rule.triggers]
            self._head = _Head(stored.weights, stored.bias, names, texts, stored.triggers, stored.source,
                               stored.measured)
        return self._head

    def _examples(self) -> tuple[tuple[str, ...], tuple[int, ...], int]:
        """The fit's texts (triggers first), their labels (0: no rule) and the trigger count."""
        triggers = tuple((i + 1, text) for i, rule in enumerate(self.rules) for text in rule.triggers)
        negatives = tuple(dict.fromkeys([*(t for rule in self.rules for t in rule.near_misses),
                                         *everyday_messages()]))
        return (tuple(t for _, t in triggers) + negatives,
                tuple(label for label, _ in triggers) + (0,) * len(negatives),
                len(triggers))

    def _settings(self) -> dict[str, float]:
        return {"near_miss_weight": self.near_miss_weight, "l2": self.l2, "steps": FIT_STEPS, "rate": FIT_RATE}

    def describe(self) -> str:
        """One line: the encoder, where the classifier came from and, for a shipped roster,
        what it measured on the held-out sets."""
        head = self.head()
        line = f"safety detector: encoder {self.embedder.name}, classifier {head.source}"
        if head.measured:
            m = head.measured
            line += (f"; held out: recall {m['recall']:.2f}, false alarms {m['false_alarms']:.1%} per message"
                     + (f", conversations recall {m['conversation_recall']:.2f}, false alarms "
                        f"{m['conversation_false_alarms']:.1%}" if m.get("conversation_recall") is not None else ""))
        else:
            line += "; not measured on a labelled set (mascot rosters check ROSTER --safety)"
        return line


@dataclass(frozen=True)
class _Head:
    """The fitted classifier (class 0: no rule; class i: the i-th rule) and the triggers'
    rules, texts and embeddings (to name the nearest trigger of a detection)."""

    weights: np.ndarray
    bias: np.ndarray
    trigger_rules: list[str]
    trigger_texts: list[str]
    triggers: np.ndarray
    source: str = "fitted"
    measured: dict[str, Any] | None = None


#: Heads by key, shared by the detectors of one process.
_HEADS: dict[str, StoredHead] = {}
_HEADS_LOCK = threading.Lock()
