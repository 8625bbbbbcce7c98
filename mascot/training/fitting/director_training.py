"""Director GRPO: the Director's LoRA adapter, rewarded by what its directions lead to.

Each GRPO prompt is the Director's prompt at a decision point of a recorded episode
(``decision_points``). TRL samples G stage directions for it (``num_generations``); each
is played in the director graph for ``block_turns`` turns with the current speaker
policies (``BlockRollout``, inside the reward function), and the block is scored. So a
decision's reward is the score of the block that follows it, and GRPO's group-relative
advantage compares the G directions written for the same prefix: a direction is pushed up
exactly when the conversation it leads to scores above the other directions' at that point.

The reward terms (``fitting.director_rewards.DirectorRewards``), each logged by TRL as
``rewards/<name>/mean`` and ``/std``, weighted by the recipe (``group_rm_weight``,
``redundancy_weight``, ``balance_weight``, ``validity_weight``, ``fullness_weight``,
``copy_weight``), each on a fixed, documented scale so a weight means the same thing for
every reward model:

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

from mascot.policies.thinking import chat_template_kwargs
from mascot.training.data.block_rollout import BlockRollout, DecisionPoint
from mascot.training.fitting.director_rewards import DirectorRewards
from mascot.training.fitting.lora_run import fit_grpo
from mascot.training.fitting.recipe import LoraRecipe
from mascot.training.rewards import RewardFunction


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
        training: A ``trl.GRPOConfig`` used as is, or a mapping of its fields (see
            ``trainer_args``), or ``None`` for the defaults.
    """

    trainer_config: ClassVar[type] = GRPOConfig
    subject: ClassVar[str] = "director-training"
    # thinking off as when served: 128 tokens must hold the JSON, not a <think> block
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "beta": 0.0, "logging_steps": 1, "num_generations": 4, "per_device_train_batch_size": 8,
        "max_completion_length": 128,
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

    def reward_terms(self, rewards: DirectorRewards) -> dict[str, tuple[RewardFunction, float]]:
        """The recipe's reward terms, ``rewards``' methods with their weights, for ``weighted_rewards``.

        Raises:
            ValueError: if ``group_rm_weight`` is set and ``rewards`` has no group RM.
        """
        if self.group_rm_weight and rewards.group_rm is None:
            raise ValueError(f"group_rm_weight={self.group_rm_weight} needs a group reward model")
        return {
            "group_reward_model": (rewards.group_reward_model, self.group_rm_weight),
            "redundancy_penalty": (rewards.redundancy_penalty, self.redundancy_weight),
            "speaker_balance": (rewards.speaker_balance, self.balance_weight),
            "direction_validity": (rewards.direction_validity, self.validity_weight),
            "round_fullness": (rewards.round_fullness, self.fullness_weight),
            "action_copy": (rewards.action_copy, self.copy_weight),
        }


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
        ValueError: on no decision points, a group RM weight without a group RM, or a base
            whose tokenizer has no chat template.
        AdapterFolderError: on an unusable ``out``.
    """
    if not isinstance(config, DirectorTrainingConfig):
        config = DirectorTrainingConfig.from_dict(config or {})
    rewards = DirectorRewards(points, rollout, group_rm=group_rm)
    run = fit_grpo(director_prompts(points), base=base, name="director", out=out,
                   reward_funcs=config.reward_terms(rewards), config=config,
                   callbacks=[_LogTerms(rewards), *callbacks], data=data, error=ValueError, rollout_func=rollout_func)
    return DirectorReport(out=run.out, base=base, decision_points=run.data_size, steps=run.steps,
                          rewards=run.rewards, reward_first=run.reward_first, reward_last=run.reward_last,
                          reward_terms=run.card["reward_terms"], reward_weights=run.card["reward_weights"],
                          seconds=run.seconds)
