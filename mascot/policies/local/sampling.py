"""Per-row sampling: each row of a batch draws from its own seeded random stream.

``model.generate(do_sample=True)`` draws every row from torch's one global generator, so a
row's reply depends on which other rows share its batch and in what order; seeded calls
then had to run alone. Instead the backend decodes greedily (``do_sample=False``) with a
``RowSampler`` as the last logits processor: it applies each row's own repetition penalty,
temperature, top-k and top-p, draws the token with the row's own ``torch.Generator`` and
returns a score row that is ``-inf`` everywhere except that token, so greedy search picks
exactly the drawn token. Rows with different settings and seeds can then share a batch,
and a seeded row's reply is the same alone or in company (up to the floating-point noise
of batched matrix products).
"""

from __future__ import annotations

import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LogitsProcessor

_SEED_SPACE = 1 << 64  # torch.Generator.manual_seed takes unsigned 64-bit seeds

#: ``generate`` arguments that switch off transformers' own sampling and repetition
#: penalty: the ``RowSampler`` does both per row, after any other logits processor.
GREEDY_GENERATE: dict[str, Any] = {
    "do_sample": False,
    "temperature": None,
    "top_p": None,
    "top_k": None,
    "repetition_penalty": None,
}


@dataclass(frozen=True)
class Sampling:
    """How one row picks its next token.

    Attributes:
        temperature: Divides the scores; 0 picks the most likely token (greedy).
        top_p: Nucleus mass: the smallest set of likeliest tokens holding it; 1 = off.
        top_k: Only the ``top_k`` likeliest tokens; 0 = off.
        repetition_penalty: transformers' (CTRL) penalty on tokens already in the row;
            1 = off.
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    repetition_penalty: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be 0 (greedy) or more, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be 0 (off) or more, got {self.top_k}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be above 0 (1 = off), got {self.repetition_penalty}")


def sampling_for(
    generation_config: Any,
    *,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    repetition_penalty: float | None = None,
) -> Sampling:
    """The settings of a call: the caller's values, else the model's generation config's.

    Like vLLM, a value the caller leaves out comes from the model's
    ``generation_config.json`` (e.g. Qwen ships temperature 0.7, top_p 0.8, top_k 20,
    repetition_penalty 1.05), and one neither sets is neutral (temperature 1, no top-p,
    no top-k, no penalty).

    Args:
        generation_config: The model's ``GenerationConfig``.
        temperature: 0 decodes greedily.
        top_p: Nucleus mass.
        top_k: Likeliest tokens kept; 0 = off.
        repetition_penalty: 1 = off.

    Returns:
        The settings.

    Raises:
        ValueError: on a value out of range (the message names it).
    """

    def pick(given: Any, name: str, neutral: Any) -> Any:
        if given is not None:
            return given
        default = getattr(generation_config, name, None)
        return neutral if default is None else default

    return Sampling(
        temperature=float(pick(temperature, "temperature", 1.0)),
        top_p=float(pick(top_p, "top_p", 1.0)),
        top_k=int(pick(top_k, "top_k", 0)),
        repetition_penalty=float(pick(repetition_penalty, "repetition_penalty", 1.0)),
    )


def row_seeds(seed: int | None, rows: int) -> list[int]:
    """One seed per row of a call: ``seed + row`` (so the rows of a multi-row call differ
    and each stays reproducible), or fresh random seeds when ``seed`` is ``None``."""
    if seed is None:
        return [secrets.randbits(63) for _ in range(rows)]
    return [(seed + row) % _SEED_SPACE for row in range(rows)]


class RowSampler(LogitsProcessor):
    """Draws each row's next token with the row's own settings and random stream.

    Use it as the last logits processor of a ``do_sample=False`` generation (after any
    grammar mask) together with ``GREEDY_GENERATE``. It is stateful (the generators
    advance): make a new one per ``generate`` call.

    Args:
        settings: Sampling settings per row.
        seeds: Seed of each row's generator.
        prompt_starts: Index of each row's first real token in ``input_ids`` (the left
            padding before it is not penalised as a repetition, so a row's reply does not
            depend on how much padding its batch needed).
        device: Where the scores live (generators must be on the same device).

    Raises:
        ValueError: if the three sequences differ in length.
    """

    def __init__(
        self,
        settings: Sequence[Sampling],
        seeds: Sequence[int],
        prompt_starts: Sequence[int],
        device: torch.device | str,
    ) -> None:
        if not len(settings) == len(seeds) == len(prompt_starts):
            raise ValueError(
                f"got {len(settings)} settings, {len(seeds)} seeds and {len(prompt_starts)} prompt starts"
            )
        self.settings = list(settings)
        self.prompt_starts = list(prompt_starts)
        self.generators = [torch.Generator(device=device).manual_seed(seed) for seed in seeds]

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        """Return one-hot score rows (0 at the drawn token, ``-inf`` elsewhere)."""
        chosen = torch.empty(scores.shape[0], dtype=torch.long, device=scores.device)
        for row, setting in enumerate(self.settings):
            history = input_ids[row, self.prompt_starts[row]:]
            chosen[row] = self._draw(scores[row], history, setting, self.generators[row])
        picked = torch.full_like(scores, float("-inf"))
        picked.scatter_(1, chosen.unsqueeze(1), 0.0)
        return picked

    @staticmethod
    def _draw(scores: torch.Tensor, history: torch.Tensor, setting: Sampling, generator: torch.Generator) -> int:
        """One token for one row; the order (penalty, temperature, top-k, top-p) is
        transformers' own, so a row samples as ``do_sample=True`` would."""
        if setting.repetition_penalty != 1.0 and history.numel():
            scores = scores.clone()
            seen = scores.gather(0, history)
            penalised = torch.where(seen < 0, seen * setting.repetition_penalty, seen / setting.repetition_penalty)
            scores.scatter_(0, history, penalised)
        if setting.temperature == 0:
            return int(scores.argmax())
        scores = scores / setting.temperature
        full_vocab = scores.shape[0]
        index: torch.Tensor | None = None
        if 0 < setting.top_k < scores.shape[0]:
            scores, index = scores.topk(setting.top_k)  # sorted, likeliest first
        elif setting.top_p < 1:
            scores, index = scores.sort(descending=True)
        probs = scores.softmax(-1)
        if setting.top_p < 1:
            # keep a token while the mass before it is under top_p: the likeliest always stays
            before = probs.cumsum(-1) - probs
            probs = probs.masked_fill(before >= setting.top_p, 0.0)
        # An exponential race (argmax of p / q, q ~ Exp(1)) draws token i with probability
        # p_i, like torch.multinomial. Unlike multinomial's walk along the sorted
        # cumulative sum, where two near-equal tokens swapping places under rounding noise
        # moves every boundary after them, each token's q is drawn by token id over the
        # whole vocabulary: a draw changes only if rounding reorders the top two p/q. So a
        # row's reply survives the tiny logit differences of a different batch far more
        # often (measured on Qwen2.5-0.5B in bf16).
        noise = torch.empty(full_vocab, device=probs.device).exponential_(generator=generator)
        race = probs / (noise[index] if index is not None else noise)
        draw = race.argmax()
        return int(index[draw] if index is not None else draw)
