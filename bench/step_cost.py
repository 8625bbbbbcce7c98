"""What a training step costs on this CPU, before and after the step-cost changes, side by side.

Each method (Director GRPO, speaker GRPO, SFT, DPO) trains the offline Qwen2.5-Coder-0.5B-
Instruct (``mascot offline-model``) with LoRA r=8 on q/k/v/o for a few steps in one process
per variant, the variants run one after another in the same invocation:

- ``before``: the system allocator (glibc malloc as it comes), LoRA on every layer;
- ``jemalloc``: jemalloc as mascot sets it (``mascot.policies.allocator``: freed pages kept for
  SFT and DPO, given back after 10 s for GRPO, whose in-process sampling fragments the heap),
  every layer;
- ``after``: jemalloc, LoRA on the upper half of the layers (``lora_layer_share: 0.5``);
- ``glibc``: glibc's raised thresholds (the fallback where jemalloc is missing), upper half.

``director-server`` is the Director step as ``train-director --engine vllm`` runs it: the 8
directions sampled on a vLLM server (LoRA on the trained modules alone, the adapter saved and
loaded once per step) and each played for one turn by the speakers on the same server
(``DirectorRollout``), so the trainer only runs forward and backward passes (allocator mode
``train``). The server is started once for all its variants.

The prompts are the real ones: the Director's at the opening of the roster's scenarios
(``mascot.graphs.prompts.director_messages``, ~600 tokens with the guidance) and a speaker's
(``speaker_messages``), rendered as the trainers render them. GRPO samples 2 prompts x 4
completions in process (TRL's own generation; the reward is a cheap JSON check, so the
figure is the trainer's cost, not a block rollout's); SFT trains batches of 4 prompt +
direction rows, DPO 2 pairs. Printed per method and variant: seconds per step (median of the
steps after the first), the ratio to ``before``, peak RSS and RSS after each step (flat memory
shows as equal numbers), and the prompt token counts. Written to
``bench/results/step_cost.json``.

    python bench/step_cost.py                              # every method and variant (~25 min here)
    python bench/step_cost.py --methods director --steps 4
"""

from __future__ import annotations

import argparse
import contextlib
import json
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "bench" / "results" / "step_cost.json"
#: Variant -> (allocator, LoRA layer share).
VARIANTS = {"before": ("system", 1.0), "jemalloc": ("jemalloc", 1.0), "after": ("jemalloc", 0.5),
            "glibc": ("glibc", 0.5)}
