"""The shipped training recipes, read by TRL's parser exactly as the commands read them."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

import pytest
import torch
import yaml

from mascot.training.fitting.director_training import DirectorTrainingConfig
from mascot.training.fitting.recipe import recipe_path
from mascot.training.fitting.reward_model import RewardModelConfig
from mascot.training.fitting.speaker_dpo import SpeakerDPOConfig
from mascot.training.fitting.speaker_training import SpeakerTrainingConfig

SHIPPED = sorted(p.name.removesuffix(".yaml")
                 for p in resources.files("mascot.training.fitting").joinpath("recipes").iterdir()
                 if p.name.endswith(".yaml"))
# a GPU recipe asks for bf16; on a CPU the same flags a user would give turn it off
ON_CPU = [] if torch.cuda.is_available() else ["--bf16", "false", "--use_cpu", "true"]


def config_class(name: str) -> type:
    if name.startswith("speakers-dpo"):
        return SpeakerDPOConfig
    return SpeakerTrainingConfig if name.startswith("speakers") else DirectorTrainingConfig


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "accelerate-multi-gpu"])
def test_shipped_recipes_parse(name: str) -> None:
    config, model = config_class(name).parse(recipe_path(name), [] if "cpu" in name else ON_CPU)
    raw = yaml.safe_load(recipe_path(name).read_text())
    assert config.lora_r == raw["lora_r"] and config.training.learning_rate == raw["learning_rate"]
    if "qwen3" in name:
        assert model == "Qwen/Qwen3-0.6B" and config.lora_r == 16
        assert config.lora_target_modules == ["q_proj", "k_proj", "v_proj", "o_proj"]
        assert config.training.num_generations == 8 and config.training.beta == 0.04
        assert config.training.use_vllm == ("multi-gpu" in name)
    else:
        assert model is None and config.training.use_cpu == (not torch.cuda.is_available())


def test_accelerate_config_is_multi_gpu() -> None:
    config = yaml.safe_load(recipe_path("accelerate-multi-gpu").read_text())
    assert config["distributed_type"] == "MULTI_GPU" and config["mixed_precision"] == "bf16"


def test_flags_override_the_file_and_defaults_fill_the_rest(tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text("lora_r: 4\nlearning_rate: 0.001\nblock_turns: 2\n")
    config, model = DirectorTrainingConfig.parse(recipe, ["--learning_rate", "0.01", "--lora_target_modules",
                                                          "q_proj", "v_proj"])
    assert (config.lora_r, config.block_turns, config.training.learning_rate) == (4, 2, 0.01)
    assert config.lora_target_modules == ["q_proj", "v_proj"] and model is None
    # the entrypoint's defaults (TRL's own are 8 generations, 512 tokens)
    assert (config.training.num_generations, config.training.max_completion_length) == (4, 128)
    assert config.training.save_steps == 25 and config.training.report_to == []


@pytest.mark.parametrize(("text", "flags", "message"), [
    ("lora_rank: 4\n", [], "unknown reward-model setting.s. --lora_rank 4"),
    ("seed: 0\n", ["--lora_r", "x"], "argument --lora_r"),
    ("seed: 0\n", ["--load_in_4bit", "true"], "load_in_4bit are not used"),
    ("seed: 0\n", ["--use_peft", "false"], "LoRA adapters only"),
    ("lora_r: [4\n", [], "r.yaml:2: malformed YAML"),
    ("- a list\n", [], "must contain a YAML mapping"),
])
def test_bad_recipes_fail_in_one_line(text: str, flags: list[str], message: str, tmp_path: Path) -> None:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(text)
    with pytest.raises(ValueError, match=message) as error:
        RewardModelConfig.parse(recipe, flags)
    assert "\n" not in str(error.value)


def test_unknown_recipe_name_lists_the_shipped_ones() -> None:
    with pytest.raises(FileNotFoundError, match="shipped recipes: accelerate-multi-gpu, director-cpu-smoke"):
        recipe_path("no-such-recipe")
