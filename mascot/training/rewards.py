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
- The Director: the terms of ``DirectorRewards`` over the blocks its directions lead to
  (``fitting.director_training`` documents each term's scale).

This module sits on the training root floor, below episodes, judging, data and fitting, so
that the metric judge scores a reply's format with the same ``roster_format_reward`` the
speakers are trained on. The measures the terms are made of are in ``mascot.training.measures``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Protocol

from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.graphs.faults import reply_fault
from mascot.graphs.reply import copies, speaker_labels, user_labels
from mascot.graphs.state import round_speakers
from mascot.rosters import USER, Roster
from mascot.training.measures import cosine, distinct_n, redundancy, round_persona_turns, speaker_balance

if TYPE_CHECKING:  # types only: the Director's blocks are played on the data floor, above this one
    from mascot.training.data.block_rollout import Block, BlockRollout, DecisionPoint
    from mascot.training.fitting.director_training import DirectorTrainingConfig

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
#: ``direction_validity`` of each outcome of interpreting a direction.
VALIDITY_REWARD = {"valid": 0.0, "repaired": -0.5, "replaced": -1.0}
#: ``group_reward_model`` of a block with no turn; standardised scores are clipped above it.
EMPTY_BLOCK_REWARD = -2.0

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


class Scorer(Protocol):
    """What ``model_reward`` needs of a reward model: scores of replies to prompts."""

    def score(self, prompts: Sequence[Any], replies: Sequence[Any]) -> Sequence[float]: ...


def model_reward(scorer: Scorer, name: str = "reward_model") -> RewardFunction:
    """A reward function in TRL's GRPO protocol, ``(prompts, completions, **kwargs)``, that
    returns ``scorer.score(prompts, completions)`` (a trained ``RewardModel``), named ``name``
    (TRL logs the reward under its ``__name__``)."""

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
    """
    return [distinct_n([_text(c)], 2) for c in completions]


def round_redundancy_reward(prompts: Sequence[Any], completions: Sequence[Any], *, round_turns: Sequence[list[str]],
                            **kwargs: Any) -> list[float | None]:
    """TRL reward, the anti-sycophancy term: minus the reply's highest similarity to the
    other voices' turns earlier in its round (``round_turns``, a column of
    ``speaker_prompts``). Range [-1, 0] in practice. ``None`` (not scored: TRL leaves the
    term out of that row) for the round's first voice, which has nobody to repeat: a
    reply must not earn the term's best value by speaking first or alone."""
    embedder = default_embedder()
    texts = [completion_text(c) for c in completions]
    return [redundancy([*earlier, text], embedder=embedder)[-1] * -1.0 if earlier else None
            for text, earlier in zip(texts, round_turns, strict=True)]




