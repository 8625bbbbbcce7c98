"""Training recipes: our few knobs of a LoRA training run, TRL's own config under ``training``.

Each training entrypoint has one small dataclass of ours (``RewardModelConfig``,
``SpeakerTrainingConfig``, ...) built on ``LoraRecipe``: the LoRA settings, the TRL config
dataclass of that trainer under ``training`` (used as is, or a mapping of its fields).

Recipe files and command-line flags are read by TRL's own parser (``trl.TrlParser``), as
``trl grpo --config`` reads them: one flat YAML mapping whose keys are fields of our
dataclass, of the trainer's TRL config (``GRPOConfig``, ``DPOConfig``, ``RewardConfig``)
and of ``trl.ModelConfig`` (the LoRA settings), with flags such as ``--learning_rate 1e-5``
overriding the file. ``LoraRecipe.parse`` does that; ``from_dict`` takes the Python shape
(our fields at the top, the TRL config's under ``training``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import MISSING, dataclass, field, fields, make_dataclass
from importlib import resources
from pathlib import Path
from typing import Any, ClassVar, Self, get_type_hints

import torch
import yaml
from peft import LoraConfig
from trl import ModelConfig, TrlParser

from mascot.rosters.yaml_file import read_yaml

#: The LoRA fields of a recipe, named as in ``trl.ModelConfig``.
LORA_FIELDS = ("lora_r", "lora_alpha", "lora_dropout", "lora_target_modules")
#: ``trl.ModelConfig`` fields a recipe may set besides the LoRA ones (the base model).
_MODEL_FIELDS = ("model_name_or_path", "use_peft", "lora_task_type")


@dataclass
class LoraRecipe:
    """LoRA settings and the trainer's TRL config; the base of every training config.

    Attributes:
        lora_r: LoRA rank.
        lora_alpha: LoRA scaling numerator.
        lora_dropout: LoRA dropout.
        lora_target_modules: Module names to adapt, or ``"all-linear"``.
        lora_layer_share: The share of the transformer layers, counted from the top, that
            get LoRA (``0.5``: the upper half, as PEFT's ``layers_to_transform``): backprop
            then stops halfway, and a step costs about a third less (``bench/step_cost.py``).
        init_adapter: A saved LoRA adapter folder to go on training (e.g. ``mascot
            train-sft``'s warm start) instead of a new adapter; its own rank, scaling,
            target modules and layers then replace the settings above.
        training: The trainer's TRL config used as is, or a mapping of its fields laid
            over the entrypoint's CPU-safe defaults, or ``None`` for the defaults.
    """

    #: The TRL config dataclass that ``training`` holds (e.g. ``trl.GRPOConfig``).
    trainer_config: ClassVar[type]
    #: What the recipe configures, for error messages ("speaker-training").
    subject: ClassVar[str]
    #: PEFT task type of the adapter.
    lora_task: ClassVar[str] = "CAUSAL_LM"
    #: The entrypoint's own trainer defaults, laid over the common CPU-safe ones.
    trainer_defaults: ClassVar[dict[str, Any]] = {}
    #: Every trainer's checkpoints: one every 25 steps, the last kept, so a rerun resumes.
    checkpoints: ClassVar[dict[str, Any]] = {"save_strategy": "steps", "save_steps": 25, "save_total_limit": 1}

    lora_r: int = 16
    lora_alpha: int = 32
    lora_dropout: float = 0.05
    lora_target_modules: list[str] | str = "all-linear"
    lora_layer_share: float = 1.0
    init_adapter: str | None = None
    training: Any = None

    def __post_init__(self) -> None:
        # a recipe file's values reach here unconverted: "lora_r: null" is None, not an int
        hints = get_type_hints(type(self))
        for f in fields(self):
            kind, value = hints.get(f.name), getattr(self, f.name)
            if kind in (int, float, bool, str) and not _is_a(value, kind):
                raise ValueError(f"{f.name}={value!r}: must be {'a number' if kind is float else kind.__name__}")
        if self.lora_r < 1 or self.lora_alpha <= 0:
            raise ValueError(f"lora_r={self.lora_r}, lora_alpha={self.lora_alpha}: both must be positive")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise ValueError(f"lora_dropout={self.lora_dropout}: must be in [0, 1)")
        if not 0.0 < self.lora_layer_share <= 1.0:
            raise ValueError(f"lora_layer_share={self.lora_layer_share}: must be in (0, 1] (0.5: the upper half)")
        if self.lora_layer_share < 1.0 and isinstance(self.lora_target_modules, str):
            raise ValueError(f"lora_layer_share={self.lora_layer_share} needs lora_target_modules as a list of "
                             f"names (e.g. [q_proj, v_proj]), not '{self.lora_target_modules}' (PEFT cannot place "
                             "layers in a pattern)")
        if isinstance(self.training, Mapping):
            valid = {f.name for f in fields(self.trainer_config)}
            unknown = sorted(set(self.training) - valid)
            if unknown:
                raise ValueError(
                    f"training: unknown trl.{self.trainer_config.__name__} field(s) {', '.join(unknown)}"
                )

    def lora_config(self, model: Any = None) -> LoraConfig | None:
        """The PEFT configuration of a new adapter (task ``lora_task``), or ``None`` when the
        run goes on training ``init_adapter`` (the trainer then gets the model with it).

        Args:
            model: The base model, whose ``config.num_hidden_layers`` places
                ``lora_layer_share`` (needed only when it is below 1).
        """
        if self.init_adapter:
            return None
        return LoraConfig(task_type=self.lora_task, r=self.lora_r, lora_alpha=self.lora_alpha,
                          lora_dropout=self.lora_dropout, target_modules=self.lora_target_modules,
                          layers_to_transform=self.lora_layers(model))

    def lora_layers(self, model: Any = None) -> list[int] | None:
        """The layer indices that get LoRA (the top ``lora_layer_share`` of ``model``'s), or
        ``None`` for all of them.

        Raises:
            ValueError: if the share is below 1 and ``model`` does not say its layer count.
        """
        if self.lora_layer_share >= 1.0:
            return None
        count = getattr(getattr(model, "config", None), "num_hidden_layers", None)
        if not isinstance(count, int) or count < 1:
            raise ValueError(f"lora_layer_share={self.lora_layer_share}: the base model does not say how many "
                             "layers it has (config.num_hidden_layers)")
        keep = max(1, round(count * self.lora_layer_share))
        return list(range(count - keep, count))

    def trainer_args(self, output_dir: str | Path) -> Any:
        """TRL's trainer configuration (an instance of ``trainer_config``).

        A config given as ``training`` is returned as is. Otherwise the defaults run
        anywhere: fp32 on a CPU (``use_cpu``, ``bf16=False``), bf16 on a GPU that has it,
        no gradient checkpointing, no reporting, ``checkpoints``, then ``trainer_defaults``;
        ``training`` entries override them.

        Args:
            output_dir: Where the trainer may write (unless ``training`` names a folder).
        """
        if isinstance(self.training, self.trainer_config):
            return self.training
        given = dict(self.training or {})
        given.setdefault("activation_checkpointing", given.get("gradient_checkpointing", False))
        defaults = {"output_dir": str(output_dir), **self._default_trainer_fields()}
        return self.trainer_config(**{**defaults, **given})

    def record(self, args: Any) -> dict[str, Any]:
        """Our settings and the trainer's (``args``, secrets masked by ``transformers``) as
        JSON data, for a model card."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "training"},
                "training": json.loads(args.to_json_string())}

    @classmethod
    def parse(cls, recipe: str | Path | None = None, flags: Sequence[str] = ()) -> tuple[Self, str | None]:
        """Read a recipe file and flags with TRL's parser (``trl.TrlParser``).

        The defaults are ``trainer_args``'s (CPU-safe, then the entrypoint's); the file's
        values replace them and flags (``--learning_rate 1e-5``) replace the file's.

        Args:
            recipe: A flat YAML file of our fields, the TRL config's and ``ModelConfig``'s.
            flags: ``--field value`` pairs of the same dataclasses.

        Returns:
            The config (``training`` a ready TRL config) and the recipe's
            ``model_name_or_path`` (``None`` if not set).

        Raises:
            YamlFileError: if the file cannot be read as YAML (one line naming it).
            ValueError: on an unknown key or flag, a bad value, or a ``ModelConfig`` field
                other than the LoRA ones (one line).
        """
        ours = [f for f in fields(cls) if f.name not in (*LORA_FIELDS, "training")]
        hints = get_type_hints(cls)
        knobs = make_dataclass(f"{cls.__name__}Fields", [
            (f.name, hints[f.name], field(default=f.default) if f.default is not MISSING
             else field(default_factory=f.default_factory)) for f in ours])
        parser = TrlParser((knobs, cls.trainer_config, ModelConfig))
        parser.set_defaults(**cls._default_trainer_fields(), output_dir="checkpoints", use_peft=True,
                            lora_target_modules=["all-linear"])
        parser.error = _refuse  # argparse would print the whole usage and exit
        args = ["--config", str(recipe), *flags] if recipe is not None else list(flags)
        if recipe is not None:
            read_yaml(recipe)  # bounded: TRL's parser would expand an alias bomb
        try:
            mine, trainer, model, left = parser.parse_args_and_config(args, return_remaining_strings=True)
        except (TypeError, ValueError, OSError, yaml.YAMLError) as exc:
            raise ValueError(str(exc).splitlines()[0]) from None
        if left:
            raise ValueError(f"unknown {cls.subject} setting(s) {' '.join(left)}")
        if not model.use_peft:
            raise ValueError("use_peft: false; mascot trains LoRA adapters only")
        defaults = ModelConfig()
        extra = [f.name for f in fields(ModelConfig) if f.name not in (*LORA_FIELDS, *_MODEL_FIELDS)
                 and getattr(model, f.name) != getattr(defaults, f.name)]
        if extra:
            raise ValueError(f"ModelConfig field(s) {', '.join(extra)} are not used by mascot; "
                             f"it reads {', '.join(LORA_FIELDS)} and model_name_or_path")
        targets = model.lora_target_modules
        try:
            config = cls(**{f.name: getattr(mine, f.name) for f in ours},
                         **{name: getattr(model, name) for name in LORA_FIELDS[:3]},
                         lora_target_modules=targets[0] if targets == ["all-linear"] else targets,
                         training=trainer)
        except TypeError as exc:  # a value of the wrong type that a field's check compared
            raise ValueError(f"a setting has the wrong type ({str(exc).splitlines()[0]})") from None
        return config, model.model_name_or_path

    @classmethod
    def _default_trainer_fields(cls) -> dict[str, Any]:
        gpu = torch.cuda.is_available()
        # transformers 5 renamed gradient_checkpointing (TRL defaults it to True, with a
        # deprecation warning) to activation_checkpointing, which wins when both are set
        return {"use_cpu": not gpu, "report_to": "none", "bf16": gpu and torch.cuda.is_bf16_supported(),
                "gradient_checkpointing": False, "activation_checkpointing": False,
                **cls.checkpoints, **cls.trainer_defaults}

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


def recipe_path(name: str | Path) -> Path:
    """A recipe file: ``name`` itself when it exists, else a recipe shipped in
    ``mascot/training/recipes`` (``"speakers-qwen3"`` or ``"speakers-qwen3.yaml"``).

    Raises:
        FileNotFoundError: if neither exists (the message lists the shipped recipes).
    """
    path = Path(name).expanduser()
    if path.is_file():
        return path
    shipped = resources.files("mascot.training.fitting").joinpath("recipes")
    stem = path.name.removesuffix(".yaml")
    candidate = shipped.joinpath(f"{stem}.yaml")
    if path.parent == Path(".") and candidate.is_file():
        return Path(str(candidate))
    names = sorted(p.name.removesuffix(".yaml") for p in shipped.iterdir() if p.name.endswith(".yaml"))
    raise FileNotFoundError(f"no recipe file {name}; shipped recipes: {', '.join(names)}")


def _refuse(message: str) -> None:
    raise ValueError(message)


def _is_a(value: Any, kind: type) -> bool:
    """Whether a setting's value has its field's simple type (an int is a float; a bool is
    not a number)."""
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool):
        return False
    return isinstance(value, (int, float)) if kind is float else isinstance(value, kind)