METHODS = ("director", "director-server", "speaker", "sft", "dpo")
ROSTER = "emotional_support"
DIRECTION = '{"speaker": "catalyst", "action": "Ask what they think went wrong on the test", "tone": "calm, curious"}'


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", metavar="DIR", default=str(Path("~/.cache/mascot/qwen2.5-coder-0.5b-instruct")
                                                              .expanduser()), help="the offline 0.5B model folder")
    parser.add_argument("--methods", default=",".join(METHODS), help=f"comma-separated, of {', '.join(METHODS)}")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps per run (the first is left out)")
    parser.add_argument("--out", default=str(RESULTS), help="the JSON results file")
    parser.add_argument("--worker", nargs=2, metavar=("METHOD", "SHARE"), help=argparse.SUPPRESS)
    parser.add_argument("--server", metavar="URL", help=argparse.SUPPRESS)
    args = parser.parse_args()
    from mascot.cli.main import stop_on_signals

    stop_on_signals()  # SIGTERM and SIGHUP stop its vLLM server and worker too, as Ctrl-C does
    if args.worker:
        print(json.dumps(worker(args.model, args.worker[0], float(args.worker[1]), args.steps, args.server)))
        return 0
    methods = [m for m in args.methods.split(",") if m]
    variants = [v for v in args.variants.split(",") if v]
    bad = [m for m in methods if m not in METHODS] + [v for v in variants if v not in VARIANTS]
    if bad or args.steps < 2:
        parser.error(f"unknown method or variant {', '.join(bad)}" if bad else "--steps must be at least 2")
    if not Path(args.model, "config.json").is_file():
        parser.error(f"no model in {args.model}: run mascot offline-model first")

    from mascot.policies.allocator import jemalloc_library
    from mascot.policies.local.precision import cpu_has_native_bf16

    machine = {"cpu": _cpu_name(), "cores": len(__import__("os").sched_getaffinity(0)),
               "native_bf16": cpu_has_native_bf16(), "jemalloc": jemalloc_library(),
               "python": platform.python_version()}
    print(f"machine: {machine}", file=sys.stderr)
    results: dict[str, Any] = {"machine": machine, "steps": args.steps, "model": args.model, "runs": {}}
    with contextlib.ExitStack() as servers:
        server = None
        if "director-server" in methods:  # the blocks' speakers and the directions on one vLLM server
            from mascot.policies.serving import ServedPolicies
            from mascot.policies.vllm import VllmServer

            server = servers.enter_context(VllmServer(
                ServedPolicies(base=args.model), allow_runtime_lora=True, lora_rank=8, max_loras=2,
                lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"]))
        run_all(args, methods, variants, results, server)
    print(table(results))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    return 0


def run_all(args: argparse.Namespace, methods: list[str], variants: list[str], results: dict[str, Any],
            server: Any) -> None:
    """Each method and variant in its own process, one after another."""
    from mascot.policies.allocator import allocator_env, jemalloc_library

    for method in methods:
        for variant in variants:
            allocator, share = VARIANTS[variant]
            if allocator == "jemalloc" and jemalloc_library() is None:
                print(f"{method}/{variant}: skipped, jemalloc is not installed", file=sys.stderr)
                continue
            # GRPO samples in process here: the mode that gives memory back (mascot.policies.allocator)
            env = allocator_env(choice=allocator, mode="generate" if method in ("director", "speaker") else "train")
            env["HF_HUB_OFFLINE"] = "1"
            started = time.monotonic()
            done = subprocess.run([sys.executable, __file__, "--model", args.model, "--steps", str(args.steps),
                                   "--worker", method, str(share), *(["--server", server.url] if server else [])],
                                  env=env, capture_output=True, text=True)
            if done.returncode != 0:
                raise SystemExit(f"{method}/{variant} failed: {done.stderr.strip().splitlines()[-1:]}")
            run = json.loads(done.stdout.strip().splitlines()[-1])
            run["wall_s"] = round(time.monotonic() - started, 1)
            results["runs"][f"{method}/{variant}"] = run
            print(f"{method}/{variant}: {run['step_s']:.1f} s/step (steps {run['steps_s']}), peak RSS "
                  f"{run['peak_rss_gib']:.1f} GiB, RSS per step {run['rss_gib']}", file=sys.stderr, flush=True)


def table(results: dict[str, Any]) -> str:
    """Seconds per step and the ratio to ``before``, per method and variant."""
    lines = ["| method | variant | allocator | LoRA layers | s/step | x before | peak RSS GiB | prompt tokens |",
             "|---|---|---|---|---|---|---|---|"]
    for key, run in results["runs"].items():
        method, variant = key.split("/")
        before = results["runs"].get(f"{method}/before")
        ratio = f"{run['step_s'] / before['step_s']:.2f}" if before else "-"
        allocator, share = VARIANTS[variant]
        lines.append(f"| {method} | {variant} | {allocator} | {'upper half' if share < 1 else 'all'} | "
                     f"{run['step_s']:.1f} | {ratio} | {run['peak_rss_gib']:.1f} | {run['prompt_tokens']} |")
    return "\n".join(lines)


def worker(model: str, method: str, share: float, steps: int, server: str | None = None) -> dict[str, Any]:
    """Train ``method`` for ``steps`` steps in this process; seconds and memory per step."""
    import torch
    from datasets import Dataset
    from langchain_core.messages import HumanMessage
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import DPOConfig, DPOTrainer, GRPOConfig, GRPOTrainer, SFTConfig, SFTTrainer

    from mascot.graphs.direction import StageDirection
    from mascot.graphs.prompts import director_messages, speaker_messages
    from mascot.messages import chat_messages
    from mascot.policies.allocator import active_allocator
    from mascot.policies.local.precision import cpu_has_native_bf16
    from mascot.rosters import load_roster, load_scenarios
    from mascot.training.fitting.director_training import DirectorTrainingConfig

    torch.manual_seed(0)
    roster = load_roster(ROSTER)
    openings = [s.opening for s in load_scenarios(ROSTER)][:8]
    director = [chat_messages(director_messages(roster, [HumanMessage(o)], round_turns=0, max_speakers_per_round=3,
                                                min_speakers_per_round=1)) for o in openings]
    direction = StageDirection(speaker="catalyst", action="Ask what they think went wrong", tone="calm, curious")
    speaker = [chat_messages(speaker_messages(roster, roster.persona("catalyst"), direction, [HumanMessage(o)]))
               for o in openings]
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompts = director if method in ("director", "sft", "dpo") else speaker
    lengths = [len(tokenizer(tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False),
                             add_special_tokens=False)["input_ids"]) for p in prompts]
    bf16 = cpu_has_native_bf16()
    loaded = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16 if bf16 else torch.float32)
    recipe = DirectorTrainingConfig(lora_r=8, lora_alpha=16, lora_dropout=0.0,
                                    lora_target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                                    lora_layer_share=share)
    peft = recipe.lora_config(loaded)
    clock = _StepClock(TrainerCallback)
    common = {"output_dir": tempfile.mkdtemp(prefix="step-cost-"), "max_steps": steps, "use_cpu": True,
              "bf16": bf16, "report_to": "none", "save_strategy": "no", "logging_steps": 1, "seed": 0,
              "gradient_checkpointing": False, "disable_tqdm": True}

    def reward(completions: list[Any], **kwargs: Any) -> list[float]:
        """1 for a reply that parses as a JSON object, else 0 (cheap: the trainer's cost is measured)."""
        out = []
        for completion in completions:
            text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
            try:
                out.append(float(isinstance(json.loads(text), dict)))
            except ValueError:
                out.append(0.0)
        return out

    if method == "director-server":
        trainer = _server_trainer(loaded, tokenizer, roster, openings, peft, clock, common, server, model)
    elif method in ("director", "speaker"):
        config = GRPOConfig(**common, num_generations=4, per_device_train_batch_size=8, beta=0.0,
                            max_completion_length=64 if method == "director" else 112, temperature=1.0,
                            learning_rate=2e-4)
        trainer = GRPOTrainer(loaded, reward_funcs=[reward], args=config, processing_class=tokenizer,
                              train_dataset=Dataset.from_list([{"prompt": p} for p in prompts]), peft_config=peft,
                              callbacks=[clock])
    elif method == "sft":
        rows = [{"prompt": p, "completion": [{"role": "assistant", "content": DIRECTION}]} for p in prompts]
        trainer = SFTTrainer(loaded, args=SFTConfig(**common, per_device_train_batch_size=4, learning_rate=2e-4,
                                                    max_length=2048),
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft,
                             callbacks=[clock])
    else:
        rows = [{"prompt": p, "chosen": [{"role": "assistant", "content": DIRECTION}],
                 "rejected": [{"role": "assistant", "content": "I'm sorry, but I can't help with that."}]}
                for p in prompts]
        trainer = DPOTrainer(loaded, args=DPOConfig(**common, per_device_train_batch_size=2, learning_rate=2e-4,
                                                    max_length=2048),
                             train_dataset=Dataset.from_list(rows), processing_class=tokenizer, peft_config=peft,
                             callbacks=[clock])
    trainer.train()
    measured = clock.times[1:]
    return {"method": method, "share": share, "allocator": active_allocator(), "bf16": bf16,
            "step_s": statistics.median(measured), "steps_s": [round(t, 1) for t in clock.times],
            "rss_gib": [round(r / 2**30, 2) for r in clock.rss],
            "peak_rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
            "prompt_tokens": {"min": min(lengths), "max": max(lengths), "mean": round(sum(lengths) / len(lengths))},
            "lora_layers": peft.layers_to_transform}


