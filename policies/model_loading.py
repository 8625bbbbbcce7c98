"""Loading the local backend's model: where it comes from, in which dtype, with which adapters."""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from mascot.policies.precision import resolve_dtype
from mascot.policies.spec import PolicyError

logger = logging.getLogger(__name__)

_HUB_PROBE_TIMEOUT_S = 3.0


class LocalModelError(PolicyError):
    """The local model or an adapter cannot be loaded; the message says how to fix it."""


def load_model(
    model: str,
    *,
    adapters: Mapping[str, str | Path] | None = None,
    device: str | None = None,
    dtype: str | None = None,
) -> tuple[Any, Any]:
    """Load a causal LM with a chat template for generation, and its LoRA adapters.

    Args:
        model: A Hugging Face model id or a local directory.
        adapters: Adapter name -> PEFT adapter directory.
        device: ``cpu``, ``cuda``, ...; defaults to CUDA when available.
        dtype: ``None`` (automatic, ``precision.default_dtype``) or one of
            ``precision.DTYPES``.

    Returns:
        The model in eval mode (a ``PeftModel`` when there are adapters) and its
        tokenizer, padding on the left.

    Raises:
        LocalModelError: if the model cannot be had, has no chat template, or an adapter
            is missing.
        ValueError: on an unknown ``dtype`` name.
    """
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    torch_dtype = resolve_dtype(dtype, device)
    source = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if tokenizer.chat_template is None:
        raise LocalModelError(
            f"model '{model}' has no chat template; use an instruction-tuned model "
            "(e.g. Qwen/Qwen3-0.6B) or one made by `mascot tiny-model`"
        )
    tokenizer.padding_side = "left"
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    with quiet_loading():
        base = AutoModelForCausalLM.from_pretrained(source, dtype=torch_dtype).to(device)
    base.eval()
    for name, path in (adapters or {}).items():
        if not Path(path, "adapter_config.json").is_file():
            raise LocalModelError(f"adapter '{name}': no PEFT adapter at {path} (adapter_config.json missing)")
    if adapters:
        from peft import PeftModel  # only needed when adapters are used

        items = list(adapters.items())
        with quiet_loading():
            base = PeftModel.from_pretrained(base, str(items[0][1]), adapter_name=items[0][0])
        for name, path in items[1:]:
            base.load_adapter(str(path), adapter_name=name)
        base.eval()
    logger.info("loaded %s on %s in %s with adapters %s", model, device, str(base.dtype).removeprefix("torch."),
                sorted(adapters or {}))
    return base, tokenizer


@contextmanager
def quiet_loading() -> Iterator[None]:
    """Load or save models without transformers' progress bars (one per shard, even for a
    tiny model) and without the FutureWarning PEFT 0.21 triggers by reading a property
    transformers 5.24 deprecated: neither is anything a user can act on."""
    hf_logging.disable_progress_bar()
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing.*", category=FutureWarning)
            yield
    finally:
        hf_logging.enable_progress_bar()


def resolve_model(model: str) -> str:
    """Return where to load ``model`` from, failing fast with the fix when it can't be had.

    A local directory is used as is. A Hub id is used when it is cached, or when the Hub
    answers within a few seconds; otherwise the error names the three ways out.

    Raises:
        LocalModelError: if the model cannot be loaded from anywhere.
    """
    path = Path(model).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise LocalModelError(f"{path} is not a model directory (config.json missing)")
        return str(path)
    if model.startswith((".", "/", "~")) or model.count("/") > 1:
        raise LocalModelError(f"no model directory at {path}")
    if isinstance(try_to_load_from_cache(model, "config.json"), str):
        return model
    fix = (
        "pass a local model directory (e.g. one made by `mascot tiny-model --out DIR`), "
        "download it on a connected machine first (`hf download " + model + "`), "
        "or use a server with --base-url URL --model NAME"
    )
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in {"1", "true", "yes", "on"}:
        raise LocalModelError(f"model '{model}' is not cached and HF_HUB_OFFLINE is set; {fix}")
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co")
    try:
        httpx.head(f"{endpoint}/api/models/{model}", timeout=_HUB_PROBE_TIMEOUT_S)
    except httpx.HTTPError as exc:
        raise LocalModelError(
            f"model '{model}' is not cached and the Hugging Face Hub is unreachable "
            f"({type(exc).__name__}); {fix}"
        ) from None
    return model