class DirectorRewards:
    """The Director's reward terms over one shared set of rolled-out blocks per batch.

    TRL calls each term with the same batch; the first call plays the blocks, the others
    reuse them.
    """

    def __init__(
        self,
        points: Sequence[DecisionPoint],
        rollout: BlockRollout,
        *,
        group_rm: Any | None,
        embedder: Embedder | None = None,
    ) -> None:
        """Args:
            points: The decision points of the dataset (looked up by ``context_id``).
            rollout: Plays the directions.
            group_rm: Scores blocks (``RewardModel`` or anything with ``score_blocks``);
                ``None`` when its weight is 0.
            embedder: For the redundancy term; default ``default_embedder()``.
        """
        self.points = {p.context_id: p for p in points}
        self.rollout = rollout
        self.roster: Roster = rollout.roster
        self.group_rm = group_rm
        self.embedder = embedder
        self._batch: tuple[tuple[str, str], ...] = ()
        self._blocks: list[Block] = []
        #: What the last batch's terms measured beyond the terms themselves (raw RM logits).
        self.logged: dict[str, float | None] = {}

    def terms(self, config: DirectorTrainingConfig) -> dict[str, tuple[RewardFunction, float]]:
        """Name -> (reward function, weight), for ``weighted_rewards``.

        Raises:
            ValueError: if ``group_rm_weight`` is set and no group RM was given.
        """
        if config.group_rm_weight and self.group_rm is None:
            raise ValueError(f"group_rm_weight={config.group_rm_weight} needs a group reward model")
        return {
            "group_reward_model": (self.group_reward_model, config.group_rm_weight),
            "redundancy_penalty": (self.redundancy_penalty, config.redundancy_weight),
            "speaker_balance": (self.speaker_balance, config.balance_weight),
            "direction_validity": (self.direction_validity, config.validity_weight),
            "round_fullness": (self.round_fullness, config.fullness_weight),
            "action_copy": (self.action_copy, config.copy_weight),
        }

    def blocks(self, completions: Sequence[Any], context_id: Sequence[str],
               played: Sequence[Block] | None = None) -> list[Block]:
        """The blocks of a batch: those the rollout played with the directions (``played``, the
        ``block`` column of ``DirectorRollout``), else played here on the first call for it."""
        if played is not None:
            return list(played)
        texts = [completion_text(c) for c in completions]
        batch = tuple(zip(context_id, texts, strict=True))
        if batch != self._batch:
            self._blocks = self.rollout.run([self.points[i] for i in context_id], texts)
            self._batch = batch
        return self._blocks

    def group_reward_model(self, prompts: Sequence[Any], completions: Sequence[Any], *,
                           context_id: Sequence[str], **kwargs: Any) -> list[float | None]:
        """The group RM's logit of each block, standardised among the blocks of its decision
        point in the batch; ``EMPTY_BLOCK_REWARD`` for a block with no turn."""
        blocks = self.blocks(completions, context_id, kwargs.get("block"))
        scored = [i for i, b in enumerate(blocks) if b.turns]
        logits = dict(zip(scored, self.group_rm.score_blocks(
            [blocks[i].point.chat() for i in scored], [blocks[i].turns for i in scored]) if scored else [],
            strict=True))
        self.logged["group_rm_logit/mean"] = sum(logits.values()) / len(logits) if logits else None
        self.logged["empty_blocks"] = float(len(blocks) - len(logits))
        return standardise_by_group(logits, list(context_id), len(blocks))

    def redundancy_penalty(self, prompts: Sequence[Any], completions: Sequence[Any], *,
                           context_id: Sequence[str], **kwargs: Any) -> list[float | None]:
        """Minus the block's mean similarity of its persona turns to the earlier persona turns
        of their round. A block in which no turn follows another voice of its round is not
        scored: it gets the mean of the scored blocks of its decision point (0 advantage), not
        the term's best value of 0 for having nobody to repeat (``neutral_where_unscored``)."""
        embedder = self.embedder or default_embedder()
        rewards: list[float | None] = []
        for block in self.blocks(completions, context_id, kwargs.get("block")):
            values: list[float] = []
            earlier = round_persona_turns(block.point.chat(), self.roster.persona_ids)
            for turn in block.turns:
                if turn["role"] == "user":
                    earlier = []
                elif turn.get("name") in self.roster.persona_ids:
                    if earlier:
                        values.append(redundancy([*earlier, turn["content"]], embedder=embedder)[-1])
                    earlier.append(turn["content"])
            rewards.append(-sum(values) / len(values) if values else None)
        return neutral_where_unscored(rewards, list(context_id))

    def round_fullness(self, prompts: Sequence[Any], completions: Sequence[Any], *,
                       context_id: Sequence[str], **kwargs: Any) -> list[float | None]:
        """How much of the round the block filled: persona turns it played before handing
        back, over the turns it could have played (``block_turns``, the round's remaining
        turns and the voices not yet heard, whichever is least), minus 1: 0 for a full
        round, -1 for handing back at once. Handing back after one voice was what a policy
        learned when one-voice rounds scored best."""
        limit = self.rollout.max_speakers_per_round
        rewards: list[float | None] = []
        for block in self.blocks(completions, context_id, kwargs.get("block")):
            heard = set(round_speakers(list(block.point.messages)))
            possible = min(self.rollout.block_turns, limit - block.point.round_turns,
                           len(set(self.roster.persona_ids) - heard))
            played = 0
            for turn in block.turns:
                if turn["role"] == "user":
                    break
                played += turn.get("name") in self.roster.persona_ids
            rewards.append(min(1.0, played / possible) - 1.0 if possible > 0 else None)
        return rewards

    def action_copy(self, prompts: Sequence[Any], completions: Sequence[Any], *,
                    context_id: Sequence[str], **kwargs: Any) -> list[float | None]:
        """-1 for a direction whose action copies ``reply.COPY_WORDS`` consecutive words of
        the Director's prompt (its guidance, the voices' descriptions, the person, an
        earlier reply), else 0; a direction handing back is not scored (neutral, as above)."""
        rewards: list[float | None] = []
        for block in self.blocks(completions, context_id, kwargs.get("block")):
            if block.direction.speaker == USER:
                rewards.append(None)
                continue
            sources = [m["content"] for m in block.point.prompt]
            rewards.append(-1.0 if copies(block.direction.action, sources) else 0.0)
        return neutral_where_unscored(rewards, list(context_id))

    def speaker_balance(self, prompts: Sequence[Any], completions: Sequence[Any], *,
                        context_id: Sequence[str], **kwargs: Any) -> list[float | None]:
        """Normalised entropy of the persona turns of prefix and block together."""
        ids = self.roster.persona_ids
        return [speaker_balance([t["name"] for t in (*b.point.chat(), *b.turns) if t.get("name") in ids], ids)
                for b in self.blocks(completions, context_id, kwargs.get("block"))]

    def direction_validity(self, prompts: Sequence[Any], completions: Sequence[Any], *,
                           context_id: Sequence[str], **kwargs: Any) -> list[float | None]:
        """0 valid, -0.5 repaired, -1 replaced (see ``VALIDITY_REWARD``)."""
        return [VALIDITY_REWARD[b.validity] for b in self.blocks(completions, context_id, kwargs.get("block"))]

