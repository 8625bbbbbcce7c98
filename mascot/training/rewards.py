"""The GRPO reward functions, in TRL's protocol, and how to weigh them.

Each function is ``(prompts, completions, **kwargs) -> list[float | None]`` with
conversational (lists of ``{role, content}`` dicts) or plain-string samples, so TRL's
``GRPOTrainer`` calls it as is and logs it under its ``__name__``
(``rewards/<name>/mean``). ``weighted_rewards`` turns a table of named terms into the
``reward_funcs`` list and the matching ``GRPOConfig.reward_weights``.

- Speakers: ``format_reward`` / ``roster_format_reward`` (one clean, in-voice turn),
  ``round_redundancy_reward`` (the anti-sycophancy term), ``model_reward`` (a trained
  reward model's scores, ``RewardModel.reward_function``).
- Any policy: ``redundancy_penalty_reward`` and ``distinct_reward``.

The Director's terms score the blocks its directions lead to, which are played on the data
floor; they are in ``fitting.director_rewards`` (``DirectorRewards``). This module sits on
the training root floor, below episodes, judging, data and fitting, so that the metric judge
scores a reply's format with the same ``roster_format_reward`` the speakers are trained on.
The measures the terms are made of are in ``mascot.training.measures``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Protocol

from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.graphs.faults import reply_fault
from mascot.graphs.reply import speaker_labels, user_labels
from mascot.rosters import Roster
from mascot.training.measures import cosine, distinct_n, redundancy

RewardFunction = Callable[..., list[float | None]]
Sample = Sequence[Mapping[str, Any]] | str

#: Default length budget of a spoken turn, in words.
MAX_WORDS = 120
#: Penalty for starting with a speaker label (own name, role or anyone's).
PREFIX_PENALTY = 0.5
#: Penalty for a line written for another speaker or the person.
OTHERS_PENALTY = 1.0
#: Penalty for going over the word budget.
LENGTH_PENALTY = 0.5
#: The reward of an empty reply (and the floor of every reply).
EMPTY_REWARD = -1.0

# A generic speaker label when no roster is given: "[anchor]", "user:", "Action Guide:",
# "**The Anchor** (validator):"; a word, then up to two capitalised words, then a colon
# ("Here is the plan:" is no label)
_ANY_LABEL = (
    r"(?:\[[^\]\n]{1,40}\]\s*:?"
    r"|[*_]{0,2}[A-Za-z][\w'-]*(?: [A-Z][\w'-]*){0,2}[*_]{0,2}\s*(?:\([^)\n]{0,60}\))?\s*[*_]{0,2}\s*:)"
)


def _label_pattern(labels: Iterable[str]) -> str:
    names = "|".join(re.escape(label) for label in sorted(set(labels), key=len, reverse=True))
    return (
        r"(?:\[(?:" + names + r")\]\s*:?"
        r"|[*_]{0,2}(?:" + names + r")[*_]{0,2}\s*(?:\([^)\n]{0,60}\))?\s*[*_]{0,2}\s*[:：])"
    )


def completion_text(completion: Sample) -> str:
    """The text of a TRL completion: a plain string as is, a conversational one as its
    assistant messages' contents joined by line breaks (what every reward reads).

    Example:
        >>> completion_text([{"role": "assistant", "content": "One."}, {"role": "assistant", "content": "Two."}])
        'One.\\nTwo.'
    """
    if isinstance(completion, str):
        return completion
    return "\n".join(m["content"] for m in completion if m.get("role", "assistant") == "assistant")


def _score(text: str, *, prefix: re.Pattern[str], others: re.Pattern[str], max_words: int, person: str = "",
           voices: Sequence[str] = ()) -> float:
    """1.0 for a clean reply, minus each penalty that applies, floored at ``EMPTY_REWARD``;
    ``EMPTY_REWARD`` for an empty reply or one with a ``reply_fault``."""
    text = text.strip()
    if not text or reply_fault(text, person=person, voices=voices):
        return EMPTY_REWARD
    reward = 1.0
    if prefix.match(text):
        reward -= PREFIX_PENALTY
    if others.search(text):
        reward -= OTHERS_PENALTY
    if len(text.split()) > max_words:
        reward -= LENGTH_PENALTY
    return max(reward, EMPTY_REWARD)


def _person(prompt: Sample) -> str:
    """The person's message a speaker prompt ends with (its last user message), or ""."""
    if isinstance(prompt, str):
        return ""
    return next((str(m.get("content", "")) for m in reversed(prompt) if m.get("role") == "user"), "")


