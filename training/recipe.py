"""Training recipes: our few knobs of a LoRA training run, TRL's own config under ``training``.

Each training entrypoint has one small dataclass of ours (``RewardModelConfig``,
``SpeakerTrainingConfig``) built on ``LoraRecipe``: the LoRA settings, the TRL config
dataclass of that trainer under ``training`` (used as is, or a mapping of its fields), and
loading from a YAML recipe with unknown keys refused.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, ClassVar, Self

import torch


@dataclass
class LoraRecipe:
    """LoRA settings and the trainer's TRL config; the base of every training config.

    Attributes:
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: LoRA dropout.
        lora_target_modules: Module names to adapt, or ``"all-linear"``.
        training: The trainer's TRL config used as is, or a mapping of its fields laid
            over the entrypoint's CPU-safe defaults, or ``None`` for the defaults.
    """

    #: The TRL config dataclass that ``training`` holds (e.g. ``trl.GRPOConfig``).
    trainer_config: ClassVar[type]
    #: What the recipe configures, for error messages ("speaker-training").
    subject: ClassVar[str]
    #: The entrypoint's own trainer defaults, laid over the common CPU-safe ones.
    trainer_defaults: ClassVar[dict[str, Any]] = {}

    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | str = "all-linear"
    training: Any = None

    def __post_init__(self) -> None:
        if self.lora_r < 1 or self.lora_alpha <= 0:
            raise ValueError(f"lora_r={self.lora_r}, lora_alpha={self.lora_alpha}: both must be positive")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout}: must be in [0, 1)")
        if isinstance(self.training, Mapping):
            valid = {f.name for f in fields(self.trainer_config)}
            unknown = sorted(set(self.training) - valid)
            if unknown:
                raise ValueError(
                    f"training: unknown trl.{self.trainer_config.__name__} field(s) {', '.join(unknown)}"
                )

    def trainer_args(self, output_dir: str | Path) -> Any:
        """TRL's trainer configuration (an instance of ``trainer_config``).

        A config given as ``training`` is returned as is. Otherwise the defaults run
        anywhere: fp32 on a CPU (``use_cpu``, ``bf16=False``), bf16 on a GPU that has it,
        no gradient checkpointing, no reporting, no checkpoints, then ``trainer_defaults``;
        ``training`` entries override them.

        Args:
            output_dir: Where the trainer may write (unless ``training`` names a folder).
        """
        if isinstance(self.training, self.trainer_config):
            return self.training
        gpu = torch.cuda.is_available()
        given = dict(self.training or {})
        # transformers 5 renamed gradient_checkpointing (TRL defaults it to True, with a
        # deprecation warning) to activation_checkpointing, which wins when both are set
        given.setdefault("activation_checkpointing", given.get("gradient_checkpointing", False))
        defaults = {"output_dir": str(output_dir), "use_cpu": not gpu, "report_to": "none",
                    "bf16": gpu and torch.cuda.is_bf16_supported(), "save_strategy": "no",
                    **self.trainer_defaults}
        return self.trainer_config(**{**defaults, **given})

    @classmethod
    def from_dict(cls, recipe: Mapping[str, Any]) -> Self:
        """Build from a YAML recipe: our fields at the top, the TRL config's under ``training``.

        Raises:
            ValueError: on an unknown key (the message lists the valid ones).
        """
        valid = [f.name for f in fields(cls)]
        unknown = sorted(set(recipe) - set(valid))
        if unknown:
            raise ValueError(f"unknown {cls.subject} setting(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
        return cls(**recipe)
