"""Speaker DPO: the alternative to GRPO, one LoRA adapter per persona fitted on preference pairs.

TRL's ``DPOTrainer`` learns directly from the judged pairs (``mascot pairs``) of a persona,
with no reward model and no sampling during training. With a PEFT adapter the reference
model is the base with the adapter switched off, so no second copy is loaded. Conversational
pairs are rendered with the chat-template variables every served prompt gets
(``mascot.policies.thinking``): the prompt ends where the served generation prompt ends.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from datasets import Dataset
from transformers import TrainerCallback
from trl import DPOConfig, DPOTrainer

from mascot.policies.thinking import chat_template_kwargs
from mascot.training.fitting.adapter_folder import adapter_target
from mascot.training.fitting.lora_run import fit_lora
from mascot.training.fitting.recipe import LoraRecipe

logger = logging.getLogger(__name__)

#: The columns of a pair that DPO trains on (the rest is provenance).
PAIR_COLUMNS = ("prompt", "chosen", "rejected")


class SpeakerDPOError(ValueError):
    """Speaker DPO cannot start; the message is one line."""


@dataclass
class SpeakerDPOConfig(LoraRecipe):
    """Our knobs for speaker DPO; TRL's ``DPOConfig`` (``training``) holds the trainer's
    (``beta``, ``loss_type``, ``max_length``, ...).

    Attributes:
        personas: Persona ids to train; empty means every persona that has pairs.
        per_persona: One adapter per persona; off, one shared adapter on every persona's pairs.
        training: A ``trl.DPOConfig`` used as is, or a mapping of its fields (see
            ``trainer_args``), or ``None`` for the defaults.
    """

    trainer_config: ClassVar[type] = DPOConfig
    subject: ClassVar[str] = "speaker-dpo"
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "logging_steps": 1, "per_device_train_batch_size": 4, "num_train_epochs": 1, "max_length": 2048,
    }

    personas: list[str] = field(default_factory=list)
    per_persona: bool = True



@dataclass(frozen=True)
class DPOReport:
    """What ``train_speaker_dpo`` did: the adapter folder, the base as given, the adapter
    name, pairs trained on, optimizer steps, mean loss, the last logged preference accuracy
    (implicit reward of chosen above rejected) and wall time."""

    out: Path
    base: str
    persona: str
    pairs: int
    steps: int
    train_loss: float
    accuracy_last: float | None
    seconds: float


def train_speaker_dpo(
    pairs: Sequence[Mapping[str, Any]],
    *,
    base: str,
    persona: str,
    out: str | Path,
    config: SpeakerDPOConfig | Mapping[str, Any] | None = None,
    callbacks: Sequence[TrainerCallback] = (),
    data: str | None = None,
) -> DPOReport:
    """Fit one LoRA speaker adapter with DPO on preference pairs and save it to ``out/<persona>``.

    Args:
        pairs: Rows with TRL's ``prompt``/``chosen``/``rejected`` (``build_pairs`` makes
            them); other keys are ignored.
        base: A local model directory or a cached Hub id.
        persona: The adapter's name (a persona id, or a shared name).
        out: The adapters folder (see ``train_speaker``); checkpoints go to
            ``out/checkpoints/<persona>`` and a rerun resumes from the last.
        config: Our settings, or a mapping for ``SpeakerDPOConfig.from_dict``.
        callbacks: ``transformers`` trainer callbacks.
        data: What the pairs came from, for the card.

    Returns:
        The report; its numbers are also in the adapter card.

    Raises:
        SpeakerDPOError: on no pairs, a pair without the three columns, no chat template
            for conversational pairs, or every prompt at ``max_length`` or longer.
        AdapterFolderError: on an unusable ``out``.
    """
    if not isinstance(config, SpeakerDPOConfig):
        config = SpeakerDPOConfig.from_dict(config or {})
    if not pairs:
        raise SpeakerDPOError(f"no preference pairs for '{persona}'")
    for number, pair in enumerate(pairs):
        missing = [c for c in PAIR_COLUMNS if not pair.get(c)]
        if missing:
            raise SpeakerDPOError(f"pair {number} has no {', '.join(missing)}")
    target = adapter_target(out, persona)
    # DPOConfig has no chat_template_kwargs: TRL's DPO renders each row with its own column
    dataset = Dataset.from_list([{**{c: pair[c] for c in PAIR_COLUMNS}, "chat_template_kwargs": chat_template_kwargs()}
                                 for pair in pairs])

    def build(model: Any, tokenizer: Any, args: Any) -> DPOTrainer:
        trainer = DPOTrainer(model, args=args, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=config.lora_config(model), callbacks=list(callbacks))
        used = len(trainer.train_dataset)  # TRL drops pairs whose prompt reaches max_length
        if not used:
            raise SpeakerDPOError(f"every prompt of '{persona}' reaches max_length={args.max_length} tokens; "
                                  "raise max_length")
        if used < len(dataset):
            logger.warning("%d of %d pairs of %s have a prompt of max_length=%s tokens or more; not trained on",
                           len(dataset) - used, len(dataset), persona, args.max_length)
        return trainer

    def summary(trainer: DPOTrainer) -> dict[str, Any]:
        accuracies = [float(e["rewards/accuracies"]) for e in trainer.state.log_history if "rewards/accuracies" in e]
        return {"accuracy_last": accuracies[-1] if accuracies else None}

    run = fit_lora(base=base, target=target, method="dpo", recipe=config, build=build, summary=summary,
                   conversational=isinstance(pairs[0]["prompt"], list), error=SpeakerDPOError, data=data)
    return DPOReport(out=run.out, base=base, persona=persona, pairs=run.data_size, steps=run.steps,
                     train_loss=run.train_loss, accuracy_last=run.card["accuracy_last"], seconds=run.seconds)
