"""Reward models on the tiny model: real TRL RewardTrainer steps, save, reload, score."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import TrainerCallback

from mascot.policies.local import LocalModelError
from mascot.training.data.pairs import build_pairs
from mascot.training.fitting.reward_model import (
    RewardModel,
    RewardModelConfig,
    RewardModelError,
    RewardReport,
    render_block,
    train_reward_model,
)
from mascot.training.judging.judgement import JudgedCandidate

WORDS = ("I hear you that sounds hard what would help most right now let us plan one small step "
         "the meeting agreed to ship on friday budget owners risks timeline").split()
MARKER = "hopeful"
RECIPE = {
    "lora_r": 8,
    "lora_alpha": 16,
    "training": {"learning_rate": 5e-3, "num_train_epochs": 3, "logging_steps": 1, "disable_tqdm": True},
}


def marker_pairs(seed: int = 0) -> tuple[list[dict], list[dict]]:
    """~64 train / ~32 test pairs: the judge liked replies with the marker word."""
    rng = random.Random(seed)
    candidates = []
    for i in range(96):
        prompt = [
            {"role": "system", "content": "You are Anchor, the emotional validator."},
            {"role": "user", "content": " ".join(rng.choices(WORDS, k=8))},
        ]
        liked = rng.choices(WORDS, k=10)
        liked.insert(rng.randrange(11), MARKER)
        for reply, overall in ((" ".join(liked), 80.0), (" ".join(rng.choices(WORDS, k=11)), 30.0)):
            candidates.append(JudgedCandidate(context_id=f"c{i}", prompt=prompt, persona="anchor",
                                              reply=reply, overall=overall))
    pairs = build_pairs(candidates, test_fraction=0.33, seed=seed)
    return pairs.train, pairs.test


class Snapshots(TrainerCallback):
    """Copies of every parameter at the start and the end of training, and which train."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}
        self.trainable = {n for n, p in model.named_parameters() if p.requires_grad}

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.after = {n: p.detach().clone() for n, p in model.named_parameters()}


