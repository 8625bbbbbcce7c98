"""The local in-process backend: one transformers base model, any number of LoRA adapters.

This is the only module of ``mascot.policies`` that imports torch; it needs the
``train`` extra. Its parts live beside it: prompt encoding (``chat_encoding``), per-row
sampling (``sampling``), JSON-schema grammars (``grammar``), the micro-batcher
(``batcher``), streamed replies (``streaming``), the model's lock (``fair_lock``) and the
dtype choice (``precision``).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from itertools import islice
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import LogitsProcessorList

from mascot.policies.local.batcher import Job, MicroBatcher
from mascot.policies.local.chat_encoding import ChatEncoder, check_template_kwargs, left_pad
from mascot.policies.local.fair_lock import FairLock
from mascot.policies.local.generation import Generation, cut_at_stop
from mascot.policies.local.grammar import GrammarCache, GrammarProcessor
from mascot.policies.local.model_loading import load_model, quiet_loading
from mascot.policies.local.sampling import GREEDY_GENERATE, RowSampler, Sampling, row_seeds, sampling_for
from mascot.policies.local.streaming import Forward, TextStream
from mascot.policies.model_source import LocalModelError
from mascot.policies.thinking import chat_template_kwargs as default_template_kwargs

__all__ = ["LocalBackend"]

logger = logging.getLogger(__name__)

_BASE = "__base__"  # PEFT's name for "no adapter" in per-row adapter_names


@dataclass(frozen=True)
class _Call:
    """One ``generate`` call, ready for a batch: prompt ids and settings per row."""

    prompts: list[list[int]]
    adapters: list[str | None]
    max_new_tokens: int
    sampling: Sampling
    seeds: list[int]
    grammar: Any  # an xgrammar CompiledGrammar, or None
    stop: Sequence[str] | None


class LocalBackend:
    """A base causal LM in memory with named LoRA adapters, shared by many roles.

    Concurrent ``generate`` calls are micro-batched (see ``batcher.MicroBatcher``), up to
    ``max_batch`` rows in one ``model.generate`` that picks the adapter per row
    (``adapter_names``) and runs to the longest ``max_new_tokens``, each reply cut to its
    own. Any calls may share a batch: every row samples with its own settings and its own
    random stream (see ``sampling.RowSampler``) and follows its own grammar or none, so a
    seeded reply does not depend on what else was asked. Prompts are encoded so that
    message text never becomes a control token (see ``chat_encoding``). A stream decodes
    outside the batches, one token per turn on the model (see ``streaming``), so batches
    run between its tokens. One first-come-first-served lock guards the model: PEFT's
    active adapter is global state, so adapters change only between batches and stream
    steps.
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
        self.model = model
        self.tokenizer = tokenizer
        self.name = name
        self.adapter_versions = dict(adapter_versions or {})
        self._lock = FairLock()  # the model: one batch, stream step or adapter change at a time
        self.batcher: MicroBatcher[_Call] = MicroBatcher(self._run, self._lock, max_batch=max_batch,
                                                         batch_window_s=batch_window_s)
        self.encoder = ChatEncoder(tokenizer)
        eos = model.generation_config.eos_token_id
        # generate stops at the generation config's end tokens only; a stream does the same
        self.stop_token_ids: list[int] = [] if eos is None else eos if isinstance(eos, list) else [eos]
        self.grammars = GrammarCache(tokenizer, vocab_size=model.config.vocab_size,
                                     stop_token_ids=self.stop_token_ids or [tokenizer.eos_token_id])
        # async callers wait here: the event loop's default pool (cores + 4 threads) can be
        # smaller than a batch, which would cap the rows that ever meet in the queue
        self.callers = ThreadPoolExecutor(max_workers=max(64, 2 * max_batch), thread_name_prefix="mascot-generate")

    @property
    def max_batch(self) -> int:
        """Most rows in one ``model.generate`` (settable; 1 serves calls one at a time)."""
        return self.batcher.max_batch

    @max_batch.setter
    def max_batch(self, rows: int) -> None:
        self.batcher.max_batch = rows

    @classmethod
    def load(
        cls,
        model: str,
        *,
        adapters: Mapping[str, str | Path] | None = None,
        adapter_versions: Mapping[str, str | None] | None = None,
        device: str | None = None,
        dtype: str | None = None,
        max_batch: int = 8,
        batch_window_s: float = 0.005,
    ) -> LocalBackend:
        """Load a base model (Hub id or local directory) and LoRA adapters.

        Args:
            model: A Hugging Face model id (e.g. ``Qwen/Qwen3-0.6B``) or a local directory.
            adapters: Adapter name -> PEFT adapter directory.
            adapter_versions: Adapter name -> version recorded with each reply.
            device: ``cpu``, ``cuda``, ...; defaults to CUDA when available.
            dtype: ``None`` picks bfloat16 where the device computes it natively and
                float32 elsewhere (``precision.default_dtype``); or one of
                ``precision.DTYPES`` (``auto`` = the model config's dtype).
            max_batch: Most rows in one ``model.generate`` (see the class); 1 disables
                batching.
            batch_window_s: Longest wait for more calls to join a batch under load.

        Returns:
            The backend.

        Raises:
            LocalModelError: if the model is neither a local directory nor reachable
                (offline, not cached), has no chat template, or an adapter is missing.
            ValueError: on an unknown ``dtype`` name.
        """
        base, tokenizer = load_model(model, adapters=adapters, device=device, dtype=dtype)
        versions = {name: (adapter_versions or {}).get(name) for name in adapters or {}}
        return cls(base, tokenizer, name=model, adapter_versions=versions, max_batch=max_batch,
                   batch_window_s=batch_window_s)

    def load_adapter(self, name: str, path: str | Path, *, version: str | None = None) -> None:
        """Load the PEFT adapter ``name`` from ``path`` while serving; waits for the batch
        or stream step in progress.

        A name already loaded is refused, as vLLM refuses it: a request that started on
        one version must not finish on another, so a new version is unloaded and loaded
        (``serving.reload_adapters`` does).

        Raises:
            ValueError: if an adapter of that name is already loaded.
            LocalModelError: if ``path`` holds no PEFT adapter or it does not fit the base.
        """
        if not Path(path, "adapter_config.json").is_file():
            raise LocalModelError(f"adapter '{name}': no PEFT adapter at {path} (adapter_config.json missing)")
        from peft import PeftModel

        with self._lock, quiet_loading():
            if name in self.adapter_versions:  # checked under the lock: two loads may race
                raise ValueError(f"adapter '{name}' is already loaded; unload it first")
            try:
                if not isinstance(self.model, PeftModel):
                    self.model = PeftModel.from_pretrained(self.model, str(path), adapter_name=name)
                else:
                    self.model.load_adapter(str(path), adapter_name=name)
            except (ValueError, KeyError, RuntimeError, OSError, SafetensorError) as exc:
                if isinstance(self.model, PeftModel) and name in self.model.peft_config:
                    self.model.delete_adapter(name)  # PEFT keeps a half-loaded adapter's layers
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
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        stop: Sequence[str] | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        json_schema: Mapping[str, Any] | None = None,
    ) -> list[Generation]:
        """Generate one reply per conversation, each with its own adapter.

        The rows of one call always share a batch; concurrent calls may join it (see the
        class), which leaves each reply unchanged up to floating-point rounding.

        Args:
            conversations: Chat messages (``role``/``content`` dicts) per row.
            adapters: Adapter name per row (``None`` = the base model).
            max_new_tokens: Length limit per reply.
            temperature: Sampling temperature; 0 decodes greedily. ``None`` (like
                ``top_p``, ``top_k`` and ``repetition_penalty``) takes the model's
                generation config's value (see ``sampling.sampling_for``).
            top_p: Nucleus sampling mass.
            top_k: Likeliest tokens kept; 0 = off.
            repetition_penalty: Penalty on tokens already in the row; 1 = off.
            seed: Seeds row ``i``'s random stream with ``seed + i``, for reproducible
                replies; ``None`` draws fresh seeds.
            stop: Strings at which a reply is cut.
            chat_template_kwargs: Chat-template variables; ``None`` = mascot's one
                setting (``thinking.chat_template_kwargs()``).
            json_schema: Constrain every reply to JSON valid under this schema (needs
                xgrammar; compiled once per schema). A reply cut by ``max_new_tokens`` is
                incomplete JSON.

        Returns:
            One generation per conversation, in order.

        Raises:
            ValueError: on no conversations, an unknown adapter name, a length mismatch or
                a sampling value out of range.
            PromptError: if the chat template rejects a conversation or a variable.
            GrammarError: if the schema cannot be compiled.
            ImportError: for a schema when xgrammar is not installed.
        """
        call = self._prepare(conversations, adapters, max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty, seed=seed, stop=stop,
                             chat_template_kwargs=chat_template_kwargs, json_schema=json_schema)
        return self.batcher.submit(call, rows=len(call.prompts))

    def _prepare(
        self,
        conversations: Sequence[Sequence[Mapping[str, str]]],
        adapters: Sequence[str | None] | None,
        *,
        max_new_tokens: int,
        seed: int | None,
        stop: Sequence[str] | None,
        chat_template_kwargs: Mapping[str, Any] | None,
        json_schema: Mapping[str, Any] | None,
        **sampling: Any,
    ) -> _Call:
        """Check a call's arguments and encode its prompts (in the caller's thread)."""
        if not conversations:  # an empty call would fail the whole batch it joined
            raise ValueError("generate needs at least one conversation")
        self._adapter_names(adapters, len(conversations))
        variables = default_template_kwargs() if chat_template_kwargs is None else chat_template_kwargs
        variables = check_template_kwargs(variables)
        return _Call(
            prompts=[self.encoder.encode(conversation, variables) for conversation in conversations],
            adapters=list(adapters) if adapters is not None else [None] * len(conversations),
            max_new_tokens=max_new_tokens,
            sampling=sampling_for(self.model.generation_config, **sampling),
            seeds=row_seeds(seed, len(conversations)),
            grammar=self.grammars.compile(json_schema) if json_schema is not None else None,
            stop=stop,
        )

    def _run(self, batch: list[Job[_Call]]) -> list[list[Generation] | BaseException]:
        """One ``model.generate`` for the rows of ``batch`` (the batcher holds the lock);
        a request naming an adapter unloaded since it was queued gets its own error."""
        outcomes: list[list[Generation] | BaseException | None] = [self._stale(job.payload) for job in batch]
        calls = [job.payload for job, outcome in zip(batch, outcomes, strict=False) if outcome is None]
        if calls:
            replies = iter(self._generate_rows(calls))
            outcomes = [next(replies) if outcome is None else outcome for outcome in outcomes]
        return outcomes  # type: ignore[return-value]  # every None was replaced

    def _generate_rows(self, calls: list[_Call]) -> list[list[Generation]]:
        prompts = [prompt for call in calls for prompt in call.prompts]
        names = self._adapter_names([name for call in calls for name in call.adapters], len(prompts))
        inputs = left_pad(prompts, self.tokenizer.pad_token_id, self.model.device)
        width = inputs["input_ids"].shape[1]
        processors = self._processors(
            [call.sampling for call in calls for _ in call.prompts],
            [seed for call in calls for seed in call.seeds],
            [call.grammar for call in calls for _ in call.prompts],
            [width - len(prompt) for prompt in prompts],
        )
        decoding = {"max_new_tokens": max(call.max_new_tokens for call in calls),
                    "pad_token_id": self.tokenizer.pad_token_id, **GREEDY_GENERATE}
        with torch.no_grad():
            output = self.model.generate(**inputs, **decoding, logits_processor=processors, **names)
        per_row = iter(zip(output[:, width:].tolist(), (len(prompt) for prompt in prompts), strict=False))
        return [[self._reply(tokens[: call.max_new_tokens], prompt_tokens, call.stop)
                 for tokens, prompt_tokens in islice(per_row, len(call.prompts))] for call in calls]

    def _processors(self, settings: list[Sampling], seeds: list[int], grammars: list[Any],
                    starts: list[int]) -> LogitsProcessorList:
        """The grammar mask (if any row has a grammar), then the per-row sampler, which
        must come last: it turns each score row into the one token it drew."""
        processors = LogitsProcessorList()
        if any(grammar is not None for grammar in grammars):
            processors.append(GrammarProcessor(grammars))
        processors.append(RowSampler(settings, seeds, starts, self.model.device))
        return processors

    def _stale(self, call: _Call) -> ValueError | None:
        """The error of a call naming an adapter unloaded since it was queued, if any."""
        try:
            self._adapter_names(call.adapters, len(call.prompts))
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
        temperature: float | None = None,
        top_p: float | None = None,
        top_k: int | None = None,
        repetition_penalty: float | None = None,
        seed: int | None = None,
        chat_template_kwargs: Mapping[str, Any] | None = None,
        json_schema: Mapping[str, Any] | None = None,
    ) -> TextStream:
        """Generate one reply and yield its text piece by piece, decoded as it is read.

        Encoding, sampling and grammar are those of ``generate``, so a seeded stream
        yields the reply and the token counts ``generate`` gives. Each token holds the
        model for one forward pass (see ``streaming``): batches run in between.

        Args: as for ``generate``, for one conversation.

        Returns:
            The pieces (joined: the reply), with ``prompt_tokens`` and ``completion_tokens``;
            it raises ``ValueError`` if its adapter is unloaded before the end.

        Raises:
            as ``generate``, at the call, before any piece.
        """
        call = self._prepare([conversation], [adapter], max_new_tokens=max_new_tokens, temperature=temperature,
                             top_p=top_p, top_k=top_k, repetition_penalty=repetition_penalty, seed=seed, stop=None,
                             chat_template_kwargs=chat_template_kwargs, json_schema=json_schema)
        return TextStream(self._stream_forward(adapter), call.prompts[0], tokenizer=self.tokenizer,
                          processors=self._processors([call.sampling], call.seeds, [call.grammar], [0]),
                          max_new_tokens=call.max_new_tokens, stop_token_ids=self.stop_token_ids,
                          device=self.model.device)

    def first_token_logprobs(
        self,
        conversation: Sequence[Mapping[str, str]],
        *,
        adapter: str | None = None,
        top: int = 20,
        chat_template_kwargs: Mapping[str, Any] | None = None,
    ) -> list[tuple[str, float]]:
        """The ``top`` likeliest first tokens of a reply to ``conversation`` with their
        log-probabilities, likeliest first (one forward pass): what an OpenAI-compatible
        server reports as ``top_logprobs`` of a reply's first token.

        Raises:
            ValueError: on an unknown adapter or ``top`` < 1.
            PromptError: if the chat template rejects the conversation.
        """
        if top < 1:
            raise ValueError(f"top must be >= 1, got {top}")
        self._adapter_names([adapter], 1)
        variables = check_template_kwargs(default_template_kwargs() if chat_template_kwargs is None
                                          else chat_template_kwargs)
        prompt = self.encoder.encode(conversation, variables)
        logits = self._stream_forward(adapter)({"input_ids": torch.tensor([prompt], device=self.model.device)}).logits
        values, ids = torch.log_softmax(logits[0, -1].float(), dim=-1).topk(min(top, logits.shape[-1]))
        return [(self.tokenizer.decode([i]), v) for i, v in zip(ids.tolist(), values.tolist(), strict=True)]

    def _stream_forward(self, adapter: str | None) -> Forward:
        """One forward pass of a stream on ``adapter``, under the lock; it refuses to go on
        once the adapter was unloaded (or unloaded and loaded again: other weights)."""
        loaded: list[Any] = []  # the adapter's PEFT config at the first step: a new load makes a new one

        def forward(inputs: Mapping[str, Any]) -> Any:
            with self._lock, torch.no_grad():  # no_grad is per thread: taken for each step
                names = self._adapter_names([adapter], 1)
                if adapter is not None:
                    if not loaded:
                        loaded.append(self.model.peft_config[adapter])
                    if self.model.peft_config[adapter] is not loaded[0]:
                        raise ValueError(f"adapter {adapter} was reloaded while a reply streamed from it")
                return self.model(**inputs, **names)

        return forward

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

