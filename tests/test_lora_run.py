"""One LoRA run behind every trainer: the same card, the same resume, the same errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from transformers import AutoTokenizer, TrainerCallback

from mascot.training.fitting.lora_run import REWARD_METRICS
from mascot.training.fitting.reward_model import RewardModel, RewardModelError, train_reward_model
from mascot.training.fitting.speaker_dpo import SpeakerDPOError, train_speaker_dpo
from mascot.training.fitting.speaker_training import train_speaker

PROMPTS = [
    [{"role": "system", "content": "You are Anchor, the emotional validator."},
     {"role": "user", "content": "I failed my exam again and I am tired."}],
    [{"role": "system", "content": "You are Catalyst, the critical thinker."},
     {"role": "user", "content": "The meeting agreed to ship on Friday."}],
]
PAIRS = [{"prompt": p, "chosen": [{"role": "assistant", "content": "What would help most right now?"}],
          "rejected": [{"role": "assistant", "content": "Fine."}]} for p in PROMPTS] * 4
LORA = {"lora_r": 4, "lora_alpha": 8}
#: The fields every card has, whatever the method.
COMMON = {"format", "method", "role", "base", "thinking", "data", "data_size", "steps", "train_loss",
          "reward_metric", "rewards", "reward_first", "reward_last", "seconds", "recipe", "created_at", "versions"}


def reply_length(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
    return [float(len(str(c))) for c in completions]


@pytest.fixture(scope="module")
def cards(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, str]]:
    """A GRPO speaker, a DPO speaker and a reward model, two steps each: card and README."""
    out = tmp_path_factory.mktemp("adapters")
    train_speaker(Dataset.from_list([{"prompt": p} for p in PROMPTS]), base=str(tiny_model), persona="anchor",
                  out=out, reward_funcs={"reply_length": (reply_length, 1.0)}, data="episodes.jsonl",
                  config={**LORA, "training": {"max_steps": 2, "num_generations": 2, "per_device_train_batch_size": 2,
                                               "max_completion_length": 4, "disable_tqdm": True}})
    train_speaker_dpo(PAIRS, base=str(tiny_model), persona="beacon", out=out, data="pairs.jsonl",
                      config={**LORA, "training": {"max_steps": 2, "per_device_train_batch_size": 2,
                                                   "disable_tqdm": True}})
    train_reward_model(PAIRS, PAIRS[:2], base=str(tiny_model), out=out / "rm",
                       config={**LORA, "training": {"max_steps": 2, "disable_tqdm": True}})
    return {name: (json.loads((out / name / "adapter_card.json").read_text()), (out / name / "README.md").read_text())
            for name in ("anchor", "beacon", "rm")}


def test_every_method_writes_the_same_card(cards: dict, tiny_model: Path) -> None:
    assert {name: card["method"] for name, (card, _) in cards.items()} == {
        "anchor": "grpo", "beacon": "dpo", "rm": "reward_model"}
    for name, (card, readme) in cards.items():
        assert COMMON <= set(card), f"{name} lacks {COMMON - set(card)}"
        assert card["format"] == 2 and card["role"] == name and card["base"] == str(tiny_model.resolve())
        assert card["thinking"] is False and card["steps"] == 2
        assert card["reward_metric"] == REWARD_METRICS[card["method"]] and len(card["rewards"]) == 2
        assert card["reward_first"] == card["rewards"][0] and card["reward_last"] == card["rewards"][-1]
        assert readme.startswith(f"---\nbase_model: {card['base']}\nlibrary_name: peft\n")
        assert f"`{card['reward_metric']}` per logging step" in readme and "thinking off" in readme
    assert (cards["anchor"][0]["data_size"], cards["beacon"][0]["data_size"], cards["rm"][0]["data_size"]) == (2, 8, 8)
    assert cards["anchor"][0]["data"] == "episodes.jsonl" and cards["anchor"][0]["reward_terms"] == ["reply_length"]
    assert cards["beacon"][0]["accuracy_last"] is not None
    assert cards["rm"][0]["test_pairs"] == 2 and cards["rm"][0]["accuracy_after"] is not None


class StopAt(TrainerCallback):
    """Interrupts training at the start of a step, as a killed process would."""

    def __init__(self, step: int) -> None:
        self.step = step

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.step:
            raise KeyboardInterrupt


def test_a_reward_model_resumes_like_the_adapters(tiny_model: Path, tmp_path: Path) -> None:
    config = {**LORA, "training": {"max_steps": 4, "save_steps": 1, "disable_tqdm": True}}
    with pytest.raises(KeyboardInterrupt):
        train_reward_model(PAIRS, [], base=str(tiny_model), out=tmp_path / "rm", config=config, callbacks=[StopAt(2)])
    pending = sorted(p.name for p in (tmp_path / "checkpoints" / "rm").glob("checkpoint-*"))
    assert pending == ["checkpoint-2"] and not (tmp_path / "rm").exists()
    report = train_reward_model(PAIRS, [], base=str(tiny_model), out=tmp_path / "rm", config=config)
    card = json.loads((tmp_path / "rm" / "adapter_card.json").read_text())
    assert report.steps == 4 and len(card["rewards"]) == 4  # the first two steps' log came back with it
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rm"]  # checkpoints removed once saved
    score = RewardModel.load(tmp_path / "rm").score(["a"], ["b"])
    # a reward model saved before the common card (reward_model.json, format 1) still loads
    (tmp_path / "rm" / "adapter_card.json").unlink()
    (tmp_path / "rm" / "reward_model.json").write_text(json.dumps(
        {"format": 1, "base": card["base"], "report": {}, "lora": {"score_batch_size": 3}}))
    legacy = RewardModel.load(tmp_path / "rm")
    assert legacy.batch_size == 3 and legacy.score(["a"], ["b"]) == pytest.approx(score)


def test_missing_chat_template_is_the_trainers_one_line_error(tiny_model: Path, tmp_path: Path) -> None:
    base = tmp_path / "plain"
    shutil.copytree(tiny_model, base, ignore=shutil.ignore_patterns("adapters"))
    tokenizer = AutoTokenizer.from_pretrained(base)
    tokenizer.chat_template = None
    tokenizer.save_pretrained(base)
    (base / "chat_template.jinja").unlink(missing_ok=True)
    with pytest.raises(SpeakerDPOError, match="has no chat template; conversational rows need one"):
        train_speaker_dpo(PAIRS, base=str(base), persona="beacon", out=tmp_path / "out")
    with pytest.raises(RewardModelError, match="has no chat template"):
        train_reward_model(PAIRS, [], base=str(base), out=tmp_path / "rm")
    assert not (tmp_path / "out" / "beacon").exists() and not (tmp_path / "rm").exists()


def test_a_policy_adapter_is_no_reward_model(cards: dict, tmp_path: Path) -> None:
    folder = tmp_path / "anchor"
    folder.mkdir()
    (folder / "adapter_card.json").write_text(json.dumps(cards["anchor"][0]))
    with pytest.raises(RewardModelError, match="is not a reward model but a grpo adapter"):
        RewardModel.load(folder)


def test_lora_on_the_upper_layers_trains_those_alone(tiny_model: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from mascot.training.fitting.speaker_dpo import SpeakerDPOConfig

    train_speaker_dpo(PAIRS, base=str(tiny_model), persona="beacon", out=tmp_path, data="pairs.jsonl",
                      config={**LORA, "lora_layer_share": 0.5, "lora_target_modules": ["q_proj", "v_proj"],
                              "training": {"max_steps": 2, "per_device_train_batch_size": 2, "learning_rate": 0.05,
                                           "disable_tqdm": True}})
    config = json.loads((tmp_path / "beacon" / "adapter_config.json").read_text())
    assert config["layers_to_transform"] == [1]  # the tiny model's upper half of 2 layers
    weights = load_file(str(tmp_path / "beacon" / "adapter_model.safetensors"))
    assert weights and all(".layers.1." in name for name in weights)
    assert any(name.endswith("lora_B.weight") and float(w.abs().sum()) > 0 for name, w in weights.items())  # moved
    for share in (0.0, 1.5):
        with pytest.raises(ValueError, match=f"lora_layer_share={share}: must be in"):
            SpeakerDPOConfig(lora_layer_share=share, lora_target_modules=["q_proj"])
    with pytest.raises(ValueError, match="needs lora_target_modules as a list of names"):
        SpeakerDPOConfig(lora_layer_share=0.5)  # "all-linear"
