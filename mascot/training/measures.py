"""Text and round measures shared by judging, fitting, the rewards and evaluation: cosine
similarity, redundancy of a turn against its round, the persona turns of the current round,
distinct-n, speaker balance, and the description a persona is embedded as.

Similarity measures embed text with an :class:`Embedder`, by default
:func:`default_embedder` (see ``mascot.graphs.embeddings``). Evaluation's episode metrics
(``evaluation.metrics``) and the reward functions (``mascot.training.rewards``) build on these.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from mascot.graphs.embeddings import Embedder, Vector, default_embedder

if TYPE_CHECKING:
    from mascot.rosters import Persona


def cosine(a: Vector, b: Vector) -> float:
    """Cosine similarity of two vectors; 0.0 when either is all zeros."""
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def max_earlier(vectors: list[Vector]) -> list[float]:
    """Per vector, its highest cosine to an earlier one in the list (0.0 for the first)."""
    return [max((cosine(v, w) for w in vectors[:i]), default=0.0) for i, v in enumerate(vectors)]


def redundancy(turns: Sequence[str], *, embedder: Embedder | None = None) -> list[float]:
    """How much each turn repeats the turns before it in the same round.

    Args:
        turns: The persona turns of one round, in order.
        embedder: Defaults to :func:`default_embedder`.

    Returns:
        Per turn, its highest cosine similarity to an earlier turn, in [-1, 1] (1.0: a
        repeat); 0.0 for the first turn.
    """
    return max_earlier((embedder or default_embedder()).encode(turns))


def round_persona_turns(messages: Sequence[Mapping[str, Any]], persona_ids: Sequence[str]) -> list[str]:
    """The persona turns after the person's last message (OpenAI messages with ``name``)."""
    turns: list[str] = []
    for message in messages:
        if message["role"] == "user":
            turns = []
        elif message.get("name") in persona_ids:
            turns.append(message["content"])
    return turns


def distinct_n(texts: Sequence[str], n: int) -> float:
    """Distinct-n: unique n-grams over all n-grams, pooled over the texts.

    Args:
        texts: The texts; tokens are lower-cased whitespace-separated words, and n-grams
            do not cross texts.
        n: The n-gram length.

    Returns:
        A ratio in [0, 1]; 0.0 when no text has n tokens.

    Raises:
        ValueError: if ``n`` is below 1.
    """
    if n < 1:
        raise ValueError(f"n must be at least 1, got {n}")
    grams = []
    for text in texts:
        tokens = text.lower().split()
        grams += [tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1)]
    return len(set(grams)) / len(grams) if grams else 0.0


def speaker_balance(speakers: Sequence[str], roster_ids: Sequence[str]) -> float:
    """Normalised entropy of who spoke, over all of the roster's personas.

    Args:
        speakers: The persona id of each turn.
        roster_ids: The roster's persona ids.

    Returns:
        Entropy of the speaker distribution divided by ``log(len(roster_ids))``: 1.0 when
        every persona spoke equally often, 0.0 when one persona did all the talking (or
        nobody spoke). With a roster of one persona, any non-empty turn list scores 1.0.

    Raises:
        ValueError: if ``roster_ids`` is empty or repeats an id, or a speaker is not in it.
    """
    if not roster_ids or len(set(roster_ids)) != len(roster_ids):
        raise ValueError(f"roster_ids must be non-empty and unique, got {list(roster_ids)}")
    unknown = sorted(set(speakers) - set(roster_ids))
    if unknown:
        raise ValueError(f"speakers not in the roster: {', '.join(unknown)}; valid: {', '.join(roster_ids)}")
    if not speakers:
        return 0.0
    if len(roster_ids) == 1:
        return 1.0
    total = len(speakers)
    entropy = -sum(c / total * math.log(c / total) for c in Counter(speakers).values())
    return entropy / math.log(len(roster_ids))


def describe_persona(persona: Persona) -> str:
    """The text a persona is embedded as (persona identifiability, the metric judge's persona fit)."""
    # goals last: MiniLM keeps 256 word pieces, and the shipped personas run ~280 in all
    return " ".join([f"{persona.name}, {persona.role}.", persona.persona, persona.style, *persona.goals])
