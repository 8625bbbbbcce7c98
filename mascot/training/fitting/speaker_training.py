"""Speaker GRPO: one LoRA adapter per persona on a frozen base, trained by TRL's GRPOTrainer.

The prompts are the speaker prompts of the persona turns of rolled-out episodes, built
exactly as the speaker node builds them (``candidate_contexts``), and TRL renders them with
the chat-template variables every served prompt gets (``GRPOConfig.chat_template_kwargs``
defaults to ``mascot.policies.thinking``'s: thinking off), so the policy is trained on what
it will see in the graph. The reward is a weighted sum of TRL-protocol terms
(persona reward model, ``format_reward``, optional redundancy penalty); TRL logs each
term as ``rewards/<name>/mean`` and their weighted sum as ``reward``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig

from mascot.messages import chat_messages
from mascot.policies.thinking import chat_template_kwargs
from mascot.rosters import Roster
from mascot.training.data.candidates import candidate_contexts
from mascot.training.episodes.episode import Episode
from mascot.training.fitting.lora_run import fit_grpo
from mascot.training.fitting.recipe import LoraRecipe
from mascot.training.measures import round_persona_turns
from mascot.training.rewards import RewardFunction, roster_format_reward, round_redundancy_reward


class SpeakerTrainingError(ValueError):
    """Speaker training cannot start or save; the message is one line."""


@dataclass
class SpeakerTrainingConfig(LoraRecipe):
    """Our knobs for speaker GRPO; TRL's ``GRPOConfig`` (``training``) holds the trainer's.

    Attributes:
        personas: Persona ids to train; empty means every persona of the roster.
        per_persona: One adapter per persona (the MASCOT recipe); off, one shared adapter
            trained on every persona's prompts.
        rm_weight: Weight of the persona reward model term.
        format_weight: Weight of ``format_reward``.
        redundancy_weight: Weight of ``round_redundancy_reward`` (0 = not computed).
        training: A ``trl.GRPOConfig`` used as is, or a mapping of its fields laid over
            CPU-safe defaults (see ``trainer_args``), or ``None`` for the defaults.
    """

    trainer_config: ClassVar[type] = GRPOConfig
    subject: ClassVar[str] = "speaker-training"
    # no KL term (beta=0), logging every step, a checkpoint to resume from every 25 steps;
    # prompts rendered with the thinking setting the speakers are served with
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "beta": 0.0, "logging_steps": 1, "num_generations": 4, "per_device_train_batch_size": 8,
        "max_completion_length": 256,
        "chat_template_kwargs": chat_template_kwargs(),
    }

    personas: list[str] = field(default_factory=list)
    per_persona: bool = True
    rm_weight: float = 1.0
    format_weight: float = 0.5
    redundancy_weight: float = 0.0


    def reward_terms(
        self, roster: Roster, persona: str | None, *, reward_model: RewardFunction | None = None
    ) -> dict[str, tuple[RewardFunction, float]]:
        """The recipe's reward terms for ``persona``, for ``weighted_rewards``.

        Args:
            roster: The roster (format labels).
            persona: Persona id, or ``None`` for a shared adapter (the format reward reads
                each row's ``persona`` column).
            reward_model: The persona RM's reward function (``RewardModel.reward_function``);
                required when ``rm_weight`` is not 0.

        Raises:
            ValueError: if ``rm_weight`` is set and no reward model is given.
        """
        if self.rm_weight and reward_model is None:
            raise ValueError(f"rm_weight={self.rm_weight} needs a reward model; pass one or set rm_weight to 0")
        return {
            "reward_model": (reward_model, self.rm_weight),
            "format_reward": (roster_format_reward(roster, persona), self.format_weight),
            "redundancy_penalty": (round_redundancy_reward, self.redundancy_weight),
        }


@dataclass(frozen=True)
class SpeakerReport:
    """What ``train_speaker`` did: where the adapter is, the base as given, the persona (or
    adapter name), prompts trained on, optimizer steps, the mean (weighted) reward per
    logging step, the means of its first and last windows, and wall time."""

    out: Path
    base: str
    persona: str
    prompts: int
    steps: int
    rewards: list[float]
    reward_first: float | None
    reward_last: float | None
    seconds: float


def speaker_prompts(episodes: Sequence[Episode], roster: Roster, persona: str | None) -> Dataset:
    """The GRPO prompts of a persona: its turns in ``episodes``, as the speaker node saw them.

    Args:
        episodes: Rolled-out episodes of ``roster``.
        roster: Their roster.
        persona: Persona id, or ``None`` for every persona (one shared adapter).

    Returns:
        A dataset with a conversational ``prompt`` column (OpenAI ``role``/``content``
        dicts) and ``persona``, ``context_id`` and ``round_turns`` (the persona turns
        earlier in the round) columns, which TRL passes to the reward functions.

    Raises:
        KeyError: on a persona not in the roster (the message lists the ids).
        ValueError: if an episode is of another roster, or the persona has no turn.
    """
    if persona is not None:
        roster.persona(persona)
    rows = [
        {"prompt": chat_messages(c.prompt), "persona": c.persona, "context_id": c.context_id,
         "round_turns": round_persona_turns(c.context, roster.persona_ids)}
        for c in candidate_contexts(episodes, roster)
        if persona is None or c.persona == persona
    ]
    if not rows:
        raise ValueError(f"no turn of persona '{persona or 'any'}' with a stage direction in {len(episodes)} episodes")
    return Dataset.from_list(rows)


def train_speaker(
    dataset: Dataset,
    *,
    base: str,
    persona: str,
    out: str | Path,
    reward_funcs: Mapping[str, tuple[RewardFunction, float]] | Sequence[RewardFunction],
    config: LoraRecipe | Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    data: str | None = None,
) -> SpeakerReport:
    """Fit one LoRA speaker adapter with GRPO and save it to ``out/<persona>``.

    Args:
        dataset: From ``speaker_prompts`` (a ``prompt`` column, conversational or plain).
        base: A local model directory or a cached Hub id.
        persona: The adapter's name (a persona id, or a shared name).
        out: The adapters folder; the adapter goes to ``out/<persona>``, replaced only
            once the new one is complete.
        reward_funcs: Name -> (function, weight), see ``weighted_rewards``; or a list of
            functions weighed by ``training.reward_weights``.
        config: Our settings (a ``SpeakerTrainingConfig``, or another role's GRPO recipe),
            or a mapping for ``SpeakerTrainingConfig.from_dict``.
        callbacks: ``transformers`` trainer callbacks.
        data: What the prompts came from (e.g. the episode file), for the card.

    Checkpoints go to ``out/checkpoints/<persona>`` (``training.save_steps``); called again
    after an interruption, it resumes from the last one.

    Returns:
        The report; its numbers are also in ``out/<persona>/adapter_card.json``.

    Raises:
        LocalModelError: if the base model cannot be loaded from anywhere.
        SpeakerTrainingError: on an empty dataset or no chat template for conversational
            prompts.
        AdapterFolderError: on an unusable ``out``.
    """
    if not isinstance(config, LoraRecipe):
        config = SpeakerTrainingConfig.from_dict(config or {})
    run = fit_grpo(dataset, base=base, name=persona, out=out, reward_funcs=reward_funcs, config=config,
                   callbacks=callbacks, data=data, error=SpeakerTrainingError)
    return SpeakerReport(out=run.out, base=base, persona=persona, prompts=run.data_size, steps=run.steps,
                         rewards=run.rewards, reward_first=run.reward_first, reward_last=run.reward_last,
                         seconds=run.seconds)
