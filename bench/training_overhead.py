"""Training overhead: `mascot train-speakers` (GRPO) vs a bare TRL GRPOTrainer script.

Both train the same tiny random-weight model (``mascot.testing.tiny_model``, built on the spot as
the tests build it) on the same prompts with the same reward callables and the same
settings:

- **ours**: the production path, ``train_speaker(...)`` exactly as ``mascot train-speakers``
  calls it: the shipped ``speakers-cpu-smoke`` recipe read by ``SpeakerTrainingConfig.parse``
  (plus ``--max_steps`` and ``--disable_tqdm``), the prompts from ``speaker_prompts`` over
  an episodes file read back from disk, the reward terms from ``config.reward_terms``
  (persona RM loaded with ``RewardModel.load`` as ``--rm`` is, plus the roster format
  reward), the adapter saved to ``OUT/<persona>`` with its card.
- **bare**: a plain TRL script: ``AutoModelForCausalLM`` + ``GRPOTrainer`` with a
  ``GRPOConfig`` written from the recipe file's values (plus what TRL needs on a CPU:
  ``bf16=False``, ``use_cpu=True``, no activation checkpointing), a ``peft.LoraConfig``
  with the recipe's LoRA values, our dataset's prompt column dumped to JSONL and read
  back, and the same two reward callables with the recipe's weights as ``reward_weights``.

The two runs of a repetition go side by side, interleaved step by step: each trains in
its own thread and a turnstile lets one run at a time, handing over at the start of every
optimizer step (each thread keeps its own RNG state across hand-overs, so every run samples
what it would alone). A burst of load from other processes on a shared machine then hits
both variants within seconds of each other, and step k of ours is compared with step k of
bare, on the same samples. The script checks that: the logged rewards of ours and bare
must be equal, i.e. both did the same work. Repetitions alternate which variant starts.

Seconds per optimizer step are measured by a ``TrainerCallback``: the time a run was active
for a step, i.e. ``on_step_begin``..``on_step_end`` (generation, rewards, forward/backward,
optimizer) plus the work after it until the next step begins (logging, checkpoint saves),
in wall time and in process CPU time. The first ``--warmup`` steps of every run are left
out. Printed: a table with the median over repetitions of each run's mean and the spread
(min-max), the ratio ours/bare (of the medians, paired per repetition and paired per step),
and the one-off costs: preparing the data and config, the set-up before the first step
(tokenizer, model load, LoRA, trainer), and what follows the last step (saving).

    HF_HUB_OFFLINE=1 .venv/bin/python bench/training_overhead.py     # ~3 min on 2 cores
    HF_HUB_OFFLINE=1 .venv/bin/python bench/training_overhead.py --steps 8 --repeats 6
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from datasets import Dataset
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from peft import LoraConfig
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback, set_seed
from trl import GRPOConfig, GRPOTrainer

from mascot.graphs import create_director_graph
from mascot.rosters import Roster, load_roster, load_scenarios
from mascot.testing.tiny_model import build_tiny_model
from mascot.training.episodes.episode import read_episodes
from mascot.training.fitting.recipe import recipe_path
from mascot.training.fitting.reward_model import RewardModel, train_reward_model
from mascot.training.fitting.speaker_training import SpeakerTrainingConfig, speaker_prompts, train_speaker
from mascot.training.rewards import RewardFunction, roster_format_reward

ROSTER = "emotional_support"
PERSONA = "anchor"
RECIPE = "speakers-cpu-smoke"
VARIANTS = ("ours", "bare")
#: GRPOConfig fields a bare TRL script on a CPU sets besides the recipe's values.
BARE_CPU = {"bf16": False, "use_cpu": True, "gradient_checkpointing": False, "activation_checkpointing": False}


class Turnstile:
    """Lets one of several threads run at a time; the running one hands over at a step boundary.

    Each thread's Python, NumPy and torch RNG states are saved when it hands over and put
    back when its turn comes again, so interleaving does not change what a run samples.
    """

    def __init__(self, names: tuple[str, ...]) -> None:
        self.names = names
        self.turn: str | None = names[0]
        self.done: set[str] = set()
        self.states: dict[str, tuple[Any, Any, torch.Tensor]] = {}
        self.condition = threading.Condition()

    def enter(self, name: str) -> None:
        """Wait for ``name``'s first turn."""
        with self.condition:
            self.condition.wait_for(lambda: self.turn == name)

    def hand_over(self, name: str) -> None:
        """Give the turn to the next unfinished thread and wait until it comes back; returns
        at once when every other thread has finished."""
        with self.condition:
            following = self._next(name)
            if following is None:
                return
            self.states[name] = (random.getstate(), np.random.get_state(), torch.get_rng_state())
            self.turn = following
            self.condition.notify_all()
            self.condition.wait_for(lambda: self.turn == name)
            python, numpy, generator = self.states.pop(name)
            random.setstate(python)
            np.random.set_state(numpy)
            torch.set_rng_state(generator)

    def leave(self, name: str) -> None:
        """Mark ``name`` finished (also on an error) and pass the turn on."""
        with self.condition:
            self.done.add(name)
            if self.turn == name:
                self.turn = self._next(name)
                self.condition.notify_all()

    def _next(self, name: str) -> str | None:
        start = self.names.index(name)
        for offset in range(1, len(self.names)):
            candidate = self.names[(start + offset) % len(self.names)]
            if candidate not in self.done:
                return candidate
        return None


