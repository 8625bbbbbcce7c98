"""One thinking setting wherever training renders a prompt (``mascot.policies.thinking``).

Each test captures the token ids TRL (or the reward model) really feeds the model, and
checks them against the tokenizer's rendering with ``chat_template_kwargs()``; each also
checks that the template's default rendering differs, so a path that drops the setting fails.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
from datasets import Dataset
from transformers import AutoTokenizer
from trl import DPOTrainer, GRPOTrainer, RewardTrainer

from mascot.policies.thinking import chat_template_kwargs
from mascot.testing.tiny_model import CHAT_TEMPLATE
from mascot.training.fitting import reward_model, speaker_dpo
from mascot.training.fitting.director_training import DirectorTrainingConfig
from mascot.training.fitting.reward_model import RewardModel, train_reward_model
from mascot.training.fitting.speaker_dpo import train_speaker_dpo
from mascot.training.fitting.speaker_training import SpeakerTrainingConfig, train_speaker

THINK_OFF = chat_template_kwargs()
EMPTY_THINK = "<think>\n\n</think>\n\n"
PROMPTS = [
    [{"role": "system", "content": "You are Anchor, the emotional validator."},
     {"role": "user", "content": "I failed my exam again and I am tired."}],
    [{"role": "system", "content": "You are Catalyst, the critical thinker."},
     {"role": "user", "content": "The meeting agreed to ship on Friday."},
     {"role": "assistant", "content": "What are the risks?"},
     {"role": "user", "content": "Budget and owners."}],
]
PAIRS = [{"prompt": p, "chosen": [{"role": "assistant", "content": "What would help most right now?"}],
          "rejected": [{"role": "assistant", "content": "Fine."}]} for p in PROMPTS]
# As SmolLM3's template does, this one writes the switch into the system message: thinking
# changes whole conversations, not only the generation prompt (Qwen3's does not, so with
# the tiny model's template a reward model's sequences are the same either way).
SYSTEM_SWITCH_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n"
    "{% if loop.first and message['role'] == 'system' %}"
    "{% if enable_thinking is defined and enable_thinking is false %}/no_think{% else %}/think{% endif %}\n"
    "{% endif %}{{ message['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def render(tokenizer: Any, messages: list[dict[str, str]], **kwargs: Any) -> list[int]:
    return list(tokenizer.apply_chat_template(messages, tokenize=True, return_dict=True, **kwargs)["input_ids"])


def recording(trainer_class: type, trainers: list) -> type:
    """A subclass of a TRL trainer that keeps each instance (its processed ``train_dataset``)."""

    class Recording(trainer_class):
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            trainers.append(self)

    return Recording


def test_tiny_template_has_qwen3s_switch(tiny_model: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    prompt, reply = PAIRS[0]["prompt"], PAIRS[0]["chosen"]
    off = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True, **THINK_OFF)
    default = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
    assert off == default + EMPTY_THINK and default.endswith("<|im_start|>assistant\n")
    assert tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True,
                                         enable_thinking=True) == default
    # a reply that ends the conversation opens with the empty block, thinking off or not (as in
    # Qwen3): the prompt rendered alone is then a prefix of the prompt with its reply
    full = render(tokenizer, prompt + reply, **THINK_OFF)
    assert full[: len(render(tokenizer, prompt, add_generation_prompt=True, **THINK_OFF))] == \
        render(tokenizer, prompt, add_generation_prompt=True, **THINK_OFF)
    assert render(tokenizer, prompt + reply) == full
    assert "<|im_start|>assistant\nWhat are" in tokenizer.apply_chat_template(PROMPTS[1], tokenize=False)
    # the markers are one token each and survive decoding without special tokens, as Qwen3's
    ids = tokenizer.convert_tokens_to_ids(["<think>", "</think>"])
    assert len(set(ids)) == 2 and tokenizer.unk_token_id not in ids
    assert tokenizer.decode(render(tokenizer, prompt, add_generation_prompt=True, **THINK_OFF),
                            skip_special_tokens=True).endswith(EMPTY_THINK)
    assert tokenizer.chat_template == CHAT_TEMPLATE


@pytest.mark.parametrize("config_class", [SpeakerTrainingConfig, DirectorTrainingConfig])
def test_grpo_generates_from_prompts_rendered_with_the_setting(
    config_class: type, tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen: list[list[int]] = []
    generate = GRPOTrainer._generate_single_turn

    def spy(self: GRPOTrainer, prompt_ids: list[list[int]], *args: Any, **kwargs: Any) -> Any:
        seen.extend(list(ids) for ids in prompt_ids)
        return generate(self, prompt_ids, *args, **kwargs)

    monkeypatch.setattr(GRPOTrainer, "_generate_single_turn", spy)

    def constant(prompts: list, completions: list, **kwargs: Any) -> list[float | None]:
        return [0.0] * len(prompts)

    config = config_class.from_dict({"lora_r": 4, "lora_alpha": 8, "training": {
        "max_steps": 1, "num_generations": 2, "per_device_train_batch_size": 4, "max_completion_length": 4,
        "save_strategy": "no", "disable_tqdm": True}})
    train_speaker(Dataset.from_list([{"prompt": p} for p in PROMPTS]), base=str(tiny_model), persona="probe",
                  out=tmp_path, reward_funcs={"constant": (constant, 1.0)}, config=config)
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    wanted = {tuple(render(tokenizer, p, add_generation_prompt=True, **THINK_OFF)) for p in PROMPTS}
    default = {tuple(render(tokenizer, p, add_generation_prompt=True)) for p in PROMPTS}
    assert seen and {tuple(ids) for ids in seen} == wanted and not wanted & default
    assert all(tokenizer.decode(ids).endswith(EMPTY_THINK) for ids in seen)


@pytest.mark.parametrize("config_class", [SpeakerTrainingConfig, DirectorTrainingConfig])
def test_grpo_recipes_default_to_the_setting_and_may_override_it(config_class: type, tmp_path: Path) -> None:
    assert config_class().trainer_args(tmp_path).chat_template_kwargs == THINK_OFF
    parsed, _ = config_class.parse(None, [])
    assert parsed.training.chat_template_kwargs == THINK_OFF
    recipe = tmp_path / "r.yaml"
    recipe.write_text("chat_template_kwargs:\n  enable_thinking: true\n")
    parsed, _ = config_class.parse(recipe, [])
    assert parsed.training.chat_template_kwargs == {"enable_thinking": True}


def test_dpo_tokenizes_pairs_with_the_setting(tiny_model: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    trainers: list[DPOTrainer] = []
    monkeypatch.setattr(speaker_dpo, "DPOTrainer", recording(DPOTrainer, trainers))
    train_speaker_dpo(PAIRS, base=str(tiny_model), persona="probe", out=tmp_path, config={
        "lora_r": 4, "lora_alpha": 8, "training": {"max_steps": 1, "per_device_train_batch_size": 2,
                                                   "save_strategy": "no", "disable_tqdm": True}})
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    rows = trainers[0].train_dataset
    assert len(rows) == len(PAIRS)
    for pair, row in zip(PAIRS, rows, strict=True):
        prompt_ids = render(tokenizer, pair["prompt"], add_generation_prompt=True, **THINK_OFF)
        assert row["prompt_ids"] == prompt_ids != render(tokenizer, pair["prompt"], add_generation_prompt=True)
        assert tokenizer.decode(row["prompt_ids"]).endswith(EMPTY_THINK)
        for side in ("chosen", "rejected"):
            assert row["prompt_ids"] + row[f"{side}_ids"] == render(tokenizer, pair["prompt"] + pair[side],
                                                                     **THINK_OFF)
            assert tokenizer.decode(row[f"{side}_ids"]) == pair[side][0]["content"] + "<|im_end|>\n"


@pytest.fixture(scope="module", params=["tiny", "system-switch"])
def reward_run(request: pytest.FixtureRequest, tiny_model: Path,
               tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, list]:
    """A reward model trained one step on ``PAIRS`` with the tiny model's template or
    ``SYSTEM_SWITCH_TEMPLATE``: its tokenizer, saved folder and the trainer's dataset."""
    base = tiny_model
    if request.param == "system-switch":
        base = tmp_path_factory.mktemp("switch") / "model"
        shutil.copytree(tiny_model, base, ignore=shutil.ignore_patterns("adapters"))
        tokenizer = AutoTokenizer.from_pretrained(base)
        tokenizer.chat_template = SYSTEM_SWITCH_TEMPLATE
        tokenizer.save_pretrained(base)
    trainers: list[RewardTrainer] = []
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(reward_model, "RewardTrainer", recording(RewardTrainer, trainers))
        out = tmp_path_factory.mktemp("rm") / "rm"
        train_reward_model(PAIRS, [], base=str(base), out=out, config={
            "lora_r": 4, "lora_alpha": 8, "training": {"max_steps": 1, "disable_tqdm": True}})
    return AutoTokenizer.from_pretrained(base), out, list(trainers[0].train_dataset)


