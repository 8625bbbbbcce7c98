"""Director GRPO: the Director's LoRA adapter, rewarded by what its directions lead to.

Each GRPO prompt is the Director's prompt at a decision point of a recorded episode
(``decision_points``). TRL samples G stage directions for it (``num_generations``); each
is played in the director graph for ``block_turns`` turns with the current speaker
policies (``BlockRollout``, inside the reward function), and the block is scored. So a
decision's reward is the score of the block that follows it, and GRPO's group-relative
advantage compares the G directions written for the same prefix: a direction is pushed up
exactly when the conversation it leads to scores above the other directions' at that point.

The reward terms, each logged by TRL as ``rewards/<name>/mean`` and ``/std``, weighted by
the recipe (``group_rm_weight``, ``redundancy_weight``, ``balance_weight``,
``validity_weight``, ``fullness_weight``, ``copy_weight``), each on a fixed, documented scale so a weight means the same thing
for every reward model:

- ``group_reward_model``: the group RM's logit of the block after its prefix, standardised
  within the blocks played for the same decision point in the batch (mean 0, standard
  deviation 1, clipped to [-2, 2]; all equal, or only one block, gives 0). A reward model's
  logits have no fixed scale (a model trained longer has larger ones); standardised, only
  the order and spacing of the G blocks of one prefix count, which is all GRPO's
  group-relative advantage uses. A block with no turn (the conversation ended, or the
  graph failed to play it) scores ``EMPTY_BLOCK_REWARD`` (-2, the bottom of the scale)
  explicitly. The raw logits' mean is logged as ``group_rm_logit/mean``.
- ``redundancy_penalty``: minus the mean, over the block's persona turns that follow
  another voice of their round, of each one's highest similarity to an earlier persona turn
  of the round, in [-1, 0]; not scored (``None``, left out by TRL) when no turn follows
  another voice, so a one-voice block cannot earn the term's best value.
- ``round_fullness``: the share of the round's possible turns the block played before
  handing back, minus 1, in [-1, 0]: a round cut short is never rewarded over a fuller one.
- ``action_copy``: -1 for an action that copies six or more consecutive words of the
  Director's prompt (guidance, voices, the person, an earlier reply), else 0.
- ``speaker_balance``: normalised entropy of who spoke, prefix and block together, in [0, 1].
- ``direction_validity``: 0 for a valid direction, ``-0.5`` for one the graph had to repair
  (a display name for the id, a missing tone), ``-1`` for one it replaced (no JSON, an
  unknown persona, handing back before anyone spoke). The block of a replaced direction is
  still played, with the fallback, as it would be at inference.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig

from mascot.embeddings import Embedder, default_embedder
from mascot.graphs.reply import copies
from mascot.graphs.state import round_speakers
from mascot.policies.thinking import chat_template_kwargs
from mascot.rosters import USER, Roster
from mascot.training.data.block_rollout import Block, BlockRollout, DecisionPoint
from mascot.training.fitting.recipe import LoraRecipe
from mascot.training.fitting.rewards import RewardFunction, completion_text
from mascot.training.fitting.speaker_training import fit_grpo
from mascot.training.measures import redundancy, round_persona_turns, speaker_balance

#: ``direction_validity`` of each outcome of interpreting a direction.
VALIDITY_REWARD = {"valid": 0.0, "repaired": -0.5, "replaced": -1.0}
#: ``group_reward_model`` of a block with no turn; standardised scores are clipped above it.
EMPTY_BLOCK_REWARD = -2.0


@dataclass
class DirectorTrainingConfig(LoraRecipe):
    """Our knobs for Director GRPO; TRL's ``GRPOConfig`` (``training``) holds the trainer's.

    Attributes:
        block_turns: Turns played after each sampled direction.
        max_speakers_per_round: Persona turns before the turn returns to the person.
        min_speakers_per_round: Persona turns before the Director may hand back.
        rollout_concurrency: Blocks played at once.
        group_rm_weight: Weight of the group reward model's score.
        redundancy_weight: Weight of ``redundancy_penalty``.
        balance_weight: Weight of ``speaker_balance``.
        validity_weight: Weight of ``direction_validity``.
        fullness_weight: Weight of ``round_fullness`` (a round cut short is not rewarded
            over a fuller one).
        copy_weight: Weight of ``action_copy`` (an action copied from what the Director read).
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: LoRA dropout.
        lora_target_modules: Module names to adapt, or ``"all-linear"``.
        training: A ``trl.GRPOConfig`` used as is, or a mapping of its fields (see
            ``trainer_args``), or ``None`` for the defaults.
    """

    trainer_config: ClassVar[type] = GRPOConfig
    subject: ClassVar[str] = "director-training"
    # thinking off as when served: 128 tokens must hold the JSON, not a <think> block
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "beta": 0.0, "logging_steps": 1, "num_generations": 4, "per_device_train_batch_size": 8,
        "max_completion_length": 128, "save_strategy": "steps", "save_steps": 25, "save_total_limit": 1,
        "chat_template_kwargs": chat_template_kwargs(),
    }

    block_turns: int = 3
    max_speakers_per_round: int = 3
    min_speakers_per_round: int = 1
    rollout_concurrency: int = 8
    group_rm_weight: float = 1.0
    redundancy_weight: float = 0.5
    balance_weight: float = 0.25
    validity_weight: float = 1.0
    fullness_weight: float = 0.5
    copy_weight: float = 0.5

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.block_turns < 1 or self.rollout_concurrency < 1:
            raise ValueError(f"block_turns={self.block_turns}, rollout_concurrency={self.rollout_concurrency}: "
                             "both must be at least 1")


@dataclass(frozen=True)
class DirectorReport:
    """What ``train_director`` did: where the adapter is, the base as given, decision points
    trained on, optimizer steps, the mean (weighted) reward per logging step, the means of
    its first and last quarter, the reward terms and their weights, and wall time."""

    out: Path
    base: str
    decision_points: int
    steps: int
    rewards: list[float]
    reward_first: float | None
    reward_last: float | None
    reward_terms: list[str]
    reward_weights: list[float]
    seconds: float


def director_prompts(points: Sequence[DecisionPoint]) -> Dataset:
    """The GRPO dataset of decision points: a conversational ``prompt`` and a ``context_id``
    column (TRL passes it to the reward functions, which look the point up).

    Raises:
        ValueError: on no decision points.
    """
    if not points:
        raise ValueError("no Director decision points (the episodes have no turns)")
    return Dataset.from_list([{"prompt": list(p.prompt), "context_id": p.context_id} for p in points])


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
            [blocks[i].point.chat() for i in scored], [blocks[i].turns for i in scored]) if scored else [], strict=True))
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


class _LogTerms(TrainerCallback):
    """Adds what ``DirectorRewards.logged`` measured to each log entry of the trainer."""

    def __init__(self, rewards: DirectorRewards) -> None:
        self.rewards = rewards

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        if logs is None or not any(k.startswith("rewards/") for k in logs):
            return
        measured = {k: v for k, v in self.rewards.logged.items() if v is not None}
        logs.update(measured)
        if state.log_history:  # the trainer appended its copy before calling back
            state.log_history[-1].update(measured)


def train_director(
    points: Sequence[DecisionPoint],
    *,
    base: str,
    out: str | Path,
    rollout: BlockRollout,
    group_rm: Any | None,
    config: DirectorTrainingConfig | Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    data: str | None = None,
    rollout_func: Any = None,
) -> DirectorReport:
    """Fit the Director's LoRA adapter with GRPO on block rewards and save it to ``out/director``.

    Args:
        points: Decision points (``decision_points`` of the training episodes).
        base: A local model directory or a cached Hub id.
        out: The adapters folder; checkpoints go to ``out/checkpoints/director`` and a rerun
            resumes from the last.
        rollout: Plays the sampled directions with the current speaker policies.
        group_rm: Scores blocks (``RewardModel``); ``None`` only with ``group_rm_weight: 0``.
        config: Our settings, or a mapping for ``DirectorTrainingConfig.from_dict``.
        callbacks: ``transformers`` trainer callbacks.
        data: What the episodes came from, for the card.
        rollout_func: Samples the directions and plays their blocks off the trainer's
            process (``DirectorRollout`` on a vLLM server); default: TRL samples in process
            and the reward terms play the blocks with ``rollout``.

    Returns:
        The report; its numbers are also in ``out/director/adapter_card.json``.

    Raises:
        ValueError: on no decision points, or a group RM weight without a group RM.
        AdapterFolderError: on an unusable ``out``.
    """
    if not isinstance(config, DirectorTrainingConfig):
        config = DirectorTrainingConfig.from_dict(config or {})
    rewards = DirectorRewards(points, rollout, group_rm=group_rm)
    run = fit_grpo(director_prompts(points), base=base, name="director", out=out, reward_funcs=rewards.terms(config),
                   config=config, callbacks=[_LogTerms(rewards), *callbacks], data=data, rollout_func=rollout_func)
    return DirectorReport(out=run.out, base=base, decision_points=run.data_size, steps=run.steps,
                          rewards=run.rewards, reward_first=run.reward_first, reward_last=run.reward_last,
                          reward_terms=run.card["reward_terms"], reward_weights=run.card["reward_weights"],
                          seconds=run.seconds)