def _server_trainer(model: Any, tokenizer: Any, roster: Any, openings: list[str], peft: Any, clock: Any,
                    common: dict[str, Any], url: str | None, base: str) -> Any:
    """Director GRPO whose directions are sampled on the vLLM server at ``url`` and played for
    one turn there by the speakers (``DirectorRollout``); rewarded by direction validity."""
    from datasets import Dataset
    from langchain_core.messages import HumanMessage
    from trl import GRPOConfig, GRPOTrainer

    from mascot.graphs.prompts import director_messages
    from mascot.messages import chat_messages
    from mascot.policies import Policies, PolicySpec
    from mascot.training.data.block_rollout import BlockRollout, DecisionPoint
    from mascot.training.fitting.director_rewards import VALIDITY_REWARD
    from mascot.training.fitting.director_rollout import DirectorRollout

    if url is None:
        raise SystemExit("director-server needs the vLLM server (run without --worker)")
    points = [DecisionPoint(context_id=f"opening-{i}", episode_id=f"e{i}", cut=1, messages=(HumanMessage(o),),
                            round=0, round_turns=0, scenario=None, user_profile=None,
                            prompt=tuple(chat_messages(director_messages(
                                roster, [HumanMessage(o)], round_turns=0, max_speakers_per_round=3,
                                min_speakers_per_round=1))))
              for i, o in enumerate(openings)]
    served = Path(base).name
    policies = Policies.single(PolicySpec(kind="openai", model=served, base_url=url, max_tokens=112, temperature=0.7,
                                          timeout=600), roster)
    blocks = BlockRollout(roster, speakers=policies.speakers(), director=policies.chat_model("director"), user=None,
                          block_turns=1)
    rollout = DirectorRollout(points, blocks, url=url, served_name=served,
                              adapters_dir=tempfile.mkdtemp(prefix="step-cost-served-"))

    def validity(completions: list[Any], block: list[Any], **kwargs: Any) -> list[float]:
        return [VALIDITY_REWARD[b.validity] for b in block]

    config = GRPOConfig(**common, num_generations=4, per_device_train_batch_size=8, beta=0.0,
                        max_completion_length=64, temperature=1.0, learning_rate=2e-4)
    return GRPOTrainer(model, reward_funcs=[validity], args=config, processing_class=tokenizer,
                       train_dataset=Dataset.from_list([{"prompt": list(p.prompt)} for p in points]),
                       peft_config=peft, callbacks=[clock], rollout_func=rollout)


def _StepClock(base: type) -> Any:  # noqa: N802 - a class made on the worker's import of transformers
    class StepClock(base):  # type: ignore[misc, valid-type]
        """Wall time and resident memory of every optimizer step."""

        def __init__(self) -> None:
            self.times: list[float] = []
            self.rss: list[int] = []

        def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.start = time.perf_counter()

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.times.append(time.perf_counter() - self.start)
            pages = int(Path("/proc/self/statm").read_text().split()[1])
            self.rss.append(pages * resource.getpagesize())

    return StepClock()


def _cpu_name() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        print(f"step_cost: interrupted ({stopped or 'Ctrl-C'})", file=sys.stderr)
        sys.exit(130)