@pytest.fixture(scope="module")
def trained(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[RewardReport, Snapshots, list, list]:
    """One training run shared by the tests below (~30 steps, a few seconds)."""
    train, test = marker_pairs()
    snapshots = Snapshots()
    out = tmp_path_factory.mktemp("rm") / "persona-rm"
    report = train_reward_model(train, test, base=str(tiny_model), out=out, config=RECIPE, callbacks=[snapshots])
    return report, snapshots, train, test


def test_training_learns_the_preference(trained: tuple) -> None:
    report, _, train, test = trained
    print(f"accuracy {report.accuracy_before:.3f} -> {report.accuracy_after:.3f} in {report.seconds:.1f} s")
    assert 55 <= len(train) <= 75 and 25 <= len(test) <= 40
    assert (report.train_pairs, report.test_pairs) == (len(train), len(test))
    assert report.accuracy_before is not None and report.accuracy_after is not None
    assert report.accuracy_after >= 0.85
    assert report.accuracy_after - report.accuracy_before >= 0.25
    assert report.steps > 0 and report.train_loss < 0.6931  # below log 2: better than chance


def test_only_lora_and_head_moved(trained: tuple) -> None:
    _, snapshots, _, _ = trained

    def moved(name: str) -> bool:
        return not torch.equal(snapshots.before[name], snapshots.after[name])

    lora = [n for n in snapshots.before if "lora_" in n]
    head = [n for n in snapshots.before if ".modules_to_save." in n]
    base = [n for n in snapshots.before if n not in lora and n not in head]
    assert lora and head and base
    assert snapshots.trainable == set(lora) | set(head)
    assert all(moved(n) for n in head)
    assert sum(moved(n) for n in lora) >= len(lora) * 0.9
    assert not any(moved(n) for n in base)


def test_saved_model_reloads_and_scores(trained: tuple) -> None:
    report, snapshots, _, test = trained
    files = {p.name for p in report.out.iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", "adapter_card.json", "README.md",
            "tokenizer.json"} <= files
    assert [p.name for p in report.out.parent.iterdir()] == [report.out.name]  # no staging or checkpoints left
    card = json.loads((report.out / "adapter_card.json").read_text())
    assert (card["method"], card["role"], card["accuracy_after"]) == ("reward_model", "persona-rm",
                                                                       report.accuracy_after)
    assert card["data_size"] == report.train_pairs and card["recipe"]["lora_r"] == 8
    assert card["reward_metric"] == "margin" and len(card["rewards"]) == report.steps  # logged every step
    assert card["reward_last"] > card["reward_first"]  # chosen pulls away from rejected
    readme = (report.out / "README.md").read_text()
    assert readme.startswith("---\nbase_model: ") and "RewardTrainer" in readme and "margin" in readme

    model = RewardModel.load(report.out)
    loaded = dict(model.model.named_parameters())
    assert set(loaded) == set(snapshots.after)
    differ = [name for name, value in snapshots.after.items() if not torch.equal(loaded[name], value)]
    assert differ == ["base_model.model.score.original_module.weight"]  # the unused random head only
    assert model.accuracy(test) == pytest.approx(report.accuracy_after)

    reward = model.reward_function(name="persona_rm")
    assert reward.__name__ == "persona_rm"
    prompts = [pair["prompt"] for pair in test[:5]]
    completions = [pair["chosen"] for pair in test[:5]]  # conversational: a list of messages each
    rewards = reward(prompts=prompts, completions=completions, completion_ids=None, trainer_state=None)
    assert len(rewards) == 5 and all(isinstance(r, float) for r in rewards)
    texts = [pair["chosen"][0]["content"] for pair in test[:5]]
    assert reward(prompts, texts) == pytest.approx(rewards, abs=1e-5)
    plain = reward(["Anchor says:"] * 2, [f"a {MARKER} step", "a small step"])
    assert len(plain) == 2 and all(isinstance(r, float) for r in plain)


def test_group_blocks_are_scored_as_rendered_text(trained: tuple) -> None:
    report, _, _, test = trained
    model = RewardModel.load(report.out)
    block = [{"role": "assistant", "name": "anchor", "content": " I hear you. "},
             {"role": "assistant", "name": "catalyst", "content": "What would help?"}]
    assert render_block(block) == "anchor: I hear you.\n\ncatalyst: What would help?"
    context = test[0]["prompt"]
    scores = model.score_blocks([context, context], [block, "plain text block"])
    assert scores == pytest.approx(model.score([context, context], [render_block(block), "plain text block"]))
    with pytest.raises(ValueError, match="1 prompts but 2 replies"):
        model.score([context], ["a", "b"])


def test_retraining_replaces_the_saved_model(trained: tuple, tmp_path: Path) -> None:
    report, _, train, test = trained
    out = tmp_path / "again"
    first = train_reward_model(train[:8], test[:4], base=report.base, out=out,
                               config={"training": {"max_steps": 1, "disable_tqdm": True}})
    second = train_reward_model(train[:16], [], base=report.base, out=out,
                                config={"training": {"max_steps": 1, "disable_tqdm": True}})
    assert (first.steps, second.steps) == (1, 1) and second.accuracy_after is None
    card = json.loads((out / "adapter_card.json").read_text())
    assert card["data_size"] == 16 and card["accuracy_after"] is None
    assert [p.name for p in tmp_path.iterdir()] == ["again"]  # old copy and staging removed


def test_missing_base_model_is_a_one_line_error(tmp_path: Path) -> None:
    train, test = marker_pairs()
    with pytest.raises(LocalModelError) as caught:
        train_reward_model(train, test, base=str(tmp_path / "no-such-model"), out=tmp_path / "rm")
    assert str(caught.value) == f"no model directory at {tmp_path / 'no-such-model'}"
    assert not (tmp_path / "rm").exists()


def test_unusable_outputs_and_settings_fail_before_training(tiny_model: Path, tmp_path: Path) -> None:
    train, test = marker_pairs()
    with pytest.raises(RewardModelError, match="directory of .* does not exist"):
        train_reward_model(train, test, base=str(tiny_model), out=tmp_path / "missing" / "rm")
    foreign = tmp_path / "notes"
    foreign.mkdir()
    (foreign / "keep.txt").write_text("mine")
    with pytest.raises(RewardModelError, match="holds something other than a reward model; not replacing it"):
        train_reward_model(train, test, base=str(tiny_model), out=foreign)
    assert (foreign / "keep.txt").read_text() == "mine"
    with pytest.raises(RewardModelError, match="no training pairs"):
        train_reward_model([], test, base=str(tiny_model), out=tmp_path / "rm")
    with pytest.raises(RewardModelError, match="train pair 0: missing rejected"):
        train_reward_model([{"prompt": "p", "chosen": "c"}], [], base=str(tiny_model), out=tmp_path / "rm")
    with pytest.raises(RewardModelError, match="every training pair exceeds max_length=8 tokens"):
        train_reward_model(train[:4], [], base=str(tiny_model), out=tmp_path / "rm",
                           config={"training": {"max_length": 8}})
    assert not (tmp_path / "rm").exists()
    with pytest.raises(ValueError, match="unknown reward-model setting.*lora_rank.*valid: lora_r"):
        RewardModelConfig.from_dict({"lora_rank": 8})
    with pytest.raises(ValueError, match="unknown trl.RewardConfig field.*learning_rat"):
        RewardModelConfig(training={"learning_rat": 1e-3})
    with pytest.raises(RewardModelError, match="not a reward model"):
        RewardModel.load(tmp_path)


def test_default_trainer_settings_run_on_a_cpu(tmp_path: Path) -> None:
    args = RewardModelConfig(training={"learning_rate": 1e-3}).trainer_args(tmp_path)
    if not torch.cuda.is_available():
        assert args.use_cpu and not args.bf16
    assert not args.gradient_checkpointing and not args.activation_checkpointing
    assert args.report_to == []  # "none" as transformers stores it
    assert args.learning_rate == 1e-3 and args.save_strategy == "steps" and args.logging_steps == 1
