"""Speaker GRPO on the tiny models: real TRL GRPOTrainer steps, saved adapters, reloaded."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest
import torch
from datasets import Dataset
from transformers import TrainerCallback

from mascot.policies.local import LocalBackend
from mascot.rosters import Roster
from mascot.training.fitting.speaker_training import (
    SpeakerTrainingConfig,
    speaker_prompts,
    train_speaker,
)
from mascot.training.rewards import format_reward, roster_format_reward, weighted_rewards

FAST = {
    "lora_r": 8,
    "lora_alpha": 16,
    "lora_dropout": 0.0,
    "lora_target_modules": "all-linear",
    "rm_weight": 0.0,
    "training": {"learning_rate": 3e-2, "num_generations": 4, "per_device_train_batch_size": 8,
                 "max_completion_length": 8, "max_steps": 60, "disable_tqdm": True, "seed": 0},
}
# the speaker prompts (system prompt with the persona) make a step ~1 s; these tests run few
SHORT = {**FAST, "training": {**FAST["training"], "max_steps": 3, "per_device_train_batch_size": 4,
                              "num_generations": 2}}
WORDS = "I hear you that sounds hard what would help most right now let us plan one small step".split()


def even_tokens(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float | None]:
    """Toy reward: the fraction of completion tokens with an even id."""
    return [sum(t % 2 == 0 for t in ids) / max(len(ids), 1) for ids in completion_ids]


def odd_tokens(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float | None]:
    """The opposite toy reward (a second persona that should end up different)."""
    return [sum(t % 2 == 1 for t in ids) / max(len(ids), 1) for ids in completion_ids]


@pytest.fixture(scope="module")
def sharp_model(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, set[int]]:
    """The tiny model with its (tied) embeddings scaled up, and a reachable target token set.

    The tiny model's next-token distribution is uniform to three decimals (0.02-scale random
    embeddings, and TRL refuses a LoRA on ``lm_head``), so no adapter can shift it far.
    Scaled by 8 the logits spread; the target set is the tokens on one side of a random
    hyperplane through the embeddings, which a LoRA can reach by turning the last hidden
    state towards the hyperplane's normal.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tiny_model)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(SHARPEN)
    out = tmp_path_factory.mktemp("sharp") / "model"
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(tiny_model).save_pretrained(out)
    normal = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0))
    target = {i for i, value in enumerate((model.get_input_embeddings().weight @ normal).tolist()) if value > 0}
    return out, target


SHARPEN = 8.0


