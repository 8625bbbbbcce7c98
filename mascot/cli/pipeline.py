"""``mascot pipeline`` (a recipe, end to end, resumable) and ``mascot demo`` (the same, offline)."""

from __future__ import annotations

import argparse
import json
from contextlib import nullcontext
from pathlib import Path

import yaml

from mascot.cli.options import UsageError, err, out


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``pipeline`` and ``demo`` to the command line."""
    pipeline = commands.add_parser("pipeline", help="rollout -> judge -> pairs -> RMs -> training -> eval, resumable")
    pipeline.add_argument("--recipe", required=True, metavar="FILE", help="pipeline recipe (YAML)")
    pipeline.set_defaults(run=_pipeline)
    demo = commands.add_parser("demo", help="the whole method end to end on the CPU, offline, in minutes")
    demo.add_argument("--out", default="mascot-demo", metavar="DIR", help="where everything goes (default mascot-demo)")
    demo.add_argument("--model", metavar="M", help="a real model (Hub id or folder) instead of the tiny random one")
    demo.add_argument("--judge-model", metavar="M",
                      help="with --model: the judge (default: the offline 1.5B model when `mascot offline-model "
                           "--model qwen2.5-coder-1.5b-instruct` has built it into the cache, else --model itself)")
    demo.add_argument("--engine", choices=("local", "vllm"), default="local",
                      help="what runs the generating stages; vllm only with --model (the demo's tiny random model "
                           "runs on the local engine)")
    demo.set_defaults(run=_demo)


def _pipeline(args: argparse.Namespace) -> int:
    from mascot.cli.pipeline_run import PipelineError, run_pipeline

    if not Path(args.recipe).is_file():
        raise UsageError(f"--recipe: no such file {args.recipe}")
    try:
        report = run_pipeline(args.recipe, on_stage=_show_stage)
    except PipelineError as exc:
        raise UsageError(str(exc)) from None
    out.print(f"pipeline: done; report {report}", markup=False)
    return 0


def _show_stage(name: str, state: str) -> None:
    err.print(f"[{name}] {state}", markup=False)


def _demo(args: argparse.Namespace) -> int:
    from mascot.cli.pipeline_run import PipelineError, check_extras, run_pipeline
    from mascot.rosters import load_scenarios
    from mascot.testing.stub_server import start_stub_server

    try:
        check_extras()  # before minutes of work, not at the last stage
    except PipelineError as exc:
        raise UsageError(str(exc)) from None
    if args.engine == "vllm" and not args.model:
        raise UsageError("--engine vllm needs --model "
                         "(a real model; the tiny random one is built for the local engine)")
    if args.judge_model and not args.model:
        raise UsageError("--judge-model goes with --model (the tiny random model is judged by the stub server)")
    folder = Path(args.out).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    if args.model:
        model = args.model
    else:
        from mascot.testing.tiny_model import build_tiny_model

        model = str(folder / "tiny-model")
        if not (folder / "tiny-model" / "config.json").is_file():
            build_tiny_model(model)
    # two scenarios for training (so blocks of different people share openings), others held out for eval
    scenarios = load_scenarios("emotional_support")
    for name, chosen in (("train-scenarios.jsonl", scenarios[:2]), ("eval-scenarios.jsonl", scenarios[2:5])):
        (folder / name).write_text("".join(json.dumps(s.model_dump()) + "\n" for s in chosen), encoding="utf-8")
    judge_model = None
    if args.model:
        from mascot.offline.model import OFFLINE_JUDGE, built_offline_model

        judge_model = args.judge_model or str(built_offline_model(OFFLINE_JUDGE) or model)
    with start_stub_server() if not args.model else nullcontext() as stub:
        recipe = {**demo_recipe(model, judge_url=stub.url if stub else None, judge_model=judge_model),
                  "engine": args.engine}
        recipe_file = folder / "recipe.yaml"
        recipe_file.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
        judged_by = "the stub server (scores derived from a hash of the text)" if stub else judge_model
        err.print(f"demo: model {model}; judge {judged_by}", markup=False)
        try:
            report = run_pipeline(recipe_file, on_stage=_show_stage)
        except PipelineError as exc:
            raise UsageError(str(exc)) from None
    _note_model(report, model, tiny=not args.model, judge=judge_model)
    out.print(f"demo: report {report}\ndemo: trained policy file {folder / 'adapters' / 'policies.yaml'} "
              f"(mascot chat --roster emotional_support --policies {folder / 'adapters' / 'policies.yaml'})",
              markup=False)
    return 0


def demo_recipe(model: str, *, judge_url: str | None, judge_model: str | None = None) -> dict:
    """The demo's pipeline recipe on ``model``.

    Args:
        model: The base model of every policy and reward model.
        judge_url: The stub server judging the tiny model; ``None``: a real model judges
            (``judge_model``, default ``model`` itself) and every role gets its own reply
            budget (a real model's directions and replies must never be cut), where the tiny
            model's noise gets 16 tokens.
        judge_model: The real judge (a stronger model than the policy, as in the paper).
    """
    budget = {} if judge_url is None else {"max_tokens": 16}
    judge = ({"model": "stub-judge", "base_url": judge_url, "block_turns": 2} if judge_url else
             {"model": judge_model or model, "block_turns": 2})
    return {
        "roster": "emotional_support", "model": model, "out": ".",
        "rollout": {"scenarios": "train-scenarios.jsonl", "episodes": 6, "max_rounds": 1, **budget},
        "judge": judge, "group-blocks": {"g": 3, "max_points": 12, **budget}, "candidates": 3, "min_margin": 0.5,
        "reward-models": {"flags": ["--max_steps", "4"]},
        "speakers": {"config": "speakers-cpu-smoke", "flags": ["--max_steps", "2"]},
        "director": {"config": "director-cpu-smoke", "block_turns": 1, "flags": ["--max_steps", "1"]},
        "eval": {"scenarios": "eval-scenarios.jsonl", "episodes": 3, **budget, "ablations": True,
                 "baselines": ["zero_shot", "round_robin", "random"]},
    }


def _note_model(report: Path, model: str, *, tiny: bool, judge: str | None = None) -> None:
    """Say plainly at the top of the report what the numbers can and cannot show."""
    judged = "by itself" if judge in (None, model) else f"by `{judge}`"
    note = (f"> **Demo run.** Model: `{model}`" + (
        ", a tiny random-weight model built offline, judged by the stub server (scores derived from a hash of "
        "the text). It shows the machinery end to end (rollouts, judging, reward models, GRPO, evaluation), "
        "not conversation quality: the numbers below mean nothing about the method." if tiny else
        f", judged {judged}. Small sizes (few episodes and steps): a smoke run, not a result.") + "\n\n")
    text = report.read_text(encoding="utf-8")
    if not text.startswith("# Evaluation report\n\n> **Demo run.**"):
        report.write_text(text.replace("# Evaluation report\n\n", "# Evaluation report\n\n" + note, 1),
                          encoding="utf-8")
