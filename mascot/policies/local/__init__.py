"""The in-process backend: transformers + PEFT models, sampling, batching, constrained
decoding, streaming, the local OpenAI-compatible server and the LangChain chat model.

The only part of ``mascot.policies`` that needs torch (the ``train`` extra).
"""

from mascot.policies.local.backend import LocalBackend
from mascot.policies.local.model_loading import load_model, quiet_loading
from mascot.policies.model_source import LocalModelError, resolve_model

__all__ = ["LocalBackend", "LocalModelError", "load_model", "quiet_loading", "resolve_model"]
