"""The local in-process backend: one transformers base model, any number of LoRA adapters.

This is the only module of ``mascot.policies`` that imports torch; it needs the
``train`` extra.
"""

from __future__ import annotations

import logging
import os
import threading
import time
import warnings
from collections.abc import Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import httpx
import torch
from huggingface_hub import try_to_load_from_cache
from transformers import AutoModelForCausalLM, AutoTokenizer, TextIteratorStreamer
from transformers.utils import logging as hf_logging

from mascot.policies.spec import PolicyError

logger = logging.getLogger(__name__)

_BASE = "__base__"  # PEFT's name for "no adapter" in per-row adapter_names
_HUB_PROBE_TIMEOUT_S = 3.0


class LocalModelError(PolicyError):
    """The local model or an adapter cannot be loaded; the message says how to fix it."""


@dataclass(frozen=True)
class Generation:
    """One generated reply with its token counts."""

    text: str
    prompt_tokens: int
    completion_tokens: int


@dataclass(eq=False)
class _Request:
    """One ``generate`` call, queued until a batch serves it."""

    texts: list[str]
    adapters: list[str | None]
    max_new_tokens: int
    temperature: float
    top_p: float
    seed: int | None
    stop: Sequence[str] | None
    outcome: list[Generation] | BaseException | None = None

    @property
    def sampling(self) -> tuple[float, float] | None:
        """What the requests of one batch must share; ``None`` for a seeded request, which
        runs alone because it draws from its own random stream."""
        if self.seed is not None:
            return None
        return (0.0, 0.0) if self.temperature == 0 else (self.temperature, self.top_p)


