"""Pipeline recipes: validation in one line, and the stage commands they turn into."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mascot.cli.pipeline_run import PipelineError, _stage_bases, load_recipe, stages

RECIPE = {"roster": "emotional_support", "model": "Qwen/Qwen3-0.6B", "out": "run",
          "import-logs": {"from": "sqlite:///app.db"}, "judge": {"policies": "judge.yaml"},
          "speakers": {"method": "dpo", "config": "speakers-dpo-cpu-smoke"}}


def write(tmp_path: Path, recipe: dict) -> Path:
    path = tmp_path / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return path


def test_app_logs_recipe_turns_into_mascot_commands(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, RECIPE))
    plan = dict(stages(recipe, tmp_path))
    assert list(plan) == ["import-logs", "blocks", "candidates", "judge-sanity-persona", "judge-sanity-group",
                          "judge-blocks", "judge-candidates", "pairs", "group-pairs", "persona-rm", "group-rm",
                          "speakers", "director", "eval"]
    # the labels follow the judge's sanity accuracy
    assert plan["pairs"][plan["pairs"].index("--sanity") + 1] == plan["judge-sanity-persona"][-1]
    assert plan["group-pairs"][plan["group-pairs"].index("--sanity") + 1] == plan["judge-sanity-group"][-1]
    # the group RM learns from sibling blocks of each decision point, with points held out
    assert plan["judge-blocks"][plan["judge-blocks"].index("--in") + 1] == plan["blocks"][-1]
    assert "--test-fraction" not in plan["group-pairs"] and "--episodes" not in plan["group-pairs"]
    assert plan["import-logs"][:3] == ["import-logs", "--from", "sqlite:///app.db"]
    assert plan["judge-blocks"][plan["judge-blocks"].index("--policies") + 1] == str(tmp_path / "judge.yaml")
    assert "--judge-policies" in plan["eval"] and "--method" in plan["speakers"]
    assert plan["eval"][plan["eval"].index("--rubrics") + 1] == "persona,group,direction"
    assert plan["speakers"][plan["speakers"].index("--config") + 1] == "speakers-dpo-cpu-smoke"  # shipped name
    assert plan["persona-rm"][plan["persona-rm"].index("--base") + 1] == "Qwen/Qwen3-0.6B"


def test_a_warm_start_stage_is_where_training_starts_and_an_eval_system(tmp_path: Path) -> None:
    recipe = load_recipe(write(tmp_path, {**RECIPE, "sft": {"config": "sft.yaml", "flags": ["--lora_r", "32"]}}))
    plan = dict(stages(recipe, tmp_path))
    names = list(plan)
    assert names.index("group-pairs") < names.index("sft") < names.index("speakers")
    sft = plan["sft"]
    for flag, value in (("--pairs", "pairs"), ("--group-pairs", "group-pairs"), ("--blocks", "blocks.jsonl"),
                        ("--out", "sft")):
        assert sft[sft.index(flag) + 1] == str(tmp_path / "run" / value)
    assert plan["speakers"][-2:] == ["--init_adapter", str(tmp_path / "run" / "sft" / "speakers")]
    assert plan["director"][-2:] == ["--init_adapter", str(tmp_path / "run" / "sft" / "director")]
    assert plan["eval"][plan["eval"].index("--sft") + 1] == str(tmp_path / "run" / "sft" / "policies.yaml")
    from mascot.cli.pipeline_run import _lora_rank

    assert _lora_rank(recipe, tmp_path) == 32  # the vLLM servers take the warm start's rank
    from mascot.cli.pipeline_run import _lora_modules

    for name in ("sft.yaml", "speakers.yaml", "director.yaml"):
        (tmp_path / name).write_text(yaml.safe_dump({"lora_target_modules": ["q_proj", "o_proj"]}))
    modules = {**RECIPE, "sft": {"config": "sft.yaml"}, "speakers": {"config": "speakers.yaml"},
               "director": {"config": "director.yaml"}}
    assert _lora_modules(load_recipe(write(tmp_path, modules)), tmp_path) == ["o_proj", "q_proj"]
    # a stage that adapts every linear layer, or says nothing: the servers put LoRA everywhere
    (tmp_path / "director.yaml").write_text(yaml.safe_dump({"lora_target_modules": "all-linear"}))
    assert _lora_modules(load_recipe(write(tmp_path, modules)), tmp_path) is None
    assert "--sft" not in dict(stages(load_recipe(write(tmp_path, RECIPE)), tmp_path))["eval"]


@pytest.mark.parametrize(("change", "message"), [
    ({"rollout": {"episodes": 2}}, "exactly one episode source"),
    ({"import-logs": None}, "exactly one episode source"),
    ({"judge": {"policies": "j.yaml", "colour": "red"}}, "judge.colour: Extra inputs are not permitted"),
    ({"candidates": 1}, "candidates.k: Input should be greater than or equal to 2"),
])
def test_bad_recipes_are_one_line_errors(tmp_path: Path, change: dict, message: str) -> None:
    recipe = {**RECIPE, **change}
    recipe = {k: v for k, v in recipe.items() if v is not None}
    with pytest.raises(PipelineError, match=message) as error:
        load_recipe(write(tmp_path, recipe))
    assert "\n" not in str(error.value)


def test_demo_recipe_gives_a_real_model_each_roles_budget(tmp_path: Path) -> None:
    from mascot.cli.pipeline import demo_recipe

    for model, judge_url, expected in (("tiny", "http://127.0.0.1:9/v1", ["--max-tokens", "16"]), ("real", None, [])):
        plan = dict(stages(load_recipe(write(tmp_path, demo_recipe(model, judge_url=judge_url))), tmp_path))
        for stage in ("rollout", "candidates", "eval"):
            flags = plan[stage]
            found = (flags[flags.index("--max-tokens"):flags.index("--max-tokens") + 2] if "--max-tokens" in flags
                     else [])
            assert found == expected, (model, stage, flags)
        judge = plan["judge-blocks"]
        # a real model judges itself
        assert judge[judge.index("--model") + 1] == ("stub-judge" if judge_url else "real")
    # a stronger judge than the policy, in every stage that judges
    plan = dict(stages(load_recipe(write(tmp_path, demo_recipe("real", judge_url=None, judge_model="strong"))),
                       tmp_path))
    assert plan["judge-blocks"][plan["judge-blocks"].index("--model") + 1] == "strong"
    assert plan["eval"][plan["eval"].index("--judge-model") + 1] == "strong"
    assert plan["rollout"][plan["rollout"].index("--policies") + 1].endswith("base-policies.yaml")


def test_a_missing_extra_stops_the_demo_before_any_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    import importlib.util

    from mascot.cli import main
    from mascot.cli.pipeline_run import run_pipeline

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a))
    assert main(["demo", "--out", str(tmp_path / "demo")]) == 2
    error = capsys.readouterr().err
    assert "mascot: error:" in error and "eval extra (matplotlib not installed)" in error
    assert 'pip install "mascot[eval]"' in error
    assert not (tmp_path / "demo").exists() or not any((tmp_path / "demo").iterdir())  # nothing built
    started: list[str] = []
    with pytest.raises(PipelineError, match="eval extra"):
        run_pipeline(write(tmp_path, RECIPE), on_stage=lambda name, state: started.append(name))
    assert started == []


def test_the_engine_key_reaches_every_generating_stage(tmp_path: Path) -> None:
    from mascot.cli.pipeline import demo_recipe

    generating = {"rollout", "blocks", "judge-blocks", "judge-sanity-persona", "judge-sanity-group", "candidates",
                  "judge-candidates", "eval", "director"}
    recipe = {**demo_recipe("some/model", judge_url=None), "engine": "vllm"}
    plan = dict(stages(load_recipe(write(tmp_path, recipe)), tmp_path))
    on_vllm = {name for name, argv in plan.items() if "--engine" in argv and argv[argv.index("--engine") + 1] == "vllm"}
    # training stages generate inside TRL; the Director's blocks play its speakers on the server
    assert on_vllm == generating
    plan = dict(stages(load_recipe(write(tmp_path, {**recipe, "engine": "local"})), tmp_path))
    assert not [name for name, argv in plan.items() if "--engine" in argv]  # local: the commands as before
    with pytest.raises(PipelineError, match="engine"):
        load_recipe(write(tmp_path, {**recipe, "engine": "tgi"}))


def test_a_rerun_skips_finished_stages_until_one_runs_then_runs_the_rest(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    import subprocess

    from mascot.cli import pipeline_run
    from mascot.cli.pipeline import demo_recipe

    monkeypatch.setattr(pipeline_run, "check_extras", lambda: None)
    ran: list[str] = []

    def run(argv: list[str], **kwargs: object) -> subprocess.CompletedProcess:
        ran.append(argv[3])
        return subprocess.CompletedProcess(argv, 0, "", "")

    monkeypatch.setattr(pipeline_run.subprocess, "run", run)
    (tmp_path / "model").mkdir()
    recipe = demo_recipe("model", judge_url=None)
    pipeline_run.run_pipeline(write(tmp_path, recipe))
    everything = list(ran)
    ran.clear()
    pipeline_run.run_pipeline(write(tmp_path, recipe))
    assert ran == []  # nothing changed: every stage skipped
    recipe["group-blocks"]["g"] += 1  # the blocks change: what judges, pairs and trains on them must follow
    pipeline_run.run_pipeline(write(tmp_path, recipe))
    plan = stages(load_recipe(tmp_path / "recipe.yaml"), tmp_path)
    names = [name for name, _ in plan]
    # the blocks and what reads them (directly or through a later stage's output), nothing else:
    # the judge's sanity sets and the persona candidates do not read the blocks
    downstream = ["blocks", "judge-blocks", "group-pairs", "group-rm", "director", "eval"]
    assert ran == [dict(plan)[name][0] for name in downstream]
    assert everything == [argv[0] for _, argv in plan] and len(names) > len(downstream)


def test_a_samples_stage_feeds_the_warm_start_and_runs_on_the_policy_and_teacher_servers(tmp_path: Path) -> None:
    teacher = tmp_path / "teacher"
    teacher.mkdir()
    recipe = load_recipe(write(tmp_path, {**RECIPE, "engine": "vllm", "sft": {"config": "sft.yaml"},
                                          "candidates": {"k": 2, "max_contexts": 5},
                                          "samples": {"k": 3, "teacher": "teacher", "keep": 1, "max_points": 7}}))
    plan = dict(stages(recipe, tmp_path))
    samples = plan["samples"]
    assert samples[samples.index("--teacher-model") + 1] == str(teacher)
    assert samples[samples.index("--k") + 1] == "3" and samples[samples.index("--max-points") + 1] == "7"
    assert "--max-contexts" not in samples and samples[-1].endswith("samples.jsonl")
    sft = plan["sft"]
    assert sft[sft.index("--samples") + 1] == samples[-1] and sft[sft.index("--keep") + 1] == "1"
    assert "--pairs" not in sft
    candidates = plan["candidates"]
    assert candidates[candidates.index("--k") + 1] == "2" and candidates[candidates.index("--max-contexts") + 1] == "5"
    assert _stage_bases(samples, recipe, tmp_path) == ["Qwen/Qwen3-0.6B", str(teacher)]
    assert _stage_bases(candidates, recipe, tmp_path) == ["Qwen/Qwen3-0.6B"]
    # without a samples section the warm start learns the judged winners, as before
    plain = dict(stages(load_recipe(write(tmp_path, {**RECIPE, "sft": {"config": "sft.yaml"}})), tmp_path))
    assert "samples" not in plain and "--pairs" in plain["sft"]


def test_judging_modes_are_measured_on_the_sanity_sets_and_the_chosen_one_labels(tmp_path: Path) -> None:
    plan = dict(stages(load_recipe(write(tmp_path, {**RECIPE, "judge": {"policies": "judge.yaml",
                                                                         "modes": ["absolute", "pairwise"]}})),
                       tmp_path))
    for rubric, labelled in (("persona", "judge-candidates"), ("group", "judge-blocks")):
        sanity = plan[f"judge-sanity-{rubric}"]
        assert sanity[sanity.index("--modes") + 1] == "absolute,pairwise"
        assert plan[labelled][plan[labelled].index("--mode-from") + 1] == sanity[-1]
    plain = dict(stages(load_recipe(write(tmp_path, RECIPE)), tmp_path))
    assert "--modes" not in plain["judge-sanity-group"] and "--mode-from" not in plain["judge-blocks"]
    with pytest.raises(PipelineError, match="judge.modes.0: Input should be 'absolute', 'ranking' or 'pairwise'"):
        load_recipe(write(tmp_path, {**RECIPE, "judge": {"policies": "judge.yaml", "modes": ["vibes"]}}))


def test_a_role_the_warm_start_wrote_no_adapter_for_starts_from_the_base_model(tmp_path: Path) -> None:
    from mascot.cli.pipeline_run import _warm_start

    said: list[tuple[str, str]] = []
    argv = ["train-director", "--base", "m", "--init_adapter", str(tmp_path / "sft" / "director"), "--out", "a"]
    assert _warm_start("director", argv, lambda *a: said.append(a)) == argv  # sft has not run: left as is
    (tmp_path / "sft" / "speakers").mkdir(parents=True)
    (tmp_path / "sft" / "speakers" / "adapter_config.json").write_text("{}")
    (tmp_path / "sft" / "policies.yaml").write_text("version: 1\n")
    speakers = ["train-speakers", "--init_adapter", str(tmp_path / "sft" / "speakers"), "--out", "a"]
    assert _warm_start("speakers", speakers, lambda *a: said.append(a)) == speakers and not said
    assert _warm_start("director", argv, lambda *a: said.append(a)) == ["train-director", "--base", "m", "--out", "a"]
    assert said and said[0][0] == "director" and "no warm start" in said[0][1]
