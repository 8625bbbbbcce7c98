"""Reward functions for speaker GRPO, in TRL's protocol, and how to weigh them.

Each function is ``(prompts, completions, **kwargs) -> list[float | None]`` with
conversational (lists of ``{role, content}`` dicts) or plain-string samples, so TRL's
``GRPOTrainer`` calls it as is and logs it under its ``__name__``
(``rewards/<name>/mean``). ``weighted_rewards`` turns a table of named terms into the
``reward_funcs`` list and the matching ``GRPOConfig.reward_weights``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from mascot.graphs.reply import speaker_labels, user_labels
from mascot.graphs.reply_faults import reply_fault
from mascot.rosters import Roster

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
    assistant messages' contents joined by line breaks (what every reward reads)."""
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
      so does a reply with a ``graphs.reply_faults.reply_fault``: a refusal, assistant
      boilerplate, speaking as the person (read from the prompt's last user message), or a
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