class StepClock(TrainerCallback):
    """Wall and CPU marks of every optimizer step; hands the turnstile over before each
    step after the first."""

    def __init__(self, name: str, turnstile: Turnstile | None = None) -> None:
        self.name = name
        self.turnstile = turnstile
        self.begins: list[tuple[float, float]] = []  # (wall, cpu) at on_step_begin
        self.ends: list[tuple[float, float]] = []  # at on_step_end
        self.pauses: list[tuple[float, float]] = []  # when the work after step k-1 was done
        self.train_begin = self.train_end = float("nan")

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.train_begin = time.perf_counter()

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.ends:
            self.pauses.append((time.perf_counter(), time.process_time()))
            if self.turnstile is not None:
                self.turnstile.hand_over(self.name)
        self.begins.append((time.perf_counter(), time.process_time()))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.ends.append((time.perf_counter(), time.process_time()))

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.train_end = time.perf_counter()


@dataclass
class Run:
    """One training run: seconds per measured step, one-off seconds, logged rewards."""

    variant: str
    steps: list[float]  # wall: in step + the work after the previous step, per measured step
    cpu_steps: list[float]  # the same in process CPU time
    in_step: float  # mean on_step_begin..on_step_end (wall)
    prepare: float  # recipe/config, dataset and reward terms, before the training call
    setup: float  # training call .. on_train_begin (tokenizer, model, LoRA, trainer)
    teardown: float  # on_train_end .. return (adapter save, card, clean-up)
    rewards: list[float]

    @property
    def per_step(self) -> float:
        """Mean wall seconds per measured step."""
        return statistics.fmean(self.steps)

    @property
    def cpu_per_step(self) -> float:
        """Mean process CPU seconds per measured step."""
        return statistics.fmean(self.cpu_steps)


def build_episodes(out: Path, roster: Roster) -> Path:
    """Roll out scripted episodes (3 rounds, 4 scenarios x 2 user profiles) to ``out``."""
    from mascot.training.episodes.rollout import collect_episodes

    director = FakeListChatModel(responses=[json.dumps({"speaker": p, "action": "respond", "tone": "warm"})
                                            for p in roster.persona_ids] * 60)
    voice = FakeListChatModel(responses=["I hear you; that sounds hard. What would help most tonight?"] * 500)
    graph = create_director_graph(roster, director=director, speakers=voice, user=voice, max_rounds=3)
    asyncio.run(collect_episodes(graph, load_scenarios(roster.id)[:4], roster.user_profiles[:2],
                                 roster=roster.id, out=out))
    return out


def build_persona_rm(base: Path, dataset: Dataset, out: Path) -> Path:
    """A persona reward model trained for one step on toy pairs over ``dataset``'s prompts,
    saved as ``mascot train-rm`` saves it (so it loads as the CLI's ``--rm`` does)."""
    pairs = [{"prompt": row["prompt"], "chosen": [{"role": "assistant", "content": "I hear you. What would help?"}],
              "rejected": [{"role": "assistant", "content": "Anchor: fine.\nUser: ok"}]} for row in dataset]
    train_reward_model(pairs, [], base=str(base), out=out,
                       config={"lora_r": 8, "lora_alpha": 16, "training": {"max_steps": 1, "disable_tqdm": True}})
    return out


