"""Loading the local backend's model: where it comes from, in which dtype, with which adapters."""

from __future__ import annotations

import logging
import warnings
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer
from transformers.utils import logging as hf_logging

from mascot.policies.local.precision import resolve_dtype
from mascot.policies.model_source import LocalModelError, resolve_model

logger = logging.getLogger(__name__)


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
