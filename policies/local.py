"""The local in-process backend: one transformers base model, any number of LoRA adapters.

This is the only module of ``mascot.policies`` that imports torch; it needs the
``train`` extra.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import warnings
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import torch
from huggingface_hub import try_to_load_from_cache
from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from pydantic import ConfigDict, Field
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer
from transformers.utils import logging as hf_logging

from mascot.policies.spec import PolicyError

logger = logging.getLogger(__name__)

_BASE = "__base__"  # PEFT's name for "no adapter" in per-row adapter_names
_ROLES = {"system": "system", "human": "user", "ai": "assistant"}
_HUB_PROBE_TIMEOUT_S = 3.0


class LocalModelError(PolicyError):
    """The local model or an adapter cannot be loaded; the message says how to fix it."""


@dataclass(frozen=True)
class Generation:
    """One generated reply with its token counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int


class LocalBackend:
    """A base causal LM in memory with named LoRA adapters, shared by many roles.

    Generation holds a lock: PEFT's active adapter is global state, so requests are
    serialised, and a batch picks its adapter per row (``adapter_names``) instead of
    switching the active adapter.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        adapter_versions: Mapping[str, str | None] | None = None,
    ) -> None:
        """Wrap a loaded model; use ``LocalBackend.load`` to load one by name or path."""
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.adapter_versions = dict(adapter_versions or {})
        self._lock = threading.Lock()

    @classmethod
    def load(
        cls,
        model: str,
        *,
        adapters: Mapping[str, str | Path] | None = None,
        adapter_versions: Mapping[str, str | None] | None = None,
        device: str | None = None,
    ) -> LocalBackend:
        """Load a base model (Hub id or local directory) and LoRA adapters.

        Args:
            model: A Hugging Face model id (e.g. ``Qwen/Qwen3-0.6B``) or a local directory.
            adapters: Adapter name -> PEFT adapter directory.
            adapter_versions: Adapter name -> version recorded with each reply.
            device: ``cpu``, ``cuda``, ...; defaults to CUDA when available.

        Returns:
            The backend.

        Raises:
            LocalModelError: if the model is neither a local directory nor reachable
                (offline, not cached), has no chat template, or an adapter is missing.
        """
        source = resolve_model(model)
        device = device or ("cuda" if torch.cuda.is_available() else "cpu")
        dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
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
            base = AutoModelForCausalLM.from_pretrained(source, dtype=dtype).to(device)
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
        logger.info("loaded %s on %s with adapters %s", model, device, sorted(adapters or {}))
        versions = {name: (adapter_versions or {}).get(name) for name in adapters or {}}
        return cls(base, tokenizer, name=model, adapter_versions=versions)

    def load_adapter(self, name: str, path: str | Path, *, version: str | None = None) -> None:
        """Load (or replace) the PEFT adapter ``name`` from ``path`` while serving.

        Waits for the generation in progress; a replaced adapter is swapped under the lock.

        Raises:
            LocalModelError: if ``path`` holds no PEFT adapter or it does not fit the base.
        """
        if not Path(path, "adapter_config.json").is_file():
            raise LocalModelError(f"adapter '{name}': no PEFT adapter at {path} (adapter_config.json missing)")
        from peft import PeftModel

        with self._lock, quiet_loading():
            try:
                if not isinstance(self.model, PeftModel):
                    self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
                else:
                    if name in self.adapter_versions:
                        self.model.delete_adapter(name)
                    self.model.load_adapter(str(path), adapter_name=name)
            except (ValueError, KeyError, RuntimeError, OSError) as exc:
                self.adapter_versions.pop(name, None)
                raise LocalModelError(f"adapter '{name}' at {path} does not load: {str(exc).splitlines()[0]}") from None
            self.model.eval()
            self.adapter_versions[name] = version
        logger.info("adapter %s loaded from %s", name, path)

    def unload_adapter(self, name: str) -> None:
        """Remove the adapter ``name``; waits for the generation in progress.

        Raises:
            ValueError: if no adapter of that name is loaded.
        """
        with self._lock:
            if name not in self.adapter_versions:
                raise ValueError(f"unknown adapter {name}; loaded: {', '.join(self.adapters) or 'none'}")
            if len(self.adapter_versions) == 1:
                self.model = self.model.unload()  # the base without LoRA layers
            else:
                self.model.delete_adapter(name)
            del self.adapter_versions[name]
        logger.info("adapter %s unloaded", name)

    @property
    def adapters(self) -> list[str]:
        """Names of the loaded adapters."""
        return sorted(self.adapter_versions)

    def generate(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        *,
        adapters: Sequence[str | None] | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[Generation]:
        """Generate one reply per conversation in one batch, each with its own adapter.

        Args:
            conversations: Chat messages (``role``/``content`` dicts) per row.
            adapters: Adapter name per row (``None`` = the base model).
            max_new_tokens: Length limit per reply.
            temperature: Sampling temperature; 0 decodes greedily.
            top_p: Nucleus sampling mass.
            seed: Seeds sampling for reproducible replies.
            stop: Strings at which a reply is cut.
            chat_template_kwargs: Extra variables for the chat template
                (e.g. ``enable_thinking``).

        Returns:
            One generation per conversation, in order.

        Raises:
            ValueError: on an unknown adapter name or a length mismatch.
        """
        names = self._adapter_names(adapters, len(conversations))
        inputs = self._encode(conversations, chat_template_kwargs)
        with self._lock, torch.no_grad():
            if seed is not None:
                torch.manual_seed(seed)
            output = self.model.generate(
                **inputs, **self._sampling(max_new_tokens, temperature, top_p), **names
            )
        prompt_length = inputs["input_ids"].shape[1]
        results = []
        for row, tokens in enumerate(output[:, prompt_length:]):
            done = [t for t in tokens.tolist() if t != self.tokenizer.pad_token_id]
            text = self.tokenizer.decode(done, skip_special_tokens=True)
            results.append(
                Generation(
                    text=_cut(text, stop),
                    prompt_tokens=int(inputs["attention_mask"][row].sum()),
                    completion_tokens=len(done),
                )
            )
        return results

    def stream(
        self,
        conversation: Sequence[Mapping[str, str]],
        *,
        adapter: str | None = None,
        max_new_tokens: int = 256,
        temperature: float = 0.7,
        top_p: float = 0.95,
        seed: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> Iterator[str]:
        """Generate one reply and yield its text piece by piece as tokens arrive.

        Args: as for ``generate``, for one conversation.

        Yields:
            Text pieces; their concatenation is the reply.
        """
        names = self._adapter_names([adapter], 1)
        inputs = self._encode([conversation], chat_template_kwargs)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        errors: list[BaseException] = []

        def run() -> None:
            with self._lock, torch.no_grad():
                if seed is not None:
                    torch.manual_seed(seed)
                try:
                    self.model.generate(
                        **inputs,
                        **self._sampling(max_new_tokens, temperature, top_p),
                        **names,
                        streamer=streamer,
                    )
                except BaseException as exc:  # re-raised in the caller's thread below
                    errors.append(exc)
                    streamer.end()

        thread = threading.Thread(target=run, daemon=True)
        thread.start()
        yield from streamer
        thread.join()
        if errors:
            raise errors[0]

    def _encode(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> Any:
        texts = [
            self.tokenizer.apply_chat_template(
                list(conversation),
                tokenize=False,
                add_generation_prompt=True,
                **(chat_template_kwargs or {}),
            )
            for conversation in conversations
        ]
        encoded = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
        return encoded.to(self.model.device)

    def _sampling(self, max_new_tokens: int, temperature: float, top_p: float) -> dict[str, Any]:
        sampling: dict[str, Any] = {
            "max_new_tokens": max_new_tokens,
            "pad_token_id": self.tokenizer.pad_token_id,
            "do_sample": temperature > 0,
        }
        if temperature > 0:
            sampling.update(temperature=temperature, top_p=top_p)
        return sampling

    def _adapter_names(self, adapters: Sequence[str | None] | None, rows: int) -> dict[str, Any]:
        names = list(adapters) if adapters is not None else [None] * rows
        if len(names) != rows:
            raise ValueError(f"got {len(names)} adapter names for {rows} conversations")
        unknown = sorted({n for n in names if n is not None and n not in self.adapter_versions})
        if unknown:
            raise ValueError(
                f"unknown adapter {', '.join(unknown)}; loaded: {', '.join(self.adapters) or 'none'}"
            )
        if not self.adapter_versions:
            return {}
        return {"adapter_names": [n or _BASE for n in names]}


class LocalChatModel(BaseChatModel):
    """A LangChain chat model answering from a ``LocalBackend`` with one adapter.

    Several instances share one backend, so each persona can have its own adapter on
    one base model in memory.
    """

    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend: LocalBackend
    adapter: str | None = None
    max_new_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.7, ge=0.0)
    top_p: float = Field(default=0.95, gt=0.0, le=1.0)
    seed: int | None = None
    # Qwen3-style templates think aloud unless told not to; other templates ignore it.
    chat_template_kwargs: dict[str, Any] = Field(default_factory=lambda: {"enable_thinking": False})

    @property
    def _llm_type(self) -> str:
        return "mascot-local"

    @property
    def _identifying_params(self) -> dict[str, Any]:
        return {"model_name": self.backend.name, "adapter": self.adapter}

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        result = self.backend.generate(
            [to_chat(messages)],
            adapters=[self.adapter],
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self._seed(run_manager),
            stop=stop,
            chat_template_kwargs=self.chat_template_kwargs,
        )[0]
        message = AIMessage(
            content=result.text,
            response_metadata=self._metadata(),
            usage_metadata={
                "input_tokens": result.prompt_tokens,
                "output_tokens": result.completion_tokens,
                "total_tokens": result.prompt_tokens + result.completion_tokens,
            },
        )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        text = ""
        pieces = self.backend.stream(
            to_chat(messages),
            adapter=self.adapter,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            top_p=self.top_p,
            seed=self._seed(run_manager),
            chat_template_kwargs=self.chat_template_kwargs,
        )
        for piece in pieces:
            if stop and _cut(text + piece, stop) != text + piece:
                piece = _cut(text + piece, stop)[len(text) :]
                if piece:
                    yield self._chunk(piece, run_manager)
                break
            text += piece
            if piece:
                yield self._chunk(piece, run_manager)
        yield ChatGenerationChunk(
            message=AIMessageChunk(content="", response_metadata=self._metadata(), chunk_position="last")
        )

    def _chunk(
        self, piece: str, run_manager: CallbackManagerForLLMRun | None
    ) -> ChatGenerationChunk:
        chunk = ChatGenerationChunk(message=AIMessageChunk(content=piece))
        if run_manager:
            run_manager.on_llm_new_token(piece, chunk=chunk)
        return chunk

    def _seed(self, run_manager: CallbackManagerForLLMRun | None) -> int | None:
        """The sampling seed of one call: ``seed``, varied by the run's ``episode_id`` and
        ``sample`` metadata, so repeated episodes and candidate samples differ while each
        stays reproducible whatever order concurrent calls run in."""
        if self.seed is None:
            return None
        metadata = run_manager.metadata if run_manager else {}
        if "episode_id" not in metadata and "sample" not in metadata:
            return self.seed
        key = f"{self.seed}|{metadata.get('episode_id')}|{metadata.get('sample')}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")

    def _metadata(self) -> dict[str, Any]:
        return {
            "model_name": self.backend.name,
            "adapter": self.adapter,
            "adapter_version": self.backend.adapter_versions.get(self.adapter) if self.adapter else None,
        }


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


def to_chat(messages: Sequence[BaseMessage]) -> list[dict[str, str]]:
    """LangChain messages as chat-template dicts (``role``/``content``).

    Raises:
        ValueError: on a message type a chat template cannot take (e.g. tool calls).
    """
    chat = []
    for message in messages:
        role = _ROLES.get(message.type)
        if role is None:
            raise ValueError(f"the local backend cannot send a '{message.type}' message")
        chat.append({"role": role, "content": message.text})
    return chat


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


def _cut(text: str, stop: Sequence[str] | None) -> str:
    for marker in stop or ():
        index = text.find(marker)
        if index >= 0:
            text = text[:index]
    return text
