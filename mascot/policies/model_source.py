"""Where a local model comes from: a model folder, the Hugging Face cache, or the Hub.

Torch-free, so that resolving a model name (for a policy file, a reward model, a command's
flags) never loads the local backend.
"""

from __future__ import annotations

import os
from pathlib import Path

import httpx

from mascot.policies.spec import PolicyError

_HUB_PROBE_TIMEOUT_S = 3.0


class LocalModelError(PolicyError):
    """The local model or an adapter cannot be loaded; the message says how to fix it."""


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
    from huggingface_hub import try_to_load_from_cache  # the train extra's; not needed for a folder

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


