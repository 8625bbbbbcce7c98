"""The whole method as one resumable run: ``mascot pipeline --recipe FILE`` and ``mascot demo``.

A pipeline recipe (YAML) names the roster, the base model, where episodes come from (a
synthetic rollout, or ``import-logs`` from an app's checkpointer database), the judge, and
the settings of each stage. Each stage runs as its own ``mascot`` command in a child
process (so every stage is exactly what a user would run by hand) and leaves a marker in
``OUT/.stages/`` with the command it ran; a rerun skips the stages whose command is
unchanged and already finished, and each command resumes its own partial work.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import subprocess
import time
from collections.abc import Callable
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import yaml

from mascot.cli.child import mascot_command
from mascot.cli.pipeline_recipe import (
    JudgeStage,
    PipelineError,
    PipelineRecipe,
    TrainStage,
    load_recipe,
)
from mascot.cli.selection_stages import selection_stages


def stages(recipe: PipelineRecipe, base: Path) -> list[tuple[str, list[str]]]:
    """Every stage as (name, ``mascot`` arguments), in order."""
    out = _path(recipe.out, base)
    model = _model(recipe, base)
    roster = ["--roster", recipe.roster]
    policies = out / "base-policies.yaml"
    local = [*roster, "--policies", str(policies)]
    engine = ["--engine", recipe.engine] if recipe.engine != "local" else []  # local: the commands as before
    judge = [*_judge_flags(recipe.judge, base), *engine]
    modes = ["--modes", ",".join(recipe.judge.modes)] if recipe.judge.modes != ["absolute"] else []
    episodes = str(out / "episodes.jsonl")
    candidates = recipe.candidates
    plan: list[tuple[str, list[str]]] = []
    if recipe.rollout is not None:
        r = recipe.rollout
        plan.append(("rollout", ["rollout", *local, *engine, *_budget_flag(r.max_tokens), "--episodes",
                                 str(r.episodes), "--max-rounds", str(r.max_rounds), "--seed", str(recipe.seed),
                                 *_file_flag("--scenarios", r.scenarios, base),
                                 *_file_flag("--profiles", r.profiles, base), "--out", episodes]))
    else:
        plan.append(("import-logs", ["import-logs", "--from", recipe.import_logs.source, *roster, "--out", episodes]))
    if recipe.selection is not None:
        return plan + _selection_plan(recipe, base, episodes, policies, judge)
    plan += [
        ("blocks", ["blocks", "--in", episodes, *local, *engine, "--g", str(recipe.group_blocks.g), "--block-turns",
                    str(recipe.judge.block_turns), *_budget_flag(recipe.group_blocks.max_tokens),
                    *(["--max-points", str(recipe.group_blocks.max_points)] if recipe.group_blocks.max_points else []),
                    "--seed", str(recipe.seed), "--out", str(out / "blocks.jsonl")]),
        # the policy model's stages together, then the judge's: a pipeline on vLLM runs one
        # server at a time where it can
        ("candidates", ["candidates", "--in", episodes, *local, *engine, "--k", str(candidates.k),
                        *(["--max-contexts", str(candidates.max_contexts)] if candidates.max_contexts else []),
                        *_budget_flag(recipe.rollout.max_tokens if recipe.rollout else None),
                        "--seed", str(recipe.seed), "--out", str(out / "candidates.jsonl")]),
        *([("samples", ["samples", "--in", episodes, *local, *engine, "--k", str(recipe.samples.k),
                        *(["--teacher-model", _teacher(recipe, base)] if recipe.samples.teacher else []),
                        *(["--max-points", str(recipe.samples.max_points)] if recipe.samples.max_points else []),
                        *(["--max-contexts", str(recipe.samples.max_contexts)] if recipe.samples.max_contexts
                          else []),
                        *_budget_flag(recipe.rollout.max_tokens if recipe.rollout else None),
                        "--seed", str(recipe.seed), "--out", str(out / "samples.jsonl")])]
          if recipe.samples is not None else []),
        # the judge on the roster's fixed sanity sets, in each mode: a judge under 75 % (or with
        # p >= 0.01 against chance) in every mode leaves the labels of that rubric to the metric
        # judge alone; else the best mode that passed labels
        ("judge-sanity-persona", ["judge", "--sanity", "--rubric", "persona", *roster, *judge, *modes,
                                  "--out", str(out / "sanity-persona.json")]),
        ("judge-sanity-group", ["judge", "--sanity", "--rubric", "group", *roster, *judge, *modes,
                                "--out", str(out / "sanity-group.json")]),
        ("judge-blocks", ["judge", "--in", str(out / "blocks.jsonl"), "--rubric", "group", *roster, *judge,
                          *_mode_from(recipe.judge, out / "sanity-group.json"),
                          "--out", str(out / "judged-blocks.jsonl")]),
        ("judge-candidates", ["judge", "--in", str(out / "candidates.jsonl"), "--rubric", "persona", *roster,
                              *judge, *_mode_from(recipe.judge, out / "sanity-persona.json"),
                              "--out", str(out / "judged.jsonl")]),
        ("pairs", ["pairs", "--in", str(out / "judged.jsonl"), "--min-margin", str(recipe.min_margin),
                   "--sanity", str(out / "sanity-persona.json"), *roster,
                   "--seed", str(recipe.seed), "--out", str(out / "pairs")]),
        ("group-pairs", ["pairs", "--in", str(out / "judged-blocks.jsonl"), "--min-margin",
                         str(recipe.min_margin), "--sanity", str(out / "sanity-group.json"), *roster,
                         "--seed", str(recipe.seed), "--out", str(out / "group-pairs")]),
        ("persona-rm", ["train-rm", "--pairs", str(out / "pairs"), "--base", model,
                        *_recipe(recipe.reward_models, base), "--out", str(out / "rm-persona")]),
        ("group-rm", ["train-rm", "--pairs", str(out / "group-pairs"), "--base", model,
                      *_recipe(recipe.reward_models, base), "--out", str(out / "rm-group")]),
    ]
    warm = {}
    if recipe.sft is not None:
        data = (["--samples", str(out / "samples.jsonl"), "--keep", str(recipe.samples.keep)] if recipe.samples
                else ["--pairs", str(out / "pairs"), "--group-pairs", str(out / "group-pairs"), "--blocks",
                      str(out / "blocks.jsonl"), "--episodes", episodes])
        plan.append(("sft", ["train-sft", *roster, "--base", model, *data, *_recipe(recipe.sft, base),
                             "--out", str(out / "sft")]))
        warm = {role: ["--init_adapter", str(out / "sft" / role)] for role in ("speakers", "director")}
    speakers = ["train-speakers", *roster, "--base", model, "--out", str(out / "adapters")]
    if recipe.speakers.method == "dpo":
        speakers += ["--method", "dpo", "--pairs", str(out / "pairs")]
    else:
        speakers += ["--episodes", episodes, "--rm", str(out / "rm-persona")]
    plan.append(("speakers", [*speakers, *_recipe(recipe.speakers, base), *warm.get("speakers", [])]))
    director = ["train-director", *roster, *engine, "--base", model, "--episodes", episodes, "--group-rm",
                str(out / "rm-group"), "--speakers", str(out / "adapters" / "policies.yaml"), "--out",
                str(out / "adapters")]
    if recipe.director.block_turns:
        director += ["--block-turns", str(recipe.director.block_turns)]
    plan.append(("director", [*director, *_recipe(recipe.director, base), *warm.get("director", [])]))
    e = recipe.eval
    plan.append(("eval", ["eval", *roster, "--policies", str(out / "adapters" / "policies.yaml"),
                          "--baselines", ",".join(e.baselines), *(["--ablations"] if e.ablations else []),
                          *(["--sft", str(out / "sft" / "policies.yaml")] if recipe.sft is not None else []),
                          *_file_flag("--scenarios", e.scenarios, base),
                          "--episodes", str(e.episodes), "--max-rounds", str(e.max_rounds),
                          *_budget_flag(e.max_tokens), "--rubrics", ",".join(e.rubrics),
                          "--concurrency", str(e.concurrency),
                          *(["--metrics-only", ",".join(e.metrics_only)] if e.metrics_only else []),
                          "--seed", str(recipe.seed), *_judge_flags(recipe.judge, base, "judge-"), *engine,
                          "--out", str(out / "eval")]))
    return plan


def _selection_plan(recipe: PipelineRecipe, base: Path, episodes: str, policies: Path,
                    judge: list[str]) -> list[tuple[str, list[str]]]:
    """Learning by selection, then the evaluation of what it trained."""
    out = _path(recipe.out, base)
    selection = recipe.selection
    teacher = None
    if selection.teacher:
        local = _path(selection.teacher, base)
        teacher = str(local) if local.exists() else selection.teacher
    plan, trained = selection_stages(
        selection, roster=["--roster", recipe.roster], model=_model(recipe, base), teacher=teacher,
        episodes=episodes, base_policies=policies, out=out,
        engine=["--engine", recipe.engine] if recipe.engine != "local" else [],
        budget=_budget_flag(recipe.rollout.max_tokens if recipe.rollout else None), seed=recipe.seed,
        config=lambda file: ["--config", str(_path(file, base))] if file else [])
    last = out / "select" / str(selection.iterations - 1) / "policies.yaml"
    e = recipe.eval
    plan.append(("eval", ["eval", "--roster", recipe.roster, "--policies", str(trained),
                          "--baselines", ",".join(e.baselines), *(["--ablations"] if e.ablations else []),
                          *(["--sft", str(last)] if trained != last else []),
                          *_file_flag("--scenarios", e.scenarios, base),
                          "--episodes", str(e.episodes), "--max-rounds", str(e.max_rounds),
                          *_budget_flag(e.max_tokens), "--rubrics", ",".join(e.rubrics), "--concurrency",
                          str(e.concurrency), *(["--metrics-only", ",".join(e.metrics_only)] if e.metrics_only else []),
                          "--seed", str(recipe.seed), *_judge_flags(recipe.judge, base, "judge-"),
                          *(judge[judge.index("--engine"):judge.index("--engine") + 2] if "--engine" in judge else []),
                          "--out", str(out / "eval")]))
    return plan


def _budget_flag(budget: int | str | None) -> list[str]:
    """``--max-tokens`` of a stage, or nothing (each role's default budget)."""
    return [] if budget is None else ["--max-tokens", str(budget)]


# what the stages import, by the extra of mascot that installs it
_EXTRAS = {
    "train": ("torch", "transformers", "peft", "trl", "datasets", "accelerate"),
    "eval": ("matplotlib",),
}


def check_extras() -> None:
    """Refuse to start a pipeline that would fail at a late stage for want of an extra.

    Raises:
        PipelineError: naming the missing modules and the install command.
    """
    missing = {extra: [m for m in modules if importlib.util.find_spec(m) is None]
               for extra, modules in _EXTRAS.items()}
    missing = {extra: modules for extra, modules in missing.items() if modules}
    if missing:
        names = ", ".join(m for modules in missing.values() for m in modules)
        raise PipelineError(f"the pipeline needs mascot's {', '.join(missing)} extra ({names} not installed); "
                            f"install it first: pip install \"mascot[{','.join(missing)}]\"")


def run_pipeline(
    recipe_file: str | Path,
    *,
    on_stage: Callable[[str, str], None] = lambda name, state: None,
    env: dict[str, str] | None = None,
) -> Path:
    """Run every stage of a recipe not already finished with the same command, and every
    stage that reads what a stage of this run wrote (each command resumes its own work,
    e.g. a judge only judges what its cache lacks).

    Args:
        recipe_file: The pipeline recipe.
        on_stage: Called with (stage, ``"skipped"`` | ``"running"`` | ``"done in N s"``).
        env: Environment of the stage processes (default: this one's).

    Returns:
        The evaluation report's path.

    Raises:
        PipelineError: on an invalid recipe, a missing extra (before any stage runs) or a
            failed stage (its last error line).
    """
    recipe_file = Path(recipe_file)
    recipe = load_recipe(recipe_file)
    check_extras()
    base = recipe_file.resolve().parent
    out = _path(recipe.out, base)
    markers = out / ".stages"
    markers.mkdir(parents=True, exist_ok=True)
    _base_policies(recipe, base, out)
    with ExitStack() as engines:
        pool = None
        wrote: dict[str, str] = {}  # stage -> its --out
        ran: set[str] = set()
        for name, argv in stages(recipe, base):
            argv = _warm_start(name, argv, on_stage)
            marker = markers / f"{name}.json"
            digest = hashlib.sha256(json.dumps(argv).encode()).hexdigest()
            # a stage that reads what a stage of this run wrote runs again too (and resumes)
            fed = any(_reads(argv, wrote[other]) for other in ran)
            if "--out" in argv[:-1]:
                wrote[name] = argv[argv.index("--out") + 1]
            if (not fed and marker.is_file()
                    and json.loads(marker.read_text(encoding="utf-8")).get("sha256") == digest):
                on_stage(name, "skipped")
                continue
            ran.add(name)
            stage_env = env
            if "--engine" in argv:  # a generating stage on vLLM: on the pipeline's servers
                from mascot.policies.vllm import VllmError, VllmPool

                if pool is None:
                    pool = engines.enter_context(VllmPool(lora_rank=_lora_rank(recipe, base), attach={},
                                                          lora_target_modules=_lora_modules(recipe, base),
                                                          announce=lambda line: on_stage("engine", line)))
                try:  # the memory of a server this stage does not use goes to it
                    stage_env = pool.stage_env(_stage_bases(argv, recipe, base), env)
                except VllmError as exc:
                    raise PipelineError(f"engine: {exc}") from None
            elif pool is not None:  # a training stage: every server's memory goes to it
                pool.keep([])
            on_stage(name, "running")
            started = time.monotonic()
            result = subprocess.run(mascot_command(argv), capture_output=True, text=True, env=stage_env)
            if result.returncode != 0:
                lines = [line for line in result.stderr.strip().splitlines() if line.strip()]
                raise PipelineError(f"stage {name} failed ({result.returncode}): "
                                    f"{lines[-1] if lines else 'no output'}")
            marker.write_text(json.dumps({"sha256": digest, "argv": argv}) + "\n", encoding="utf-8")
            on_stage(name, f"done in {time.monotonic() - started:.0f} s")
    return out / "eval" / "report.md"


def _warm_start(name: str, argv: list[str], on_stage: Callable[[str, str], None]) -> list[str]:
    """``argv`` without its ``--init_adapter`` when ``sft`` wrote no adapter there (none of
    that role's samples passed the checks): the stage starts from the base model, and says so."""
    if "--init_adapter" not in argv[:-1]:
        return argv
    at = argv.index("--init_adapter")
    folder = Path(argv[at + 1])
    if (folder / "adapter_config.json").is_file() or not (folder.parent / "policies.yaml").is_file():
        return argv
    on_stage(name, f"no warm start ({folder} has no adapter: sft had no passing sample for it); "
                   "starting from the base model")
    return [*argv[:at], *argv[at + 2:]]


def _reads(argv: list[str], written: str) -> bool:
    """Whether a stage's arguments name ``written`` (a file or folder) or a path inside it."""
    inputs = [arg for i, arg in enumerate(argv) if i == 0 or argv[i - 1] != "--out"]
    return any(arg == written or arg.startswith(written.rstrip("/") + "/") for arg in inputs)


def _engine_bases(recipe: PipelineRecipe, base: Path) -> list[str]:
    """The base models the generating stages run locally: the policies' and, when it is
    local, the judge's (as the stages' policy files name them)."""
    return list(dict.fromkeys([_model(recipe, base), *_judge_bases(recipe, base)]))


def _judge_bases(recipe: PipelineRecipe, base: Path) -> list[str]:
    """The base models of the judge when it runs locally (none for a judge on a server)."""
    judge = recipe.judge
    if judge.policies:  # as _judge_flags: a judge policy file wins over a judge model
        from mascot.policies.spec import PolicyError, load_policy_specs

        try:
            specs = load_policy_specs(_path(judge.policies, base), None)
        except PolicyError as exc:
            raise PipelineError(str(exc)) from None
        return list(dict.fromkeys(spec.model for spec in specs.values() if spec.kind == "local"))
    return [judge.model] if judge.model and not judge.base_url else []


def _stage_bases(argv: list[str], recipe: PipelineRecipe, base: Path) -> list[str]:
    """The base models a generating stage runs on vLLM: the judge's for ``judge``, the
    policies' and the judge's for ``eval``, the policies' for the others."""
    if argv[0] == "judge":
        return _judge_bases(recipe, base)
    if argv[0] == "samples" and "--teacher-model" in argv:
        return list(dict.fromkeys([_model(recipe, base), argv[argv.index("--teacher-model") + 1]]))
    return _engine_bases(recipe, base) if argv[0] == "eval" else [_model(recipe, base)]


def _lora_rank(recipe: PipelineRecipe, base: Path) -> int:
    """The largest LoRA rank the training stages use (``lora_r`` of their recipes or flags),
    so the pipeline's vLLM servers take the adapters they train."""
    ranks = [16]
    for stage in _adapted_stages(recipe):
        flags = stage.flags
        if "--lora_r" in flags[:-1] and flags[flags.index("--lora_r") + 1].isdigit():
            ranks.append(int(flags[flags.index("--lora_r") + 1]))
            continue
        value = _recipe_value(stage.config, base, "lora_r")
        if isinstance(value, int):
            ranks.append(value)
    return max(ranks)


def _lora_modules(recipe: PipelineRecipe, base: Path) -> list[str] | None:
    """The modules the adapted stages' recipes adapt (``lora_target_modules``), so the pipeline's
    vLLM servers put LoRA on those alone; ``None`` (every linear layer) when a stage does not
    list them or sets them by flag."""
    names: set[str] = set()
    for stage in _adapted_stages(recipe):
        value = None if "--lora_target_modules" in stage.flags else _recipe_value(stage.config, base,
                                                                                  "lora_target_modules")
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None
        names.update(value)
    return sorted(names) or None


def _adapted_stages(recipe: PipelineRecipe) -> list[TrainStage]:
    """The stages whose adapters the run's servers load: selection's SFT and DPO, else sft,
    speakers and Director."""
    if recipe.selection is not None:
        return [TrainStage(config=c) for c in (recipe.selection.sft, recipe.selection.dpo) if c]
    return [recipe.speakers, recipe.director, *([recipe.sft] if recipe.sft else [])]


def _recipe_value(config: str | None, base: Path, key: str) -> Any:
    """``key`` of a stage's recipe file (the run's own, else a shipped one), or ``None``."""
    if not config:
        return None
    local = _path(config, base)
    shipped = Path(__file__).parent / "training" / "fitting" / "recipes" / f"{config.removesuffix('.yaml')}.yaml"
    for candidate in (local, shipped):
        if candidate.is_file():
            return (yaml.safe_load(candidate.read_text(encoding="utf-8")) or {}).get(key)
    return None


def _base_policies(recipe: PipelineRecipe, base: Path, out: Path) -> None:
    """The bare base model for every role: what rollouts and candidates sample from."""
    data: dict[str, Any] = {"version": 1, "roles": {"default": {"kind": "local", "model": _model(recipe, base)}}}
    (out / "base-policies.yaml").write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")


def _model(recipe: PipelineRecipe, base: Path) -> str:
    """The base model: a folder (relative to the recipe) when one exists, else a Hub id."""
    local = _path(recipe.model, base)
    return str(local) if local.exists() else recipe.model


def _mode_from(judge: JudgeStage, report: Path) -> list[str]:
    """``--mode-from REPORT`` when several modes are measured: the sanity report names the one that labels."""
    return ["--mode-from", str(report)] if judge.modes != ["absolute"] else []


def _teacher(recipe: PipelineRecipe, base: Path) -> str:
    """The warm start's teacher: a folder (relative to the recipe) when one exists, else a Hub id."""
    local = _path(recipe.samples.teacher, base)
    return str(local) if local.exists() else recipe.samples.teacher


def _judge_flags(judge: JudgeStage, base: Path, prefix: str = "") -> list[str]:
    """The judge's flags of ``judge`` (``prefix=""``) or of ``eval`` (``prefix="judge-"``)."""
    if judge.policies:
        return [f"--{prefix}policies", str(_path(judge.policies, base))]
    if not judge.model:
        raise PipelineError("judge: give 'model' (with 'base_url' for a server) or 'policies'")
    flags = [f"--{prefix}model", judge.model]
    if judge.base_url:
        flags += [f"--{prefix}base-url", judge.base_url]
    if judge.api_key_env:
        flags += [f"--{prefix}api-key-env", judge.api_key_env]
    return flags


def _recipe(stage: TrainStage, base: Path) -> list[str]:
    config = []
    if stage.config:
        local = _path(stage.config, base)
        config = ["--config", str(local) if local.is_file() else stage.config]  # a shipped recipe's name
    return [*config, *stage.flags]


def _file_flag(flag: str, value: str | None, base: Path) -> list[str]:
    return [flag, str(_path(value, base))] if value else []


def _path(value: str, base: Path) -> Path:
    path = Path(value).expanduser()
    return path if path.is_absolute() else base / path
