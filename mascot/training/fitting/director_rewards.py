"""The Director's reward terms: scores of the blocks of conversation its directions lead to.

``DirectorRewards`` holds one method per term, each in TRL's reward protocol
``(prompts, completions, **kwargs) -> list[float | None]`` and reading the ``context_id``
column (the decision point) and, when the directions were sampled off the trainer's process,
the ``block`` column (``DirectorRollout``); otherwise the first term called for a batch plays
its blocks with a ``BlockRollout`` and the other terms reuse them. The recipe weighs the
terms (``DirectorTrainingConfig.reward_terms``, for ``rewards.weighted_rewards``);
``fitting.director_training`` documents each term's scale.

Two helpers keep a term on a fixed scale among the G blocks of one decision point:
``standardise_by_group`` (the group reward model's logits) and ``neutral_where_unscored``
(a block a term cannot score neither gains nor loses against its siblings).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.graphs.reply import copies
from mascot.graphs.state import round_speakers
from mascot.rosters import USER, Roster
from mascot.training.data.block_rollout import Block, BlockRollout, DecisionPoint
from mascot.training.measures import redundancy, round_persona_turns, speaker_balance
from mascot.training.rewards import completion_text

#: ``direction_validity`` of each outcome of interpreting a direction.
VALIDITY_REWARD = {"valid": 0.0, "repaired": -0.5, "replaced": -1.0}
#: ``group_reward_model`` of a block with no turn; standardised scores are clipped above it.
EMPTY_BLOCK_REWARD = -2.0


class DirectorRewards:
    """The Director's reward terms over one shared set of rolled-out blocks per batch.

    TRL calls each term with the same batch; the first call plays the blocks, the others
    reuse them.

    Example:
        >>> from types import SimpleNamespace as Played  # stand-ins for a rollout and its blocks
        >>> rewards = DirectorRewards([], Played(roster=None), group_rm=None)
        >>> blocks = [Played(validity="valid"), Played(validity="repaired"), Played(validity="replaced")]
        >>> rewards.direction_validity([], ["{...}"] * 3, context_id=["p1"] * 3, block=blocks)
        [0.0, -0.5, -1.0]
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
    best value: a block would earn it for what it lacks.

    Example:
        >>> neutral_where_unscored([-0.5, None, -0.25, None], ["p1", "p1", "p1", "p2"])
        [-0.5, -0.375, -0.25, None]
    """
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

    Example:
        >>> standardise_by_group({0: 10.0, 1: 30.0, 3: 7.0}, ["p1", "p1", "p1", "p2"], 4)
        [-1.0, 1.0, -2.0, 0.0]
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