def recipe_flags(steps: int) -> list[str]:
    """The command-line flags both variants run with, on top of the shipped recipe."""
    return ["--max_steps", str(steps), "--disable_tqdm", "true"]


def bare_config(steps: int, output_dir: Path) -> tuple[GRPOConfig, LoraConfig]:
    """The GRPOConfig and LoraConfig a bare TRL script would write from the recipe file's
    values (our ``rm_weight``/``format_weight`` become TRL's ``reward_weights``)."""
    recipe = yaml.safe_load(recipe_path(RECIPE).read_text(encoding="utf-8"))
    values = {k: v for k, v in recipe.items() if k in GRPOConfig.__dataclass_fields__}
    values.update(BARE_CPU, max_steps=steps, disable_tqdm=True)
    weights = [float(recipe["rm_weight"]), float(recipe["format_weight"])]
    args = GRPOConfig(output_dir=str(output_dir), reward_weights=weights, **values)
    lora = LoraConfig(task_type="CAUSAL_LM", r=recipe["lora_r"], lora_alpha=recipe["lora_alpha"],
                      lora_dropout=recipe["lora_dropout"], target_modules=recipe["lora_target_modules"])
    return args, lora


def timings(clock: StepClock, prepared: float, started: float, finished: float, warmup: int,
            rewards: list[float]) -> Run:
    """A ``Run`` from a clock's marks; the first ``warmup`` steps are left out.

    Raises:
        ValueError: if no step is left to time.
    """
    first = max(warmup, 1)  # step 0 has no work before it in the run: never timed
    if len(clock.ends) <= first:
        raise ValueError(f"{len(clock.ends)} steps ran; need more than {first} to time a step")
    # step k (0-based) = the work after step k-1 (ends[k-1]..pauses[k-1]) + the step itself
    measured = range(first, len(clock.ends))
    wall = [(clock.pauses[k - 1][0] - clock.ends[k - 1][0]) + (clock.ends[k][0] - clock.begins[k][0])
            for k in measured]
    cpu = [(clock.pauses[k - 1][1] - clock.ends[k - 1][1]) + (clock.ends[k][1] - clock.begins[k][1])
           for k in measured]
    inside = statistics.fmean(clock.ends[k][0] - clock.begins[k][0] for k in measured)
    return Run(clock.name, steps=wall, cpu_steps=cpu, in_step=inside, prepare=started - prepared,
               setup=clock.train_begin - started, teardown=finished - clock.train_end, rewards=rewards)


def run_ours(base: Path, episodes_file: Path, rm: RewardFunction, out: Path, clock: StepClock, *,
             steps: int, warmup: int) -> Run:
    """``train_speaker`` as ``mascot train-speakers --config speakers-cpu-smoke`` calls it."""
    prepared = time.perf_counter()
    roster = load_roster(ROSTER)
    config, _ = SpeakerTrainingConfig.parse(recipe_path(RECIPE), recipe_flags(steps))
    dataset = speaker_prompts(read_episodes(episodes_file), roster, PERSONA)
    terms = config.reward_terms(roster, PERSONA, reward_model=rm)
    started = time.perf_counter()
    report = train_speaker(dataset, base=str(base), persona=PERSONA, out=out, reward_funcs=terms,
                           config=config, data=str(episodes_file), callbacks=[clock])
    return timings(clock, prepared, started, time.perf_counter(), warmup, report.rewards)


def run_bare(base: Path, prompts_file: Path, reward_funcs: list[RewardFunction], out: Path, clock: StepClock, *,
             steps: int, warmup: int) -> Run:
    """A bare TRL GRPO script on the same model, prompts, rewards and settings."""
    prepared = time.perf_counter()
    rows = [json.loads(line) for line in prompts_file.read_text(encoding="utf-8").splitlines()]
    dataset = Dataset.from_list(rows)
    args, lora = bare_config(steps, out)
    started = time.perf_counter()
    set_seed(args.seed)
    tokenizer = AutoTokenizer.from_pretrained(base)
    model = AutoModelForCausalLM.from_pretrained(base, dtype=torch.float32)
    trainer = GRPOTrainer(model, reward_funcs=reward_funcs, args=args, train_dataset=dataset,
                          processing_class=tokenizer, peft_config=lora, callbacks=[clock])
    trainer.train()
    trainer.save_model(str(out / "final"))
    rewards = [float(e["reward"]) for e in trainer.state.log_history if "reward" in e]
    return timings(clock, prepared, started, time.perf_counter(), warmup, rewards)