def _scores(prompts: Sequence[Sample], completions: Sequence[Sample], round_turns: Sequence[Sequence[str]] | None,
            **pattern: Any) -> list[float | None]:
    turns = round_turns if round_turns is not None else [()] * len(completions)
    return [_score(completion_text(c), person=_person(p), voices=voices, **pattern)
            for p, c, voices in zip(prompts, completions, turns, strict=True)]


def _format_function(prefix: re.Pattern[str], others: re.Pattern[str], max_words: int) -> RewardFunction:
    def format_reward(prompts: Sequence[Sample], completions: Sequence[Sample], *,
                      round_turns: Sequence[Sequence[str]] | None = None, **kwargs: Any) -> list[float | None]:
        return _scores(prompts, completions, round_turns, prefix=prefix, others=others, max_words=max_words)

    return format_reward


def format_reward(
    prompts: Sequence[Sample],
    completions: Sequence[Sample],
    *,
    max_words: int = MAX_WORDS,
    round_turns: Sequence[Sequence[str]] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    """TRL reward: is the completion one clean, in-voice turn of reasonable length?

    Terms (summed, floored at -1.0):

    - ``+1.0`` base for a non-empty reply.
    - ``-0.5`` (``PREFIX_PENALTY``) when it starts with a speaker label, ``"Anchor:"``,
      ``"[anchor]"``, ``"**The Anchor** (validator):"``: the speaker's name is added by
      the graph, a model that writes it is continuing a transcript, not speaking.
    - ``-1.0`` (``OTHERS_PENALTY``) when a later line starts with a label: the model
      writes lines for other speakers or for the person.
    - ``-0.5`` (``LENGTH_PENALTY``) over ``max_words`` words.
    - An empty (or whitespace) reply gets ``-1.0`` (``EMPTY_REWARD``) and nothing else, and
      so does a reply with a ``graphs.faults.reply_fault``: a refusal, assistant
      help-desk talk, speaking as the person (read from the prompt's last user message), or a
      copy of an earlier voice of the round (``round_turns``) or of the person. A refusal
      is short, clean and unlike every other voice; without this it would score best.

    Without a roster a line starting with a word (plus up to two capitalised words) and a
    colon counts as labelled, ``"Note:"`` too; ``roster_format_reward`` looks for the
    roster's names and the person's labels only.

    Args:
        prompts: The speaker prompts (their last user message is the person's).
        completions: Conversational (assistant contents joined) or plain strings.
        max_words: Length budget.
        round_turns: Per row, the earlier voices' turns of the round (``speaker_prompts``'
            column); none given: no copy of a voice is looked for.
        **kwargs: Other columns TRL passes; ignored.

    Returns:
        One reward in [-1, 1] per completion.

    Example:
        >>> format_reward(["", ""], ["Have you slept on it?", "Anchor: I agree.\\nBeacon: Me too."])
        [1.0, -0.5]
    """
    prefix = re.compile(r"^\s*" + _ANY_LABEL)
    others = re.compile(r"\n[ \t]*" + _ANY_LABEL)
    return _scores(prompts, completions, round_turns, prefix=prefix, others=others, max_words=max_words)


def roster_format_reward(roster: Roster, persona: str | None, *, max_words: int = MAX_WORDS) -> RewardFunction:
    """``format_reward`` for one persona of ``roster``: labels are the roster's names only.

    A leading label of the persona itself or of anyone else is a prefix; a label of another
    persona or of the person anywhere else (a later line, or the start) is speaking for
    others. The function is named ``format_reward``. With ``persona=None`` (a shared
    adapter) each row is scored as the persona of its ``persona`` column.

    Raises:
        KeyError: if ``persona`` is not in the roster (the roster's message lists the ids).

    Example:
        >>> from mascot.rosters import load_roster
        >>> reward = roster_format_reward(load_roster("emotional_support"), "anchor")
        >>> reward(["", ""], ["That sounds heavy.", "The Anchor: That sounds heavy.\\nCatalyst: And?"])
        [1.0, -0.5]
    """
    if persona is None:
        each = {pid: roster_format_reward(roster, pid, max_words=max_words) for pid in roster.persona_ids}

        def per_row(prompts: Sequence[Sample], completions: Sequence[Sample], *, persona: Sequence[str],
                    round_turns: Sequence[Sequence[str]] | None = None, **kwargs: Any) -> list[float | None]:
            turns = round_turns if round_turns is not None else [()] * len(completions)
            return [each[p](prompts=[prompt], completions=[c], round_turns=[t])[0]
                    for prompt, c, p, t in zip(prompts, completions, persona, turns, strict=True)]

        per_row.__name__ = per_row.__qualname__ = "format_reward"
        per_row.__doc__ = format_reward.__doc__
        return per_row
    own = roster.persona(persona)
    other_labels = user_labels() + speaker_labels(
        *(label for p in roster.personas if p.id != own.id for label in (p.id, p.name))
    )
    prefix = re.compile(r"^\s*" + _label_pattern(speaker_labels(own.id, own.name) + other_labels), re.IGNORECASE)
    others = re.compile(r"(?:^|\n)[ \t]*" + _label_pattern(other_labels), re.IGNORECASE)
    function = _format_function(prefix, others, max_words)
    function.__doc__ = format_reward.__doc__
    return function


def weighted_rewards(terms: Mapping[str, tuple[RewardFunction, float]]) -> tuple[list[RewardFunction], list[float]]:
    """The ``reward_funcs`` and ``GRPOConfig.reward_weights`` for named, weighted terms.

    Each function is wrapped under its term's name, so TRL logs ``rewards/<name>/mean``
    per term; a zero-weight term is dropped (not computed).

    Args:
        terms: Name -> (reward function in TRL's protocol, weight).

    Returns:
        The functions and their weights, in the order of ``terms``.

    Raises:
        ValueError: on no terms with a non-zero weight, or a name that is not an identifier.

    Example:
        >>> terms = {"form": (format_reward, 1.0), "variety": (distinct_reward, 0.5), "off": (distinct_reward, 0.0)}
        >>> functions, weights = weighted_rewards(terms)
        >>> [f.__name__ for f in functions], weights
        (['form', 'variety'], [1.0, 0.5])
    """
    functions: list[RewardFunction] = []
    weights: list[float] = []
    for name, (function, weight) in terms.items():
        if not name.isidentifier():
            raise ValueError(f"reward term name '{name}' must be an identifier (TRL logs it as rewards/<name>)")
        if weight == 0:
            continue
        functions.append(_named(function, name))
        weights.append(float(weight))
    if not functions:
        raise ValueError(f"no reward term with a non-zero weight among {', '.join(terms) or 'none'}")
    return functions, weights


def _named(function: RewardFunction, name: str) -> RewardFunction:
    def reward(prompts: Sequence[Sample], completions: Sequence[Sample], **kwargs: Any) -> list[float | None]:
        return function(prompts=prompts, completions=completions, **kwargs)

    reward.__name__ = reward.__qualname__ = name
    reward.__doc__ = function.__doc__
    return reward


class Scorer(Protocol):
    """What ``model_reward`` needs of a reward model: scores of replies to prompts."""

    def score(self, prompts: Sequence[Any], replies: Sequence[Any]) -> Sequence[float]: ...


def model_reward(scorer: Scorer, name: str = "reward_model") -> RewardFunction:
    """A reward function in TRL's GRPO protocol, ``(prompts, completions, **kwargs)``, that
    returns ``scorer.score(prompts, completions)`` (a trained ``RewardModel``), named ``name``
    (TRL logs the reward under its ``__name__``).

    Example:
        >>> class Length:  # a stand-in for a trained RewardModel
        ...     def score(self, prompts, replies): return [float(len(r)) for r in replies]
        >>> reward = model_reward(Length(), name="length")
        >>> reward.__name__, reward(["Hi", "Hi"], ["ok", "fine"])
        ('length', [2.0, 4.0])
    """

    def reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        return list(scorer.score(prompts, completions))  # kwargs: TRL's extra columns, unused

    reward.__name__ = reward.__qualname__ = name
    return reward


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

    Example:
        >>> from mascot.graphs.embeddings import LexicalEmbedder
        >>> earlier = [{"role": "assistant", "content": "Sleep on it before you decide."}]
        >>> rewards = redundancy_penalty_reward([earlier] * 2, ["Sleep on it before you decide.",
        ...                                     "Sleep on it, then decide."], embedder=LexicalEmbedder())
        >>> [round(r, 2) for r in rewards]
        [-1.0, -0.72]
    """
    if len(prompts) != len(completions):
        raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
    earlier = [[p] if isinstance(p, str) else _assistant_texts(p) for p in prompts]
    texts = [_text(c) for c in completions]
    vectors = (embedder or default_embedder()).encode(texts + [t for ts in earlier for t in ts])
    rewards: list[float | None] = []
    start = len(texts)  # earlier turns follow the completions, prompt by prompt
    for vector, turns in zip(vectors, earlier, strict=False):
        rewards.append(-max((cosine(vector, v) for v in vectors[start : start + len(turns)]), default=0.0))
        start += len(turns)
    return rewards


def distinct_reward(prompts: Sequence[Sample], completions: Sequence[Sample], **kwargs: Any) -> list[float | None]:
    """TRL reward: distinct-2 of each completion on its own (prompts are unused).

    Range [0, 1], higher is better (fewer repeated word pairs); 0.0 under two words. Short
    completions score 1.0 easily: pair it with a reward that values content.

    Returns:
        One reward per completion (conversational or plain-string completions).

    Example:
        >>> distinct_reward(["", ""], ["one two three", "so so so so"])
        [1.0, 0.3333333333333333]
    """
    return [distinct_n([_text(c)], 2) for c in completions]


def round_redundancy_reward(prompts: Sequence[Any], completions: Sequence[Any], *, round_turns: Sequence[list[str]],
                            **kwargs: Any) -> list[float | None]:
    """TRL reward, the anti-sycophancy term: minus the reply's highest similarity to the
    other voices' turns earlier in its round (``round_turns``, a column of
    ``speaker_prompts``). Range [-1, 0] in practice. ``None`` (not scored: TRL leaves the
    term out of that row) for the round's first voice, which has nobody to repeat: a
    reply must not earn the term's best value by speaking first or alone.

    Example:
        >>> rewards = round_redundancy_reward(["", ""], ["Take a walk first.", "Take a walk first."],
        ...                                   round_turns=[[], ["Take a walk first."]])
        >>> rewards[0], round(rewards[1], 2)
        (None, -1.0)
    """
    embedder = default_embedder()
    texts = [completion_text(c) for c in completions]
    return [redundancy([*earlier, text], embedder=embedder)[-1] * -1.0 if earlier else None
            for text, earlier in zip(texts, round_turns, strict=True)]
