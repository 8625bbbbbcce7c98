"""Director GRPO learns its reward: on a Director-shaped tiny model, the share of stage
directions naming the persona the group reward model prefers rises, and only the adapter moves.

The tiny random model writes no JSON, so every direction it samples is replaced by the
graph's fallback and there is nothing to learn. A short supervised warm start turns a copy
of it into a Director that answers each Director prompt with a valid direction naming one
of the four personas about equally often; GRPO (``train_director``, blocks played in the
real graph by fake speakers) then has to find the persona a stand-in group RM scores 1.
The same run with the reward on another persona must move the other way: the rise comes
from the reward, not from the setup.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import torch
from langchain_core.messages import AIMessage
from peft import PeftModel
from test_director_training import Logs, rollout_for
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache, TrainerCallback

from mascot.graphs.direction import fallback_direction, interpret_direction
from mascot.graphs.state import round_speakers
from mascot.policies.thinking import chat_template_kwargs
from mascot.rosters import Roster
from mascot.training.data.block_rollout import DecisionPoint, decision_points
from mascot.training.fitting.director_training import DirectorTrainingConfig, train_director

#: The persona the reward prefers, and the one preferred in the control run.
PREFERRED, OTHER = "action_guide", "catalyst"
#: Samples per decision point when measuring shares (4 points: 128 directions).
SAMPLES = 32
#: Warm start: AdamW steps, learning rate, and the temperature the loss is taken at. Fitting
#: ``logits / 3`` leaves the four personas' logits equal (a uniform choice at temperature 1)
#: but every other token's three times further below: without that margin one GRPO step
#: that lowers three personas' logits can lift some unrelated token above them all, and the
#: model unlearns JSON (measured: 300 steps at temperature 1 then GRPO at lr 5e-3 collapsed
#: to 100% invalid directions in 1 of 2 seeds; at temperature 3 in 0 of 12 runs, lr 5e-3 and 1e-2).
WARM_STEPS, WARM_LR, WARM_TEMPERATURE = 300, 1e-2, 3.0
#: Two decision points a step, eight directions each; no KL term (the default). The learning
#: rate is lower than a LoRA's usual 1e-2 and up: the tiny model's weights are 0.02-scale, so
#: a LoRA step of 1e-2 is a large relative change (it collapsed a less sharp warm start; with
#: the Director's prompts listing the voices in shuffled order, 5e-3 collapsed to 100 % invalid
#: directions in the first run, 2e-3 learned: catalyst 0.23 -> 0.74, action_guide 0.28 -> 1.0
#: on an AVX-512 CPU; on a 2-core AVX2 one catalyst rose only to 0.34, see the control test).
#: Only the group RM and validity terms: the run isolates learning one reward.
STEPS = 8
GRPO = DirectorTrainingConfig(
    lora_r=8, lora_alpha=16, lora_dropout=0.0, lora_target_modules="all-linear",
    block_turns=1, group_rm_weight=1.0, redundancy_weight=0.0, balance_weight=0.0, validity_weight=1.0,
    fullness_weight=0.0, copy_weight=0.0,
    training={"max_steps": STEPS, "num_generations": 8, "per_device_train_batch_size": 16,
              "max_completion_length": 32, "learning_rate": 2e-3,
              "temperature": 1.0, "seed": 0,
              "disable_tqdm": True})


def direction(persona: str) -> str:
    """The warm start's answer: 27-31 tokens of the tiny tokenizer with its end token."""
    return json.dumps({"speaker": persona, "action": "ask one question", "tone": "warm"})


class PersonaScorer:
    """A group reward model stand-in: 1.0 for a block whose first turn is ``persona``'s."""

    def __init__(self, persona: str) -> None:
        self.persona = persona
        self.blocks = 0

    def score_blocks(self, contexts: list, blocks: list) -> list[float]:
        self.blocks += len(blocks)
        return [float(bool(block) and block[0].get("name") == self.persona) for block in blocks]