def interleaved(jobs: dict[str, Callable[[StepClock], Run]]) -> dict[str, Run]:
    """Run the jobs in threads, one at a time, handing over at every step (in ``jobs``' order).

    Raises:
        RuntimeError: if a job failed (its exception is the cause).
    """
    turnstile = Turnstile(tuple(jobs))
    results: dict[str, Run] = {}
    errors: dict[str, BaseException] = {}

    def work(name: str) -> None:
        turnstile.enter(name)
        try:
            results[name] = jobs[name](StepClock(name, turnstile))
        except BaseException as exc:  # re-raised in the main thread below
            errors[name] = exc
        finally:
            turnstile.leave(name)

    threads = [threading.Thread(target=work, args=(name,), name=f"bench-{name}") for name in jobs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for name, exc in errors.items():
        raise RuntimeError(f"the {name} run failed: {exc}") from exc
    return results


def config_differences(steps: int, work: Path) -> list[str]:
    """GRPOConfig fields whose values differ between ours (as ``train_speaker`` builds it)
    and the bare script's, output folders left out."""
    config, _ = SpeakerTrainingConfig.parse(recipe_path(RECIPE), recipe_flags(steps))
    ours = config.trainer_args(work / "x").to_dict()
    bare = bare_config(steps, work / "x")[0].to_dict()
    skip = {"output_dir", "logging_dir", "reward_weights"}
    return [f"{k}: ours={ours.get(k)!r} bare={bare.get(k)!r}" for k in sorted(set(ours) | set(bare))
            if k not in skip and ours.get(k) != bare.get(k)]


@contextlib.contextmanager
def output_to(log: Path | None) -> Iterator[None]:
    """Send everything written to file descriptors 1 and 2 (trainer logs, warnings, progress
    bars) to ``log``, appended; ``None`` leaves them on the terminal."""
    if log is None:
        yield
        return
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with log.open("ab") as sink:
        os.dup2(sink.fileno(), 1)
        os.dup2(sink.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def spread(values: list[float], digits: int = 3) -> str:
    """``median (min-max)``."""
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


def report(runs: dict[str, list[Run]]) -> None:
    """Print the table of step times and one-off costs, and the ratios ours/bare."""
    print("| variant | s/step median (min-max) | CPU s/step median (min-max) | in step s | after step s "
          "| prepare s | set-up s | after training s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for variant, r in runs.items():
        print(f"| {variant} | {spread([x.per_step for x in r])} | {spread([x.cpu_per_step for x in r])} "
              f"| {statistics.median(x.in_step for x in r):.3f} "
              f"| {statistics.median(x.per_step - x.in_step for x in r):.3f} "
              f"| {statistics.median(x.prepare for x in r):.3f} | {statistics.median(x.setup for x in r):.2f} "
              f"| {statistics.median(x.teardown for x in r):.2f} |")
    ours, bare = runs["ours"], runs["bare"]
    ratio = statistics.median(x.per_step for x in ours) / statistics.median(x.per_step for x in bare)
    cpu = statistics.median(x.cpu_per_step for x in ours) / statistics.median(x.cpu_per_step for x in bare)
    per_repeat = [o.per_step / b.per_step for o, b in zip(ours, bare, strict=True)]
    per_step = [a / b for o, r in zip(ours, bare, strict=True) for a, b in zip(o.steps, r.steps, strict=True)]
    print()
    print(f"ours/bare s/step: {ratio:.3f}x (medians); CPU {cpu:.3f}x; paired per repeat {spread(per_repeat)}; "
          f"paired per step {spread(per_step)}")
    print(f"target ours <= 1.1x bare: {'met' if ratio <= 1.1 else 'NOT met'}")


def main() -> None:
    """Build the model, episodes and persona RM once, run both variants interleaved, print the table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="timed optimizer steps per run (after warm-up)")
    parser.add_argument("--warmup", type=int, default=1, help="steps left out at the start of every run")
    parser.add_argument("--repeats", type=int, default=4, help="interleaved pairs of runs; the first alternates")
    parser.add_argument("--verbose", action="store_true", help="show the trainers' logs and warnings")
    args = parser.parse_args()
    if args.steps < 1 or args.warmup < 0 or args.repeats < 1:
        parser.error(f"--steps {args.steps}, --warmup {args.warmup}, --repeats {args.repeats}: "
                     "need steps >= 1, warmup >= 0, repeats >= 1")
    total = args.steps + max(args.warmup, 1)  # step 0 has no preceding work: never timed
    roster = load_roster(ROSTER)
    with tempfile.TemporaryDirectory(prefix="mascot-overhead-") as scratch:
        work = Path(scratch)
        log = None if args.verbose else work / "trainer.log"
        with output_to(log):
            started = time.perf_counter()
            base = build_tiny_model(work / "tiny")
            model_s = time.perf_counter() - started
            episodes_file = build_episodes(work / "episodes.jsonl", roster)
            dataset = speaker_prompts(read_episodes(episodes_file), roster, PERSONA)
            prompts_file = work / "prompts.jsonl"  # the bare script's data: our prompt column, dumped
            prompts_file.write_text("".join(json.dumps({"prompt": p}) + "\n" for p in dataset["prompt"]),
                                    encoding="utf-8")
            build_persona_rm(base, dataset, work / "persona-rm")
            started = time.perf_counter()
            rm = RewardModel.load(work / "persona-rm").reward_function()  # as the CLI loads --rm
            rm_s = time.perf_counter() - started
            differences = config_differences(total, work)
        fmt = roster_format_reward(roster, PERSONA)
        lengths = [len(p) for p in dataset["prompt"]]
        print(f"recipe {RECIPE} + {' '.join(recipe_flags(total))}; persona {PERSONA}, {len(dataset)} prompts "
              f"({min(lengths)}-{max(lengths)} messages); rewards: persona RM x1.0 + format x0.5")
        print(f"{args.repeats} repeats x {total} steps per variant, interleaved step by step, first "
              f"{total - args.steps} step(s) not timed; torch {torch.get_num_threads()} threads on "
              f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.2f}")
        print("GRPOConfig differences ours vs bare: " + ("; ".join(differences) if differences else "none"))
        runs: dict[str, list[Run]] = {variant: [] for variant in VARIANTS}
        same_work = True
        for rep in range(args.repeats):
            jobs: dict[str, Callable[[StepClock], Run]] = {
                "ours": lambda clock, rep=rep: run_ours(base, episodes_file, rm, work / f"ours-{rep}", clock,
                                                        steps=total, warmup=args.warmup),
                "bare": lambda clock, rep=rep: run_bare(base, prompts_file, [rm, fmt], work / f"bare-{rep}", clock,
                                                        steps=total, warmup=args.warmup),
            }
            order = VARIANTS if rep % 2 == 0 else VARIANTS[::-1]
            with output_to(log):
                results = interleaved({name: jobs[name] for name in order})
            for variant in VARIANTS:
                runs[variant].append(results[variant])
            ours, bare = results["ours"], results["bare"]
            same = len(ours.rewards) == len(bare.rewards) and all(
                abs(a - b) <= 1e-4 for a, b in zip(ours.rewards, bare.rewards, strict=True))
            same_work = same_work and same
            print(f"  repeat {rep} ({order[0]} first): ours {ours.per_step:.3f} s/step, bare {bare.per_step:.3f} "
                  f"s/step, ratio {ours.per_step / bare.per_step:.3f}; same rewards: {'yes' if same else 'NO'}; "
                  f"load average {os.getloadavg()[0]:.2f}", flush=True)
        print()
        report(runs)
        print(f"same samples (logged rewards equal in every repeat): {'yes' if same_work else 'NO'}")
        print(f"shared one-off costs: tiny model build {model_s:.2f} s, persona RM load {rm_s:.2f} s. "
              "prepare = recipe parse + episodes -> speaker_prompts + reward terms (ours); "
              "prompts JSONL -> Dataset + GRPOConfig (bare)")


if __name__ == "__main__":
    main()
