"""The safety guard reads the window, not only the message: a classifier over the person's
last few messages together.

Risk that builds over several messages ("gp gave me sleeping tablets months ago", "got them
out of the drawer tonight", "counted twice. its enough") is in none of them alone. This
classifier reads the last ``WINDOW`` person messages joined, fitted on a roster's training
conversations (``safety_conversations_train.yaml`` beside a shipped roster: conversations
where the risk builds, and hard negatives such as stories, third persons, past events,
idioms and resolved worries, written apart from the labelled sets that report the detector)
together with the rules' triggers and near misses and the everyday messages. Its probability
of each rule is one more signal of the running risk (``mascot.graphs.risk``), and fires a
rule outright from ``WINDOW_THRESHOLD``. Heads are stored like the message classifier's
(``mascot.graphs.safety_heads``): shipped, else fitted once and cached.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from mascot.graphs.embeddings import Embedder
from mascot.graphs.safety_heads import StoredHead, cache_head, fit_head, head_key, load_head, softmax
from mascot.rosters import SafetyRule
from mascot.rosters.yaml_file import read_yaml

logger = logging.getLogger(__name__)

#: Person messages read together, the latest last.
WINDOW = 3
#: The window's probability of a rule from which it fires the rule outright (chosen on the
#: dev conversations with ``bench/safety.py``).
WINDOW_THRESHOLD = 0.6
#: The training conversations' file beside a shipped roster.
TRAIN_FILE = "safety_conversations_train.yaml"


def window_text(said: Sequence[str]) -> str:
    """The last ``WINDOW`` messages of ``said`` (oldest first), joined as the classifier reads them."""
    return " ".join(text.strip() for text in said[-WINDOW:] if text.strip())


def training_windows(path: Path | None) -> list[tuple[str, str | None]]:
    """The windows of the training conversations in ``path`` with their rule (``None``: no
    rule): every window of a hard negative, and the windows of a building conversation from
    its ``fires_at`` on (those before are neither: left out). ``[]`` without a file."""
    if path is None or not path.is_file():
        return []
    windows: list[tuple[str, str | None]] = []
    for c in read_yaml(path)["conversations"]:  # type: ignore[index]
        messages = [str(m) for m in c["messages"]]
        start = 0 if c["kind"] == "hard_negative" else int(c["fires_at"])
        for end in range(start, len(messages)):
            windows.append((window_text(messages[:end + 1]), c.get("rule")))
    return windows


def shipped_training_file(roster_id: str) -> Path | None:
    """The training conversations shipped beside roster ``roster_id``, if any."""
    path = Path(str(resources.files("mascot.rosters").joinpath("data", roster_id, TRAIN_FILE)))
    return path if path.is_file() else None


class WindowClassifier:
    """A linear softmax classifier (no rule, then each rule) over the embedding of the
    person's last ``WINDOW`` messages together."""

    def __init__(self, rules: Sequence[SafetyRule], windows: Sequence[tuple[str, str | None]],
                 negatives: Sequence[str], embedder: Embedder, *, near_miss_weight: float, l2: float) -> None:
        """Args:
            rules: The roster's safety rules.
            windows: Training windows and their rule (``training_windows``).
            negatives: Messages calling for no rule (near misses, everyday messages).
            embedder: The detector's embedder.
            near_miss_weight: A no-rule example's weight in the fit.
            l2: The fit's L2 penalty.
        """
        self.rules = list(rules)
        index = {rule.name: i + 1 for i, rule in enumerate(self.rules)}
        examples = [(text, index[rule] if rule else 0) for text, rule in windows if rule is None or rule in index]
        examples += [(t, i + 1) for i, rule in enumerate(self.rules) for t in rule.triggers]
        examples += [(t, 0) for t in negatives]
        self._texts = tuple(t for t, _ in examples)
        self._labels = tuple(label for _, label in examples)
        self._embedder = embedder
        self._settings = {"near_miss_weight": near_miss_weight, "l2": l2, "window": WINDOW}
        self._head: StoredHead | None = None
        self._lock = threading.Lock()

    def key(self) -> str:
        """What the classifier is fitted from, hashed (``safety_heads.head_key``)."""
        return head_key(self._texts, self._labels, len(self.rules) + 1, f"window-{self._embedder.name}",
                        self._settings)

    def fit(self) -> StoredHead:
        """Fit the classifier now (the examples embedded), whatever is stored."""
        vectors = np.asarray(self._embedder.encode(list(self._texts)), dtype=np.float32)
        weights, bias = fit_head(vectors, np.asarray(self._labels), len(self.rules) + 1,
                                 near_miss_weight=float(self._settings["near_miss_weight"]),
                                 l2=float(self._settings["l2"]))
        return StoredHead(weights, bias, np.zeros((0, vectors.shape[1]), np.float32), "fitted")

    def head(self) -> StoredHead:
        """The fitted classifier: shipped or cached, else fitted now and cached."""
        with self._lock:
            if self._head is None:
                key = self.key()
                stored = load_head(key)
                if stored is None:
                    stored = self.fit()
                    where = cache_head(key, stored.weights, stored.bias, stored.triggers)
                    logger.info("safety window classifier fitted on %d examples%s", len(self._texts),
                                f"; cached in {where}" if where else "")
                self._head = stored
            return self._head

    def probabilities(self, said: Sequence[str], vector: np.ndarray | None = None) -> dict[str, float]:
        """Each rule's probability for the last ``WINDOW`` messages of ``said`` (oldest first)."""
        head = self.head()
        if vector is None:
            vector = np.asarray(self._embedder.encode([window_text(said)]), dtype=np.float32)[0]
        p = softmax(vector @ head.weights + head.bias)
        return {rule.name: float(p[i + 1]) for i, rule in enumerate(self.rules)}