class Snapshots(TrainerCallback):
    """Copies of every parameter at the start and the end of training."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.before = {n: p.detach().clone() for n, p in model.named_parameters()}

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.after = {n: p.detach().clone() for n, p in model.named_parameters()}


@contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model's matrices are too small to split, and on a busy
    two-core machine a second thread only spins (measured: the warm start 15x slower)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def prompt_ids(tokenizer: Any, point: DecisionPoint) -> list[int]:
    """The Director prompt as GRPO renders it (generation prompt, thinking off)."""
    text = tokenizer.apply_chat_template(list(point.prompt), tokenize=False, add_generation_prompt=True,
                                         **chat_template_kwargs())
    return tokenizer(text, add_special_tokens=False).input_ids


def warm_start(tiny_model: Path, points: Sequence[DecisionPoint], roster: Roster, out: Path) -> Path:
    """Fine-tune all weights of a copy of the tiny model to answer each prompt with
    ``direction(p)``, ``p`` uniform over the personas; save it to ``out``.

    Each step, per point: the prompt's keys and values are computed without gradient (fresh,
    so they match the current weights) and the four answers are fitted on top of them, the
    last prompt token included so the first answer token is learnt too. The loss skips the
    backward pass through 700 prompt tokens, which is what makes 300 steps take seconds.
    """
    tokenizer = AutoTokenizer.from_pretrained(tiny_model)
    model = AutoModelForCausalLM.from_pretrained(tiny_model, dtype=torch.float32)
    answers = [tokenizer(direction(p) + tokenizer.eos_token, add_special_tokens=False).input_ids
               for p in roster.persona_ids]
    width = max(map(len, answers))
    labels = torch.full((len(answers), width), -100)
    tokens = torch.full((len(answers), width), tokenizer.pad_token_id)
    for row, answer in enumerate(answers):
        labels[row, : len(answer)] = tokens[row, : len(answer)] = torch.tensor(answer)
    prompts = [torch.tensor([prompt_ids(tokenizer, p)]) for p in points]
    optimizer = torch.optim.AdamW(model.parameters(), lr=WARM_LR, weight_decay=0.0)
    model.train()
    for _ in range(WARM_STEPS):
        for prompt in prompts:
            cache = DynamicCache(config=model.config)
            with torch.no_grad():
                model(input_ids=prompt[:, :-1], cache=cache, use_cache=True, logits_to_keep=1)
            cache.batch_repeat_interleave(len(answers))
            inputs = torch.cat([prompt[:, -1:].expand(len(answers), 1), tokens[:, :-1]], dim=1)
            logits = model(input_ids=inputs, cache=cache, use_cache=True).logits / WARM_TEMPERATURE
            loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)
            (loss / len(prompts)).backward()
        optimizer.step()
        optimizer.zero_grad()
    model.eval()
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    return out


def shares(model: Any, tokenizer: Any, points: Sequence[DecisionPoint], roster: Roster) -> dict[str, float]:
    """Who the sampled directions name (temperature 1, seeded), read as the graph reads them:
    the fraction of ``SAMPLES`` per point naming each persona, and ``"invalid"`` for those the
    graph would repair or replace."""
    torch.manual_seed(0)
    counts: Counter[str] = Counter()
    for point in points:
        prompt = torch.tensor([prompt_ids(tokenizer, point)] * SAMPLES)
        with torch.no_grad():
            output = model.generate(prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                    temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=32,
                                    pad_token_id=tokenizer.pad_token_id)
        for row in output[:, prompt.shape[1]:]:
            read = interpret_direction(
                tokenizer.decode(row, skip_special_tokens=True), roster,
                recent_speakers=[m.name for m in point.messages if isinstance(m, AIMessage)],
                round_turns=point.round_turns, heard_this_round=round_speakers(point.messages))
            counts["invalid" if read.fallback else read.speaker] += 1
    total = SAMPLES * len(points)
    return {name: counts[name] / total for name in (*roster.persona_ids, "invalid")}


def digest(folder: Path) -> str:
    """One hash of every file of a model folder."""
    sha = hashlib.sha256()
    for path in sorted(folder.iterdir()):
        if path.is_file():
            sha.update(path.name.encode() + path.read_bytes())
    return sha.hexdigest()


@pytest.fixture(scope="module")
def opening_points(roster: Roster, episodes: list) -> list[DecisionPoint]:
    """The decision points right after the person spoke: every persona may speak there."""
    points = [p for p in decision_points(episodes, roster) if p.round_turns == 0]
    assert len(points) >= 2
    return points


@pytest.fixture(scope="module")
def director_base(tiny_model: Path, opening_points: list, roster: Roster,
                  tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, float]]:
    """The warm-started Director model and the shares of its sampled directions."""
    with one_thread():
        base = warm_start(tiny_model, opening_points, roster, tmp_path_factory.mktemp("director") / "base")
        measured = shares(AutoModelForCausalLM.from_pretrained(base).eval(), AutoTokenizer.from_pretrained(base),
                          opening_points, roster)
    print(f"warm-started shares {measured}")
    return base, measured


def test_warm_start_writes_valid_directions_for_every_persona(director_base: tuple, roster: Roster) -> None:
    _, before = director_base
    # measured: 0 invalid, each persona 0.23-0.30 of 128
    assert before["invalid"] <= 0.1
    assert all(0.1 <= before[p] <= 0.45 for p in roster.persona_ids), before


def grpo_run(director_base: tuple, opening_points: list, roster: Roster, tmp_path: Path,
             preferred: str, other: str) -> tuple[dict[str, float], dict[str, float], list[float]]:
    """Director GRPO from the warm start with the reward on ``preferred``: the shares before
    and after, and the group RM's raw mean per step. Checks on the way that only the
    adapter moved and every step played its blocks."""
    base, before = director_base
    # a direction the graph replaces falls back to another persona: only a valid one earns 1,
    # so train on the points whose fallback is neither of the two (the fixture's episodes
    # follow hashes of the prompts, so which points those are changes with the prompt text)
    points = [p for p in opening_points if fallback_direction(
        roster, [m.name for m in p.messages if isinstance(m, AIMessage)], reason="test").speaker
        not in (preferred, other)]
    assert len(points) >= 2
    on_disk = digest(base)
    rollout, scorer, logs, snapshots = rollout_for(roster, block_turns=1), PersonaScorer(preferred), Logs(), Snapshots()
    with one_thread():
        try:
            report = train_director(points, base=str(base), out=tmp_path, rollout=rollout, group_rm=scorer,
                                    config=GRPO, callbacks=[logs, snapshots])
        finally:
            rollout.close()
        tuned = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), tmp_path / "director").eval()
        after = shares(tuned, AutoTokenizer.from_pretrained(base), opening_points, roster)
    logits = [e["group_rm_logit/mean"] for e in logs.entries if "group_rm_logit/mean" in e]
    print(f"{preferred} preferred: shares {before} -> {after}; group RM logit per step {logits}")

    assert report.steps == STEPS and scorer.blocks == STEPS * 16 and len(logits) == STEPS
    assert after["invalid"] <= 0.2, after
    lora = [n for n in snapshots.before if "lora_" in n]
    frozen = [n for n in snapshots.before if n not in lora]
    assert lora and frozen
    assert all(not torch.equal(snapshots.before[n], snapshots.after[n]) for n in lora if "lora_B" in n)
    assert all(torch.equal(snapshots.before[n], snapshots.after[n]) for n in frozen)
    assert digest(base) == on_disk
    return before, after, logits


def test_director_grpo_learns_the_persona_the_reward_prefers(
    director_base: tuple, opening_points: list, roster: Roster, tmp_path: Path
) -> None:
    before, after, logits = grpo_run(director_base, opening_points, roster, tmp_path, PREFERRED, OTHER)
    # measured (GRPO seed 0, lr 2e-3, this 2-core AVX2 CPU): action_guide 0.29 -> 1.0, every
    # other persona -> 0.0
    assert after[PREFERRED] >= 0.6 and after[PREFERRED] >= before[PREFERRED] + 0.35, after
    assert after[OTHER] <= before[OTHER] - 0.1, after
    # TRL logs the group RM term standardised per decision point (mean 0 by construction);
    # its raw mean, the preferred persona's share of the blocks played, is what rises
    # (measured: 0.31 at the first step, 1.0 from the third)
    assert sum(logits[-3:]) / 3 >= logits[0] + 0.3, logits


def test_director_grpo_with_the_reward_elsewhere_moves_the_other_way(
    director_base: tuple, opening_points: list, roster: Roster, tmp_path: Path
) -> None:
    """The control: the same run with the reward on another persona drops the persona the
    first run raised, so that rise came from the reward, not from the setup."""
    before, after, _ = grpo_run(director_base, opening_points, roster, tmp_path, OTHER, PREFERRED)
    # measured: action_guide 0.29 -> 0.0; catalyst rises only a little (0.21 -> 0.34-0.36,
    # the group RM's raw mean flat at 0.31-0.56): a known limit of this 8-step run, which
    # moves mass off action_guide far more easily than onto the other personas
    assert after[PREFERRED] <= before[PREFERRED] - 0.2, after
    assert after[OTHER] >= before[OTHER], after