def neutral_where_unscored(values: Sequence[float | None], groups: Sequence[str]) -> list[float | None]:
    """``values`` with each ``None`` replaced by the mean of the scored values of its group
    (the decision point), so an unscored block neither gains nor loses against its siblings;
    ``None`` stays where no sibling is scored (TRL then leaves the term out of all of them).

    TRL sums the reward terms ignoring ``None`` (as 0), which for a term in [-1, 0] is its
    best value: a block would earn it for what it lacks."""
    scored: dict[str, list[float]] = {}
    for value, group in zip(values, groups, strict=True):
        if value is not None:
            scored.setdefault(group, []).append(value)
    return [value if value is not None else (sum(scored[g]) / len(scored[g]) if g in scored else None)
            for value, g in zip(values, groups, strict=True)]


def standardise_by_group(values: Mapping[int, float], groups: Sequence[str], size: int) -> list[float | None]:
    """``values[i]`` standardised among the indices of the same group (mean 0, std 1,
    clipped to [-2, 2]); an index without a value gets ``EMPTY_BLOCK_REWARD``.

    Args:
        values: Index -> raw value (the scored blocks).
        groups: Group key of every index (the decision point's ``context_id``).
        size: Number of indices.
    """
    members: dict[str, list[int]] = {}
    for i in values:
        members.setdefault(groups[i], []).append(i)
    out: list[float | None] = [EMPTY_BLOCK_REWARD] * size
    for indices in members.values():
        raw = [values[i] for i in indices]
        mean = sum(raw) / len(raw)
        std = (sum((v - mean) ** 2 for v in raw) / len(raw)) ** 0.5
        for i, v in zip(indices, raw, strict=True):
            out[i] = 0.0 if std < 1e-6 else max(-2.0, min(2.0, (v - mean) / std))
    return out
