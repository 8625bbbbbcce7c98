"""Fitted safety classifiers, stored by what they were fitted from, so no app fits one on its
first message.

A head (``SafetyDetector.head``) is a function of the rules' examples, the everyday
messages, the encoder and the fit's settings; ``head_key`` hashes exactly those. The shipped
rosters' heads ship with the package (``safety_heads/``, one file per roster and encoder,
with the figures measured on the roster's held-out sets in ``index.json``; ``mascot rosters
safety-heads --write`` regenerates them); any other roster's head is fitted once and cached
under ``<cache root>/safety/<key>.npz``. A changed rule, encoder or setting is another key:
nothing stale is loaded.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from mascot.offline.model import default_cache

logger = logging.getLogger(__name__)

#: The shipped heads and their index (key -> file, roster, encoder, measured figures).
SHIPPED = Path(__file__).with_name("safety_heads")
#: Raise when the fit itself changes (the same inputs would give another head).
FIT_VERSION = 1
#: Full-batch gradient descent steps and step size of the fit (deterministic: zero start).
FIT_STEPS = 2000
FIT_RATE = 2.0


@dataclass(frozen=True)
class StoredHead:
    """A fitted head as stored: the classifier, the triggers' embeddings (to name the nearest
    trigger and check similarity) and where it came from (``shipped``, ``cached``, ``fitted``)."""

    weights: np.ndarray
    bias: np.ndarray
    triggers: np.ndarray
    source: str
    measured: dict[str, Any] | None = None


def head_key(texts: Sequence[str], labels: Sequence[int], classes: int, encoder: str,
             settings: dict[str, float]) -> str:
    """The hash of everything a head is fitted from."""
    blob = json.dumps({"texts": list(texts), "labels": list(labels), "classes": classes, "encoder": encoder,
                       "settings": settings, "version": FIT_VERSION}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()[:24]


def cache_folder() -> Path:
    """Where heads of rosters the package does not ship are cached."""
    return default_cache().parent / "safety"


def shipped_index() -> dict[str, dict[str, Any]]:
    """The shipped heads' index (empty when none ship)."""
    path = SHIPPED / "index.json"
    return json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}


def load_head(key: str) -> StoredHead | None:
    """The head of ``key``: shipped, else cached, else ``None``. A cached file that cannot be
    read is logged and ignored (it is fitted again)."""
    entry = shipped_index().get(key)
    if entry is not None:
        head = _read(SHIPPED / entry["file"], key, "shipped")
        if head is not None:
            return StoredHead(head.weights, head.bias, head.triggers, "shipped", entry.get("measured"))
    return _read(cache_folder() / f"{key}.npz", key, "cached")


def save_head(path: Path, key: str, weights: np.ndarray, bias: np.ndarray, triggers: np.ndarray) -> Path:
    """Write a head to ``path`` whole or not at all (a temporary file renamed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, temporary = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".npz")
    try:
        with os.fdopen(handle, "wb") as file:
            np.savez_compressed(file, key=np.array(key), weights=weights.astype(np.float32),
                                bias=bias.astype(np.float32), triggers=triggers.astype(np.float16))
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would keep a shipped file from other users
        os.replace(temporary, path)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return path


def cache_head(key: str, weights: np.ndarray, bias: np.ndarray, triggers: np.ndarray) -> Path | None:
    """Cache a freshly fitted head; ``None`` (logged) where the cache cannot be written."""
    try:
        return save_head(cache_folder() / f"{key}.npz", key, weights, bias, triggers)
    except OSError as exc:
        logger.warning("the safety classifier could not be cached in %s (%s): it is fitted again next time",
                       cache_folder(), exc.strerror or exc)
        return None


def _read(path: Path, key: str, source: str) -> StoredHead | None:
    if not path.is_file():
        return None
    try:
        with np.load(path) as data:
            if str(data["key"]) != key:
                logger.warning("%s holds another safety classifier than its name says: ignored", path)
                return None
            return StoredHead(data["weights"], data["bias"], data["triggers"].astype(np.float32), source)
    except (OSError, ValueError, KeyError) as exc:
        logger.warning("%s cannot be read (%s): the safety classifier is fitted again", path, exc)
        return None


def fit_head(vectors: np.ndarray, labels: np.ndarray, classes: int, *, near_miss_weight: float,
             l2: float) -> tuple[np.ndarray, np.ndarray]:
    """A linear softmax classifier (weights ``dim x classes``, bias) fitted to ``vectors``
    and their ``labels`` (0: no rule) by full-batch gradient descent from zero: deterministic."""
    x = np.asarray(vectors, dtype=np.float64)
    targets = np.eye(classes)[labels]
    sample = np.where(labels == 0, near_miss_weight, 1.0)
    sample /= sample.sum()
    weights = np.zeros((x.shape[1], classes))
    bias = np.zeros(classes)
    for _ in range(FIT_STEPS):
        gradient = (softmax(x @ weights + bias) - targets) * sample[:, None]
        weights -= FIT_RATE * (x.T @ gradient + l2 * weights)
        bias -= FIT_RATE * gradient.sum(0)
    return weights.astype(np.float32), bias.astype(np.float32)


def softmax(logits: np.ndarray) -> np.ndarray:
    """Softmax over the last axis."""
    shifted = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return shifted / shifted.sum(axis=-1, keepdims=True)
