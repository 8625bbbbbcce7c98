"""Speaker DPO: the alternative to GRPO, one LoRA adapter per persona fitted on preference pairs.

TRL's ``DPOTrainer`` learns directly from the judged pairs (``mascot pairs``) of a persona,
with no reward model and no sampling during training. With a PEFT adapter the reference
model is the base with the adapter switched off, so no second copy is loaded. Conversational
pairs are rendered with the chat-template variables every served prompt gets
(``mascot.policies.thinking``): the prompt ends where the served generation prompt ends.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import torch
from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
from trl import DPOConfig, DPOTrainer

from mascot.policies.local.model_loading import quiet_loading
from mascot.policies.model_source import resolve_model
from mascot.policies.thinking import chat_template_kwargs
from mascot.training.fitting.adapter_folder import (
    adapter_target,
    base_reference,
    checkpoint_dir,
    save_adapter,
    train_resuming,
)
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
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: LoRA dropout.
        lora_target_modules: Module names to adapt, or ``"all-linear"``.
        training: A ``trl.DPOConfig`` used as is, or a mapping of its fields (see
            ``trainer_args``), or ``None`` for the defaults.
    """

    trainer_config: ClassVar[type] = DPOConfig
    subject: ClassVar[str] = "speaker-dpo"
    trainer_defaults: ClassVar[dict[str, Any]] = {
        "logging_steps": 1, "per_device_train_batch_size": 4, "num_train_epochs": 1, "max_length": 2048,
        "save_strategy": "steps", "save_steps": 25, "save_total_limit": 1,
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
    started = time.monotonic()
    if not isinstance(config, SpeakerDPOConfig):
        config = SpeakerDPOConfig.from_dict(config or {})
    if not pairs:
        raise SpeakerDPOError(f"no preference pairs for '{persona}'")
    for number, pair in enumerate(pairs):
        missing = [c for c in PAIR_COLUMNS if not pair.get(c)]
        if missing:
            raise SpeakerDPOError(f"pair {number} has no {', '.join(missing)}")
    target = adapter_target(out, persona)
    source = resolve_model(base)
    args = config.trainer_args(checkpoint_dir(target))
    args.output_dir = str(checkpoint_dir(target))
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(source)
    if isinstance(pairs[0]["prompt"], list) and not tokenizer.chat_template:
        raise SpeakerDPOError(f"the tokenizer of {base} has no chat template; conversational pairs need one")
    # DPOConfig has no chat_template_kwargs: TRL's DPO renders each row with its own column
    dataset = Dataset.from_list([{**{c: pair[c] for c in PAIR_COLUMNS}, "chat_template_kwargs": chat_template_kwargs()}
                                 for pair in pairs])
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.bfloat16 if args.bf16 else torch.float32)
        trainer = DPOTrainer(model, args=args, train_dataset=dataset, processing_class=tokenizer,
                             peft_config=config.lora_config(), callbacks=list(callbacks))
        used = len(trainer.train_dataset)  # TRL drops pairs whose prompt reaches max_length
        if not used:
            raise SpeakerDPOError(f"every prompt of '{persona}' reaches max_length={args.max_length} tokens; "
                                  "raise max_length")
        if used < len(dataset):
            logger.warning("%d of %d pairs of %s have a prompt of max_length=%s tokens or more; not trained on",
                           len(dataset) - used, len(dataset), persona, args.max_length)
        result = train_resuming(trainer)
    accuracies = [float(e["rewards/accuracies"]) for e in trainer.state.log_history if "rewards/accuracies" in e]
    numbers = {"pairs": used, "steps": int(result.global_step), "train_loss": float(result.training_loss),
               "accuracy_last": accuracies[-1] if accuracies else None}
    seconds = round(time.monotonic() - started, 3)
    if trainer.accelerator.is_main_process:  # one writer under accelerate launch
        save_adapter(trainer.accelerator.unwrap_model(trainer.model), tokenizer, target, {
            "method": "dpo", "base": base_reference(source), "role": persona, "data": data, **numbers,
            "seconds": seconds, "recipe": config.record(args),
        })
    trainer.accelerator.wait_for_everyone()
    report = DPOReport(out=target, base=base, persona=persona, seconds=seconds, **numbers)
    logger.info("DPO adapter %s saved to %s (%d steps, loss %.3f, %.1f s)",
                persona, target, report.steps, report.train_loss, seconds)
    return report