def test_reward_model_trains_on_sequences_rendered_with_the_setting(reward_run: tuple) -> None:
    tokenizer, _, rows = reward_run
    assert len(rows) == len(PAIRS)
    for pair, row in zip(PAIRS, rows, strict=True):
        for side in ("chosen", "rejected"):
            wanted = render(tokenizer, pair["prompt"] + pair[side], **THINK_OFF)
            assert row[f"{side}_ids"] == wanted
            if tokenizer.chat_template == SYSTEM_SWITCH_TEMPLATE:
                assert wanted != render(tokenizer, pair["prompt"] + pair[side])
            else:
                assert EMPTY_THINK + pair[side][0]["content"] in tokenizer.decode(wanted)


def test_reward_model_scores_sequences_as_it_was_trained(reward_run: tuple) -> None:
    tokenizer, out, rows = reward_run
    scorer = RewardModel.load(out, device="cpu")
    fed: list[list[int]] = []

    def keep(module: Any, args: Any, kwargs: dict[str, Any]) -> None:
        for ids, mask in zip(kwargs["input_ids"].tolist(), kwargs["attention_mask"].tolist(), strict=True):
            fed.append([i for i, m in zip(ids, mask, strict=True) if m])

    scorer.model.register_forward_pre_hook(keep, with_kwargs=True)
    scorer.score([p["prompt"] for p in PAIRS], [p["chosen"] for p in PAIRS])
    assert sorted(fed) == sorted(row["chosen_ids"] for row in rows)
    if tokenizer.chat_template == SYSTEM_SWITCH_TEMPLATE:
        assert not {tuple(ids) for ids in fed} & {tuple(render(tokenizer, p["prompt"] + p["chosen"])) for p in PAIRS}