class LocalBackend:
    """A base causal LM in memory with named LoRA adapters, shared by many roles.

    Concurrent ``generate`` calls are micro-batched. A call that finds the model idle runs
    at once; calls that arrive while a batch is generating wait in a queue, and the next
    batch takes the oldest of them together with every queued call of the same sampling
    settings (temperature, top_p), up to ``max_batch`` rows, into one ``model.generate``
    that picks the adapter per row (``adapter_names``) and runs to the longest
    ``max_new_tokens``, each reply cut to its own. Under load (the previous batch had
    several rows) a batch first waits up to ``batch_window_s`` for as many rows to queue,
    since the callers just served are usually about to ask again. Seeded calls run alone,
    so their replies do not depend on what else was asked. One lock guards the model:
    PEFT's active adapter is global state, so adapters change only between batches.
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        name: str,
        adapter_versions: Mapping[str, str | None] | None = None,
        max_batch: int = 8,
        batch_window_s: float = 0.005,
    ) -> None:
        """Wrap a loaded model; use ``LocalBackend.load`` to load one by name or path.

        Args:
            max_batch: Most rows in one ``model.generate``; 1 serves calls one at a time.
            batch_window_s: Longest wait for more calls to join a batch under load.

        Raises:
            ValueError: if ``max_batch`` < 1 or ``batch_window_s`` < 0.
        """
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1 (1 turns batching off), got {max_batch}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be 0 or more seconds, got {batch_window_s}")
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.adapter_versions = dict(adapter_versions or {})
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self._lock = threading.Lock()  # the model: one generation or adapter change at a time
        self._queue_changed = threading.Condition()  # guards the queue, the leader, outcomes
        self._queue: list[_Request] = []
        self._leader: _Request | None = None  # the queued request whose caller runs the next batch
        self._last_rows = 1
        # async callers wait here: the event loop's default pool (cores + 4 threads) can be
        # smaller than a batch, which would cap the rows that ever meet in the queue
        self.callers = ThreadPoolExecutor(max_workers=max(64, 2 * max_batch), thread_name_prefix="mascot-generate")

    @classmethod
    def load(
        cls,
        model: str,
        *,
        adapters: Mapping[str, str | Path] | None = None,
        adapter_versions: Mapping[str, str | None] | None = None,
        device: str | None = None,
        max_batch: int = 8,
        batch_window_s: float = 0.005,
    ) -> LocalBackend:
        """Load a base model (Hub id or local directory) and LoRA adapters.

        Args:
            model: A Hugging Face model id (e.g. ``Qwen/Qwen3-0.6B``) or a local directory.
            adapters: Adapter name -> PEFT adapter directory.
            adapter_versions: Adapter name -> version recorded with each reply.
            device: ``cpu``, ``cuda``, ...; defaults to CUDA when available.
            max_batch: Most rows in one ``model.generate`` (see the class); 1 disables
                batching.
            batch_window_s: Longest wait for more calls to join a batch under load.

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
        return cls(base, tokenizer, name=model, adapter_versions=versions, max_batch=max_batch,
                   batch_window_s=batch_window_s)

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
        """Generate one reply per conversation, each with its own adapter.

        The rows of one call always share a batch; concurrent calls may join it (see the
        class), which leaves greedy replies unchanged up to floating-point rounding.

        Args:
            conversations: Chat messages (``role``/``content`` dicts) per row.
            adapters: Adapter name per row (``None`` = the base model).
            max_new_tokens: Length limit per reply.
            temperature: Sampling temperature; 0 decodes greedily.
            top_p: Nucleus sampling mass.
            seed: Seeds sampling for reproducible replies; a seeded call runs alone.
            stop: Strings at which a reply is cut.
            chat_template_kwargs: Extra variables for the chat template
                (e.g. ``enable_thinking``).

        Returns:
            One generation per conversation, in order.

        Raises:
            ValueError: on an unknown adapter name or a length mismatch.
        """
        self._adapter_names(adapters, len(conversations))
        request = _Request(
            texts=self._render(conversations, chat_template_kwargs),
            adapters=list(adapters) if adapters is not None else [None] * len(conversations),
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            seed=seed,
            stop=stop,
        )
        with self._queue_changed:
            self._queue.append(request)
            if self._leader is None:  # the model is idle: start at once
                self._leader = request
            self._queue_changed.notify_all()
            try:
                while request.outcome is None and self._leader is not request:
                    self._queue_changed.wait()
            except BaseException:  # interrupted while queued: leave, passing the lead on
                self._withdraw(request)
                raise
        if request.outcome is None:
            self._lead(request)
        if isinstance(request.outcome, BaseException):
            raise request.outcome
        return request.outcome

    def _lead(self, head: _Request) -> None:
        """Run the batch of ``head``, the oldest queued request, then pass the lead on."""
        try:
            with self._lock:
                self._run(self._take_batch(head))
        finally:
            with self._queue_changed:
                self._withdraw(head)

    def _withdraw(self, request: _Request) -> None:
        """Take ``request`` out of the queue if it is still there and, if it held the lead,
        pass the lead to the oldest queued request (call with ``_queue_changed`` held)."""
        if request in self._queue:
            self._queue.remove(request)
        if self._leader is request:
            self._leader = self._queue[0] if self._queue else None
        self._queue_changed.notify_all()

    def _take_batch(self, head: _Request) -> list[_Request]:
        """``head`` and the queued requests that may share its batch, oldest first, up to
        ``max_batch`` rows; under load, first waits up to ``batch_window_s`` for as many
        rows as the previous batch had."""
        with self._queue_changed:
            deadline = time.monotonic() + self.batch_window_s
            target = min(self.max_batch, self._last_rows)
            while True:
                batch = self._mates(head)
                rows = sum(len(request.texts) for request in batch)
                left = deadline - time.monotonic()
                if rows >= target or left <= 0 or head.sampling is None:
                    break
                self._queue_changed.wait(left)
            for request in batch:
                self._queue.remove(request)
            if head.sampling is not None:
                self._last_rows = rows
        return batch

    def _mates(self, head: _Request) -> list[_Request]:
        """``head`` and, oldest first, the queued requests of its sampling settings that fit."""
        batch, rows = [head], len(head.texts)
        if head.sampling is None:
            return batch
        for request in self._queue:
            fits = rows + len(request.texts) <= self.max_batch
            if request is not head and request.sampling == head.sampling and fits:
                batch.append(request)
                rows += len(request.texts)
        return batch

    def _run(self, batch: list[_Request]) -> None:
        """One ``model.generate`` for the rows of ``batch``; each request gets its replies
        or the error, which its caller raises."""
        head = batch[0]
        outcomes: list[list[Generation] | BaseException] = [RuntimeError("the batch was interrupted")] * len(batch)
        try:
            # adapters are checked again: one may have been unloaded while the call was queued
            stale = {id(request): exc for request in batch if (exc := self._stale(request)) is not None}
            if stale:
                for request in batch:
                    if id(request) in stale:
                        request.outcome = stale[id(request)]
                batch = [request for request in batch if id(request) not in stale]
                outcomes = outcomes[: len(batch)]
                if not batch:
                    return
                head = batch[0]
            texts = [text for request in batch for text in request.texts]
            names = self._adapter_names([name for request in batch for name in request.adapters], len(texts))
            inputs = self.tokenizer(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            inputs = inputs.to(self.model.device)
            limit = max(request.max_new_tokens for request in batch)
            with torch.no_grad():
                if head.seed is not None:
                    torch.manual_seed(head.seed)
                output = self.model.generate(**inputs, **self._sampling(limit, head.temperature, head.top_p), **names)
            prompt_tokens = inputs["attention_mask"].sum(1).tolist()
            per_row = zip(output[:, inputs["input_ids"].shape[1] :].tolist(), prompt_tokens)
            replies = []
            for request in batch:
                rows = islice(per_row, len(request.texts))
                replies.append([self._reply(t[: request.max_new_tokens], p, request.stop) for t, p in rows])
            outcomes = replies
        except Exception as exc:  # raised again in the thread of every caller in the batch
            outcomes = [exc] * len(batch)
        finally:
            with self._queue_changed:
                for request, outcome in zip(batch, outcomes):
                    request.outcome = outcome
                self._queue_changed.notify_all()

    def _stale(self, request: _Request) -> ValueError | None:
        """The error of a request naming an adapter unloaded since it was queued, if any."""
        try:
            self._adapter_names(request.adapters, len(request.texts))
        except ValueError as exc:
            return exc
        return None

    def _reply(self, tokens: list[int], prompt_tokens: int, stop: Sequence[str] | None) -> Generation:
        done = [t for t in tokens if t != self.tokenizer.pad_token_id]
        text = self.tokenizer.decode(done, skip_special_tokens=True)
        return Generation(text=cut_at_stop(text, stop), prompt_tokens=prompt_tokens, completion_tokens=len(done))

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
        texts = self._render([conversation], chat_template_kwargs)
        streamer = TextIteratorStreamer(self.tokenizer, skip_prompt=True, skip_special_tokens=True)
        errors: list[BaseException] = []

        def run() -> None:
            with self._lock, torch.no_grad():
                if seed is not None:
                    torch.manual_seed(seed)
                try:
                    inputs = self.tokenizer(texts, return_tensors="pt", add_special_tokens=False).to(self.model.device)
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

    def _render(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        chat_template_kwargs: Mapping[str, Any] | None,
    ) -> list[str]:
        return [
            self.tokenizer.apply_chat_template(
                list(conversation),
                tokenize=False,
                add_generation_prompt=True,
                **(chat_template_kwargs or {}),
            )
            for conversation in conversations
        ]

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


def cut_at_stop(text: str, stop: Sequence[str] | None) -> str:
    """``text`` up to the first of the ``stop`` strings it holds."""
    for marker in stop or ():
        index = text.find(marker)
        if index >= 0:
            text = text[:index]
    return text