class Snapshots(TrainerCallback):
    """Copies of every parameter at the start and the end of training."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.after = {n: p.detach().clone() for n, p in model.named_parameters()}


def test_speaker_prompts_are_the_persona_turns(roster: Roster, episodes: list) -> None:
    persona = roster.persona_ids[0]
    dataset = speaker_prompts(episodes, roster, persona)
    assert len(dataset) > 0 and set(dataset["persona"]) == {persona}
    prompt = dataset[0]["prompt"]
    assert prompt[0]["role"] == "system" and all(set(m) == {"role", "content"} for m in prompt)
    everyone = speaker_prompts(episodes, roster, None)
    assert len(everyone) > len(dataset)
    with pytest.raises(KeyError, match="nobody"):
        speaker_prompts(episodes, roster, "nobody")


def test_grpo_raises_a_learnable_reward(sharp_model: tuple, roster: Roster, episodes: list, tmp_path: Path) -> None:
    base, target = sharp_model

    def on_target(prompts: list, completions: list, completion_ids: list, **kwargs: Any) -> list[float | None]:
        return [sum(t in target for t in ids) / max(len(ids), 1) for ids in completion_ids]

    # short prompts keep 60 steps at ~5 s; the speaker prompts are trained on below
    rng = random.Random(0)
    dataset = Dataset.from_list([{"prompt": [{"role": "user", "content": " ".join(rng.choices(WORDS, k=6))}]}
                                 for _ in range(32)])
    persona = roster.persona_ids[0]
    report = train_speaker(dataset, base=str(base), persona=persona, out=tmp_path,
                           reward_funcs={"on_target": (on_target, 1.0)}, config=FAST)
    print(f"rewards {report.rewards} in {report.seconds:.1f} s")
    assert report.steps == 60 and len(report.rewards) == 60
    assert report.reward_first is not None and report.reward_last is not None
    # measured over seeds 0-2: first window 0.62-0.65, last 0.81-0.98
    assert report.reward_last - report.reward_first >= 0.12
    card = json.loads((tmp_path / persona / "adapter_card.json").read_text())
    assert card["method"] == "grpo" and card["role"] == persona and card["steps"] == 60
    assert card["reward_terms"] == ["on_target"] and card["reward_last"] == report.reward_last


def test_two_personas_two_adapters(tiny_model: Path, roster: Roster, episodes: list, tmp_path: Path) -> None:
    personas = roster.persona_ids[:2]
    rewards = {personas[0]: even_tokens, personas[1]: odd_tokens}
    config = SHORT
    reports, snapshots = {}, {}
    for persona in personas:
        snapshots[persona] = Snapshots()
        reports[persona] = train_speaker(
            speaker_prompts(episodes, roster, persona), base=str(tiny_model), persona=persona,
            out=tmp_path / "adapters", reward_funcs={"toy": (rewards[persona], 1.0)}, config=config,
            callbacks=[snapshots[persona]])
    assert [reports[p].steps for p in personas] == [3, 3]
    assert sorted(p.name for p in (tmp_path / "adapters").iterdir()) == sorted(personas)  # no staging left
    for persona in personas:
        files = {p.name for p in (tmp_path / "adapters" / persona).iterdir()}
        assert {"adapter_config.json", "adapter_model.safetensors", "adapter_card.json", "tokenizer.json"} <= files
        snap = snapshots[persona]
        lora = [n for n in snap.before if "lora_" in n]
        base = [n for n in snap.before if n not in lora]
        assert lora and base
        assert sum(not torch.equal(snap.before[n], snap.after[n]) for n in lora) >= len(lora) * 0.5
        assert all(torch.equal(snap.before[n], snap.after[n]) for n in base)

    backend = LocalBackend.load(str(tiny_model), adapters={p: tmp_path / "adapters" / p for p in personas})
    # each adapter writes differently from the base and from the other (sampled with the same
    # seed, so only the weights differ; greedy text of a tiny random model is often all newlines)
    prompts = [row["prompt"] for row in speaker_prompts(episodes, roster, personas[0])][:4]
    outputs = []
    for prompt in prompts:
        replies = backend.generate([prompt] * 3, adapters=[*personas, None], max_new_tokens=12, temperature=1.0,
                                   seed=0)
        outputs.append([r.text for r in replies])
    assert any(first != base for first, _, base in outputs), outputs
    assert any(second != base for _, second, base in outputs), outputs
    assert any(first != second for first, second, _ in outputs), outputs
    again = backend.generate([prompts[0]], adapters=[personas[0]], max_new_tokens=12, temperature=1.0, seed=0)[0].text
    assert again == outputs[0][0]  # one adapter alone answers as it did in the mixed batch


def test_grpo_smoke_on_llama(tiny_llama: Path, roster: Roster, episodes: list, tmp_path: Path) -> None:
    persona = roster.persona_ids[1]
    config = {**SHORT, "format_weight": 1.0, "training": {**SHORT["training"], "max_steps": 2}}
    terms = SpeakerTrainingConfig.from_dict(config).reward_terms(roster, persona)
    report = train_speaker(speaker_prompts(episodes, roster, persona), base=str(tiny_llama), persona=persona,
                           out=tmp_path, reward_funcs=terms, config=config)
    assert report.steps == 2 and len(report.rewards) == 2
    assert (tmp_path / persona / "adapter_model.safetensors").is_file()
    card = json.loads((tmp_path / persona / "adapter_card.json").read_text())
    assert card["reward_terms"] == ["format_reward"] and card["reward_weights"] == [1.0]


REPLIES = [
    ("I hear you. That sounds really hard; what would help most tonight?", 1.0),
    ("Anchor: I hear you, that sounds hard.", 0.5),
    ("[anchor] I hear you, that sounds hard.", 0.5),
    ("**The Anchor** (validator): I hear you.", 0.5),
    ("I hear you.\nCatalyst: But have you considered the evidence?", 0.0),
    ("I hear you.\nUser: thanks, that helps.", 0.0),
    ("Anchor: I hear you.\nUser: thanks.", -0.5),
    ("", -1.0),
    ("   \n ", -1.0),
    ("word " * 150, 0.5),
]


@pytest.mark.parametrize(("reply", "expected"), REPLIES)
def test_format_reward_table(roster: Roster, reply: str, expected: float) -> None:
    prompts = [[{"role": "user", "content": "I failed my exam."}]]
    conversational = [[{"role": "assistant", "content": reply}]]
    assert format_reward(prompts, conversational) == [pytest.approx(expected)]
    assert format_reward(["I failed my exam."], [reply]) == [pytest.approx(expected)]
    assert roster_format_reward(roster, "anchor")(prompts, conversational) == [pytest.approx(expected)]


def test_a_refusal_or_a_copy_gets_the_format_rewards_lowest_value(roster: Roster) -> None:
    """What the hacked run learned: a short clean refusal scored 1.0; now -1.0, as does a
    copy of the voice before it, boilerplate, and speaking as the person."""
    prompts = [[{"role": "system", "content": "You are The Anchor."}, {"role": "user", "content": PERSON}]] * 5
    earlier = "That sounds really painful, and it makes sense that you feel discouraged after trying so hard."
    replies = ["I'm sorry, but I can't assist with that.", earlier, "As an AI language model, I understand.",
               "User: I failed again.", "What would you tell a friend who failed twice?"]
    rows = [[{"role": "assistant", "content": r}] for r in replies]
    for reward in (format_reward, roster_format_reward(roster, "anchor"), roster_format_reward(roster, None)):
        scores = reward(prompts, rows, round_turns=[[earlier]] * 5, persona=["anchor"] * 5)
        assert scores == [-1.0, -1.0, -1.0, -1.0, 1.0], reward
    assert format_reward(prompts[:1], rows[1:2]) == [1.0]  # without the round's turns, no copy is seen


PERSON = "I failed my driving test again and I feel like an idiot"


def test_format_reward_budget_and_roster_labels(roster: Roster) -> None:
    assert format_reward(["p"], ["one two three four"], max_words=3) == [0.5]
    # a roster-aware reward ignores words that are no speaker's label
    reward = roster_format_reward(roster, "anchor")
    assert reward(["p"], ["Note: breathe first.\nThen: one small step."]) == [1.0]
    assert format_reward(["p"], ["Note: breathe first."]) == [0.5]
    assert format_reward(["p"], ["Here is the plan: breathe first.\nThen one small step."]) == [1.0]


def test_weighted_rewards_names_and_weights() -> None:
    functions, weights = weighted_rewards({"fmt": (format_reward, 0.5), "off": (format_reward, 0.0),
                                           "even": (even_tokens, 2.0)})
    assert [f.__name__ for f in functions] == ["fmt", "even"] and weights == [0.5, 2.0]
    assert functions[0](["p"], ["Anchor: hi"]) == [0.5]
    with pytest.raises(ValueError, match="no reward term"):
        weighted_rewards({"off": (format_reward, 0.0)})
    with pytest.raises(ValueError, match="identifier"):
        weighted_rewards({"bad name": (format_reward, 1.0)})


def test_config_from_dict_rejects_unknown_keys(roster: Roster) -> None:
    with pytest.raises(ValueError, match="lora_rank.*valid: lora_r"):
        SpeakerTrainingConfig.from_dict({"lora_rank": 8})
    with pytest.raises(ValueError, match="num_generation"):
        SpeakerTrainingConfig(training={"num_generation": 2})
    args = SpeakerTrainingConfig().trainer_args("/tmp/x")
    assert (args.beta, args.save_strategy, args.save_steps, args.report_to) == (0.0, "steps", 25, [])
    with pytest.raises(ValueError, match="rm_weight"):
        SpeakerTrainingConfig().reward_terms(roster, "anchor")


class Interrupt(TrainerCallback):
    """Stops the process-like run right after the checkpoint of step ``at`` is saved."""

    def __init__(self, at: int) -> None:
        self.at = at

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == self.at:
            raise KeyboardInterrupt


class StepCounter(TrainerCallback):
    def __init__(self) -> None:
        self.steps: list[int] = []

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.steps.append(state.global_step)


def test_interrupted_training_resumes_from_its_checkpoint(tiny_model: Path, roster: Roster, episodes: list,
                                                          tmp_path: Path) -> None:
    from mascot.training.fitting.adapter_folder import checkpoint_dir, is_finished

    persona = roster.persona_ids[0]
    config = {**SHORT, "training": {**SHORT["training"], "max_steps": 4, "save_strategy": "steps", "save_steps": 1}}
    run = dict(base=str(tiny_model), persona=persona, out=tmp_path, reward_funcs={"toy": (even_tokens, 1.0)},
               config=config)
    dataset = speaker_prompts(episodes, roster, persona)
    with pytest.raises(KeyboardInterrupt):
        train_speaker(dataset, **run, callbacks=[Interrupt(at=2)])
    target = tmp_path / persona
    assert (checkpoint_dir(target) / "checkpoint-2").is_dir() and not target.exists() and not is_finished(target)
    counter = StepCounter()
    report = train_speaker(dataset, **run, callbacks=[counter])
    assert counter.steps == [3, 4]  # only the steps after the checkpoint ran
    assert report.steps == 4 and len(report.rewards) == 4  # the log history came back with it
    assert is_finished(target) and not checkpoint_dir(target).exists()


def test_round_redundancy_penalises_echoing_the_round(roster: Roster, episodes: list) -> None:
    from mascot.training.rewards import round_redundancy_reward

    dataset = speaker_prompts(episodes, roster, None)
    row = next(r for r in dataset if r["round_turns"])
    echo, fresh = row["round_turns"][-1], "Completely unrelated words about gardening tomatoes"
    rewards = round_redundancy_reward([row["prompt"]] * 2, [echo, fresh], round_turns=[row["round_turns"]] * 2)
    assert rewards[0] == pytest.approx(-1.0) and rewards[1] > -0.5
    first = next(r for r in dataset if not r["round_turns"])
    # the first voice has nobody to repeat: not scored, so speaking first or alone earns nothing
    assert round_redundancy_reward([first["prompt"]], [echo], round_turns=[[]]) == [None]


def test_dpo_on_pairs_moves_only_the_adapter(tiny_model: Path, roster: Roster, episodes: list,
                                             tmp_path: Path) -> None:
    from mascot.training.fitting.speaker_dpo import SpeakerDPOError, train_speaker_dpo

    persona = roster.persona_ids[0]
    prompts = speaker_prompts(episodes, roster, persona)["prompt"]
    pairs = [{"prompt": p, "chosen": [{"role": "assistant", "content": "What would help most tonight?"}],
              "rejected": [{"role": "assistant", "content": "Anchor: fine.\nUser: ok"}], "persona": persona}
             for p in prompts]
    snapshots = Snapshots()
    config = {"lora_r": 4, "lora_alpha": 8, "training": {"max_steps": 3, "learning_rate": 1e-2,
                                                        "per_device_train_batch_size": 2, "disable_tqdm": True}}
    report = train_speaker_dpo(pairs, base=str(tiny_model), persona=persona, out=tmp_path, config=config,
                               callbacks=[snapshots], data="pairs.jsonl")
    assert report.steps == 3 and report.pairs == len(pairs) and report.accuracy_last is not None
    lora = [n for n in snapshots.before if "lora_" in n]
    assert lora and all(not torch.equal(snapshots.before[n], snapshots.after[n]) for n in lora if "lora_B" in n)
    assert all(torch.equal(snapshots.before[n], snapshots.after[n]) for n in snapshots.before if n not in lora)
    card = json.loads((tmp_path / persona / "adapter_card.json").read_text())
    assert (card["method"], card["role"], card["data"], card["steps"]) == ("dpo", persona, "pairs.jsonl", 3)
    assert (tmp_path / persona / "adapter_model.safetensors").is_file()
    with pytest.raises(SpeakerDPOError, match="no preference pairs"):
        train_speaker_dpo([], base=str(tiny_model), persona=persona, out=tmp_path)
    with pytest.raises(SpeakerDPOError, match="reaches max_length=8"):
        train_speaker_dpo(pairs, base=str(tiny_model), persona=persona, out=tmp_path,
                          config={"training": {"max_length": 8, "max_steps": 1}})
