"""Streamed replies: one reply decoded a token at a time, the model taken per token.

``model.generate`` holds the model from the first token to the last, so a stream that ran
it would keep every batch waiting for its whole reply. A ``TextStream`` runs the decoding
loop itself instead: the prompt once, then one forward pass per token on the KV cache,
each pass taking the backend's first-come-first-served lock (``fair_lock``), so batches
queued meanwhile run between two tokens. Decoding is lazy: a token is computed when the
reader asks for more text, so a slow reader holds nothing while it reads and an abandoned
stream costs nothing more.

Each step is the step greedy ``generate`` takes: the same model inputs (full attention
mask, positions counted from 0, logits of the last position only), the float32 copy of
the last logits, the call's logits processors (grammar mask, then the per-row sampler)
and the arg-max, ending at an end-of-sequence token or the length limit. So a seeded
stream yields the reply ``generate`` gives, with the same token counts.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from typing import Any

import torch
from transformers import LogitsProcessorList

#: Runs one forward pass of the model on the given inputs (holding the model's lock) and
#: returns its output (``logits`` and ``cache``).
Forward = Callable[[Mapping[str, Any]], Any]


class TextStream(Iterator[str]):
    """The text of one reply, piece by piece; each ``next`` decodes tokens until new text.

    Iterate it from one thread at a time (it may be a different thread each time).

    Args:
        forward: One forward pass under the model's lock; it raises if the model can no
            longer serve the stream (e.g. its adapter was unloaded).
        prompt: The prompt's token ids.
        tokenizer: Decodes the reply.
        processors: The call's logits processors; stateful, one set per stream.
        max_new_tokens: Length limit of the reply.
        stop_token_ids: End-of-sequence tokens (the model's generation config's).
        device: Where the model lives.

    Attributes:
        prompt_tokens: Tokens of the prompt.
        completion_tokens: Tokens generated so far, counted as ``generate`` counts them
            (an end-of-sequence token counts, padding does not); final once the stream is
            exhausted.
    """

    def __init__(
        self,
        forward: Forward,
        prompt: Sequence[int],
        *,
        tokenizer: Any,
        processors: LogitsProcessorList,
        max_new_tokens: int,
        stop_token_ids: Collection[int],
        device: torch.device | str,
    ) -> None:
        self.prompt_tokens = len(prompt)
        self.completion_tokens = 0
        self._forward = forward
        self._tokenizer = tokenizer
        self._processors = processors
        self._max_new_tokens = max_new_tokens
        self._stop = set(stop_token_ids)
        self._ids = torch.tensor([list(prompt)], dtype=torch.long, device=device)
        self._unseen = self._ids.shape[1]  # tokens the cache does not hold yet: the prompt, then one
        self._cache: Any = None
        self._reply: list[int] = []  # generated tokens without padding, as generate's reply
        self._steps = 0
        self._sent = ""  # text already yielded
        self._done = False

    def __iter__(self) -> TextStream:
        return self

    def __next__(self) -> str:
        """The next piece of text.

        Raises:
            StopIteration: once the reply is complete.
            ValueError: if the stream's adapter was unloaded while it decoded.
        """
        while not self._done:
            try:
                self._step()
            except BaseException:
                self._finish()
                raise
            piece = self._new_text()
            if piece:
                return piece
        raise StopIteration

    def _step(self) -> None:
        total = self._ids.shape[1]
        inputs = {
            "input_ids": self._ids[:, total - self._unseen:],
            "attention_mask": torch.ones_like(self._ids),
            "position_ids": torch.arange(total - self._unseen, total, device=self._ids.device).unsqueeze(0),
            "cache": self._cache,
            "use_cache": True,
            "logits_to_keep": 1,
        }
        output = self._forward(inputs)
        self._cache = output.cache
        logits = output.logits[:, -1].to(copy=True, dtype=torch.float32)
        token = int(self._processors(self._ids, logits).argmax(-1))
        self._ids = torch.cat([self._ids, self._ids.new_tensor([[token]])], dim=1)
        self._unseen = 1
        self._steps += 1
        if token != self._tokenizer.pad_token_id:
            self._reply.append(token)
            self.completion_tokens += 1
        if token in self._stop or self._steps >= self._max_new_tokens:
            self._finish()

    def _finish(self) -> None:
        self._done = True
        self._cache = None  # the KV cache is the stream's largest state

    def _new_text(self) -> str:
        """Text decoded since the last piece; held back while it ends inside a character
        (a byte-level token can carry part of one), except at the end."""
        text = self._tokenizer.decode(self._reply, skip_special_tokens=True)
        if not self._done and (text.endswith("\ufffd") or not text.startswith(self._sent)):
            return ""
        piece, self._sent = text[len(self._sent):], text
        return piece
