"""Does training help? The ensemble trained by selection vs its untrained self, on held-out scenarios.

Runs learning by selection on the offline Qwen2.5-Coder-0.5B-Instruct (``mascot offline-model``)
on this machine's CPU, as one ``mascot pipeline`` run of the recipe beside this script
(``bench/learning/recipe.yaml``, with ``sft.yaml`` and ``dpo.yaml``):

1. the roster's scenarios are split by id (``bench/learning/split.json``, fixed once): train,
   held-out dev (for choosing sizes and settings) and held-out test (written later, read
   once); rollouts, samples, pairs and training see the train scenarios only;
2. each iteration samples directions and replies from the policy and from the offline 1.5B
   teacher (``mascot offline-model --model qwen2.5-coder-1.5b-instruct``) on vLLM, drops what
   the fault verifiers reject (``mascot.graphs.faults``, checked by ``bench/faults.py``), plays
   passing directions as one-turn blocks, keeps the best of each group by measured outcomes
   and fine-tunes both adapters from the base; DPO on best-vs-worst pairs of the last pools
   follows (``mascot.cli.selection_stages``);
3. ``eval`` plays the test scenarios with ``trained`` (the DPO adapters), ``sft`` (the last
   iteration), ``untrained`` and ``round_robin``, paired by episode id; the second round of
   each starts from the scenario's written follow-up.

Then it writes ``docs/learning/report.md`` (the issue's targets with paired bootstrap 95 %
intervals by scenario, guard figures, fault rates per system and kept yield per iteration as
plots), ``docs/learning/results.json`` and the raw held-out episodes
``docs/learning/episodes/*.jsonl``.

    python bench/learning.py [--quick] [--model DIR] [--work DIR] [--docs DIR] [--no-readme] [--ship]

``--quick`` runs every stage at the smallest size (a smoke test, written to
``WORK/docs`` unless ``--docs`` is given). A rerun resumes: stages whose command did not
change are skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import yaml

from mascot.cli.main import stop_on_signals
from mascot.cli.pipeline_run import run_pipeline
from mascot.offline.model import OFFLINE_JUDGE, build_offline_model, built_offline_model
from mascot.rosters import load_roster, load_scenarios
from mascot.training.episodes.episode import Episode, read_episodes
from mascot.training.evaluation.bootstrap import bootstrap_difference
from mascot.training.evaluation.comparison import system_scores
from mascot.training.jsonl import read_jsonl
from mascot.training.judging.rubric import load_rubric

HERE = Path(__file__).resolve().parent / "learning"
ROOT = HERE.parent.parent
#: Evaluated systems: name in the report -> name in ``mascot eval`` (the paper's SFT baseline and
#: both ablations included).
SYSTEMS = {"untrained": "untrained_director", "sft": "sft", "trained": "trained", "no_alignment": "no_alignment",
           "no_director": "no_director", "round_robin": "round_robin"}
#: Metrics compared, and whether lower is better (redundancy is over rounds of two or more voices).
METRICS = {"redundancy": True, "distinct_2": False, "mean_reply_tokens": False, "speaker_balance": False,
           "persona_identifiability": False, "fallback_rate": True, "consecutive_same_persona": True}
#: Guard metrics compared (``mascot.training.evaluation.guards``, as shares 0-1; routing in %), lower is better?
GUARDS = {"voices_per_round": False, "multi_voice_rounds": False, "multi_voice_rounds_all": False,
          "reply_words": False, "refusal_rate": True, "reply_refusals": True, "helpdesk_rate": True,
          "voice_copies": True, "style_copies": True,
          "prompt_echoes": True, "despair_agreements": True, "echo_rate": True, "as_person_rate": True,
          "skipped_turns": True,
          "copied_actions": True, "action_refusals": True, "action_first_person": True, "short_tones": False,
          "first_offered": True, "offered_voices": False, "routing_accuracy": False, "routing_misfits": True}
#: The README's first message, played through each ensemble after the run (``mascot chat``).
README_MESSAGE = "I failed my driving test again and I feel like an idiot"
README_SEEDS = (0, 1, 2)
#: --quick: every stage, smallest sizes.
QUICK = {"rollout": {"episodes": 2}, "selection": {"iterations": 1, "k": 1, "max_points": 3, "max_contexts": 3},
         "eval": {"episodes": 2}, "steps": 1}
#: Bootstrap resamples whole held-out scenarios (several people play each).
CLUSTER = "scenario"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="every stage at the smallest size (smoke test)")
    parser.add_argument("--model", metavar="DIR", help="the offline model folder (default: built by mascot "
                                                       "offline-model into the cache)")
    parser.add_argument("--judge-model", metavar="DIR", help="the judge (default: the offline 1.5B model when built "
                                                             "into the cache, else --model itself)")
    parser.add_argument("--work", metavar="DIR", help="run folder (default ./learning-run or ./learning-quick)")
    parser.add_argument("--docs", metavar="DIR", help="report folder (default docs/learning; --quick: WORK/docs)")
    parser.add_argument("--ship", action="store_true",
                        help="ship the trained adapters into the package when they win on the fault rates; for a "
                             "run whose eval plays the dev split (the recipe's eval scenarios), never the test split")
    parser.add_argument("--no-readme", action="store_true",
                        help="leave out the README message's rounds (six chats on the local engine)")
    args = parser.parse_args()
    stop_on_signals()  # SIGTERM and SIGHUP stop the run's vLLM servers and stage processes too
    work = Path(args.work or ("learning-quick" if args.quick else "learning-run")).resolve()
    docs = Path(args.docs).resolve() if args.docs else (work / "docs" if args.quick else ROOT / "docs" / "learning")
    work.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    # the folder the README's test command builds; built here (minutes, once) when missing
    model = Path(args.model).expanduser() if args.model else build_offline_model(
        Path("~/.cache/mascot/qwen2.5-coder-0.5b-instruct").expanduser())
    # a judge stronger than the policy when it is built (mascot offline-model --model qwen2.5-coder-1.5b-instruct)
    judge = Path(args.judge_model).expanduser() if args.judge_model else built_offline_model(OFFLINE_JUDGE) or model
    print(f"learning: {machine()}", file=sys.stderr, flush=True)
    print(f"learning: policy model {model}; judge and warm-start teacher {judge}", file=sys.stderr, flush=True)
    recipe = write_run(work, model, quick=args.quick, judge=judge)
    print(f"learning: estimate {estimate(recipe):.0f} min on this machine; a rerun resumes where this one stopped",
          file=sys.stderr, flush=True)
    timings = StageClock(work / "stage-seconds.json")  # kept across resumed invocations
    clock = {"stage": "", "t": time.monotonic()}

    def on_stage(name: str, state: str) -> None:
        print(f"[{time.monotonic() - started:6.0f} s] {name}: {state}", file=sys.stderr, flush=True)
        if state == "running":
            clock.update(stage=name, t=time.monotonic())
        elif state.startswith("done"):
            timings[name] = round(time.monotonic() - clock["t"], 1)

    run_pipeline(recipe, on_stage=on_stage)
    clock.update(t=time.monotonic())
    readme, played = ({}, False) if args.no_readme else readme_rounds(work, model)
    if played:
        timings["readme-message"] = round(time.monotonic() - clock["t"], 1)
    results = analyse(work, model, timings=dict(timings), quick=args.quick, judge=judge)
    results["readme_message"] = readme
    results["targets"].update(readme_targets(readme))
    results["machine"] = machine()
    results["winner"] = winning_system(results["comparisons"])
    # the run's own time: every stage's seconds, summed over the invocations that ran them
    results["minutes_total"] = round(sum(timings.values()) / 60, 1)
    write_docs(work, docs, results)
    print(f"learning: report {docs / 'report.md'} ({results['minutes_total']} min)")
    if not args.quick and docs == ROOT / "docs" / "learning":
        for page in write_pages([ROOT / "README.md", ROOT / "docs" / "evaluation.md"], docs, results):
            print(f"learning: {page.relative_to(ROOT)} rewritten from this run")
    if args.ship:  # a choice made on the dev split, never on the test split this run reports
        if results["winner"] == "trained":
            ship_adapters(work, model, results)
        else:
            print(f"learning: {results['winner']} wins on the fault rates; the trained adapters are not shipped",
                  file=sys.stderr)
    return 0


#: The fault rates (percent, lower is better) the shipped system must lower, and the guard it
#: must not give up for them (rounds with two or more voices, over every round).
WIN_FAULTS = ("reply_refusals", "helpdesk_rate", "style_copies", "voice_copies", "action_refusals",
              "action_first_person", "copied_actions")


def winning_system(comparisons: dict[str, Any]) -> str:
    """``trained`` when its mean fault rate is below the untrained ensemble's and it keeps at
    least as many rounds of two or more voices; else ``untrained``."""
    rates = {system: [comparisons[m][system] for m in WIN_FAULTS
                      if m in comparisons and comparisons[m].get(system) is not None]
             for system in ("trained", "untrained")}
    if not all(rates.values()):
        return "untrained"
    mean = {system: sum(v) / len(v) for system, v in rates.items()}
    voices = comparisons.get("multi_voice_rounds_all", {})
    kept_voices = (voices.get("trained") or 0) >= (voices.get("untrained") or 0)
    return "trained" if mean["trained"] < mean["untrained"] and kept_voices else "untrained"


def ship_adapters(work: Path, model: Path, results: dict[str, Any]) -> Path | None:
    """The run's adapters into the package (``mascot.trained``), when the policy model is
    the default offline model: ``mascot offline-model`` then writes them beside it."""
    from mascot.offline.model import DEFAULT_OFFLINE_MODEL, is_offline_model
    from mascot.trained import ship

    if not is_offline_model(model, model=DEFAULT_OFFLINE_MODEL):
        print(f"learning: {model} is not the offline {DEFAULT_OFFLINE_MODEL}: its adapters are not shipped",
              file=sys.stderr)
        return None
    roster = load_roster(yaml.safe_load((work / "recipe.yaml").read_text(encoding="utf-8"))["roster"])
    folder = trained_policies(work).parent
    if not (folder / "director" / "adapter_card.json").is_file() or not (folder / "speakers").is_dir():
        print(f"learning: {folder} lacks the Director's or the speakers' adapter: nothing shipped", file=sys.stderr)
        return None
    card = json.loads((folder / "director" / "adapter_card.json").read_text(encoding="utf-8"))
    played = yaml.safe_load((folder / "policies.yaml").read_text(encoding="utf-8"))["roles"]
    run = {"roster": roster.id, "personas": list(roster.persona_ids), "version": played["director"].get("version"),
           "director_steps": card.get("steps"), "report": "docs/learning/report.md",
           "minutes_total": results.get("minutes_total"), "machine": results.get("machine")}
    target = ship(folder, DEFAULT_OFFLINE_MODEL, run)
    print(f"learning: adapters shipped in {target} (mascot offline-model writes them beside the model)",
          file=sys.stderr)
    return target


def trained_policies(work: Path) -> Path:
    """The policy file the run's evaluation plays as ``trained``: the DPO adapters', or the
    last selection iteration's when the recipe has no DPO."""
    selection = yaml.safe_load((work / "recipe.yaml").read_text(encoding="utf-8"))["selection"]
    if selection.get("dpo"):
        return work / "adapters" / "policies.yaml"
    return work / "select" / str(selection["iterations"] - 1) / "policies.yaml"


def write_run(work: Path, model: Path, *, quick: bool, judge: Path | None = None) -> Path:
    """The run folder's scenario files (the fixed split) and recipes; returns the recipe."""
    recipe = yaml.safe_load((HERE / "recipe.yaml").read_text(encoding="utf-8"))
    split = json.loads((HERE / "split.json").read_text(encoding="utf-8"))["rosters"][recipe["roster"]]
    scenarios = {s.id: s for s in load_scenarios(recipe["roster"])}
    files = {"train-scenarios.jsonl": split["train"], "heldout-scenarios.jsonl": split["heldout"],
             "test-scenarios.jsonl": split["test"]}
    for name, ids in files.items():
        missing = [i for i in ids if i not in scenarios]
        if missing:
            raise SystemExit(f"split.json names scenarios the roster lacks: {', '.join(missing)}")
        (work / name).write_text("".join(json.dumps(scenarios[i].model_dump()) + "\n" for i in ids), encoding="utf-8")
    if set(split["train"]) & (set(split["heldout"]) | set(split["test"])) or set(split["heldout"]) & set(split["test"]):
        raise SystemExit("split.json: a scenario is in two splits")
    recipe["model"] = str(model)
    recipe["judge"]["model"] = str(judge or model)
    # the stronger model samples beside the policy, when built
    recipe["selection"]["teacher"] = str(judge) if judge and judge != model else None
    for name in ("sft.yaml", "dpo.yaml"):
        config = yaml.safe_load((HERE / name).read_text(encoding="utf-8"))
        # bf16 only where the CPU computes it natively: emulated, it is slower than fp32
        config["bf16"] = bool(config.get("bf16")) and native_bf16()
        if quick:
            config.pop("num_train_epochs", None)
            config["max_steps"] = QUICK["steps"]
            config["save_steps"] = 1
        (work / name).write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    if quick:
        recipe["rollout"].update(QUICK["rollout"])
        recipe["selection"].update(QUICK["selection"])
        recipe["eval"].update(QUICK["eval"])
    path = work / "recipe.yaml"
    path.write_text(yaml.safe_dump(recipe, sort_keys=False), encoding="utf-8")
    return path


def machine() -> str:
    """This machine in one line: CPU model, cores, whether it computes bf16 natively, memory."""
    import os
    import platform

    model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                  if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() \
        else platform.processor()
    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    return (f"{model}, {os.cpu_count()} cores, {'native bf16' if native_bf16() else 'no native bf16 (fp32)'}, "
            f"{memory:.0f} GiB")


#: Seconds per unit of each stage on a 2-core CPU with native bf16 (about three times that on
#: one with AVX2 alone), for the estimate printed before a run.
_COST = {"engine": 60, "rollout": 20.0, "sample": 1.0, "teacher_sample": 2.5, "sft_row": 3.0,
         "dpo_pair": 5.0, "eval_episode": 20.0}


def estimate(recipe_file: Path) -> float:
    """Minutes the run should take here, from its sizes and ``_COST``."""
    recipe = yaml.safe_load(recipe_file.read_text(encoding="utf-8"))
    selection = recipe["selection"]
    contexts = selection.get("max_points", 24) + selection.get("max_contexts", 24)
    per_iteration = contexts * selection["k"] * (_COST["sample"] + (_COST["teacher_sample"] if selection.get(
        "teacher") else 0)) + 2 * contexts * selection.get("keep", 1) * _COST["sft_row"]
    systems = 2 + len(recipe["eval"].get("baselines", []))
    seconds = (_COST["engine"] * (3 + selection["iterations"]) + _COST["rollout"] * recipe["rollout"]["episodes"]
               + per_iteration * selection["iterations"] + _COST["dpo_pair"] * contexts
               + _COST["eval_episode"] * recipe["eval"]["episodes"] * systems)
    factor = 1.0 if native_bf16() else 3.0
    return factor * seconds / 60


class StageClock(dict):
    """Seconds per stage, saved to ``path`` on every entry: a resumed run skips the stages an
    earlier invocation finished, and keeps their time."""

    def __init__(self, path: Path) -> None:
        super().__init__(json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {})
        self.path = path

    def __setitem__(self, stage: str, seconds: float) -> None:
        super().__setitem__(stage, seconds)
        self.path.write_text(json.dumps(dict(self), indent=1) + "\n", encoding="utf-8")


def readme_rounds(work: Path, model: Path) -> tuple[dict[str, list[dict[str, Any]]], bool]:
    """The README's first message played once per seed through the untrained and the trained
    ensemble (``mascot chat --json``, the local engine): who spoke and what they said, and
    whether they were played now (False: read back from an earlier invocation)."""
    import subprocess

    runs: dict[str, list[dict[str, Any]]] = {}
    policies = trained_policies(work)
    roles = yaml.safe_load(policies.read_text(encoding="utf-8"))["roles"]
    version = (roles.get("director") or roles.get("anchor") or {}).get("version")
    cache = work / "readme-message.json"  # a rerun of a finished run reuses them
    if cache.is_file() and json.loads(cache.read_text(encoding="utf-8")).get("version") == version:
        return json.loads(cache.read_text(encoding="utf-8"))["runs"], False
    systems = {"untrained": ["--model", str(model)], "trained": ["--policies", str(policies)]}
    for name, flags in systems.items():
        for seed in README_SEEDS:
            result = subprocess.run([sys.executable, "-m", "mascot", "chat", "--roster", "emotional_support", *flags,
                                     "--message", README_MESSAGE, "--seed", str(seed), "--json"],
                                    capture_output=True, text=True)
            if result.returncode != 0:
                lines = result.stderr.strip().splitlines()
                raise SystemExit(f"readme message ({name}, seed {seed}): {lines[-1] if lines else 'failed'}")
            episode = json.loads(result.stdout)
            turns = [m for m in episode["messages"] if m["role"] == "assistant" and m.get("name")]
            runs.setdefault(name, []).append({
                "seed": seed,
                "turns": [{"speaker": m["name"], "text": m["content"],
                           "action": (m.get("stage_direction") or {}).get("action"),
                           "tone": (m.get("stage_direction") or {}).get("tone")} for m in turns]})
    cache.write_text(json.dumps({"version": version, "runs": runs}, indent=1) + "\n", encoding="utf-8")
    return runs, True


def readme_targets(runs: dict[str, list[dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The README message's target: every trained round has two or more voices and no reply
    or direction with a fault (``mascot.graphs.faults``)."""
    from mascot.graphs.faults import direction_faults, persona_texts, reply_faults, voice_names

    roster = load_roster("emotional_support")
    rounds = runs.get("trained", [])
    voices = [len({t["speaker"] for t in r["turns"]}) for r in rounds]
    faults = []
    for played in rounds:
        for i, turn in enumerate(played["turns"]):
            earlier = [t["text"] for t in played["turns"][:i]]
            faults += reply_faults(turn["text"], person=README_MESSAGE, voices=earlier, personas=persona_texts(roster),
                                   instructions=[turn["action"] or "", turn["tone"] or ""])
            faults += direction_faults(turn["action"] or "", turn["tone"] or "", names=voice_names(roster),
                                       shown=[README_MESSAGE, *earlier])
    return {"readme_message_two_voices_no_fault": {
        "rounds": len(rounds), "voices": voices, "faults": sorted(set(faults)), "fault_count": len(faults),
        "met": bool(rounds) and min(voices) >= 2 and not faults}}


def native_bf16() -> bool:
    """Whether training here may use bf16: a GPU that supports it, or a CPU with native bf16."""
    import torch

    from mascot.policies.local.precision import cpu_has_native_bf16

    return torch.cuda.is_bf16_supported() if torch.cuda.is_available() else cpu_has_native_bf16()


def analyse(work: Path, model: Path, *, timings: dict[str, float], quick: bool,
            judge: Path | None = None) -> dict[str, Any]:
    """Every number of the report, from the run folder's files."""
    from transformers import AutoTokenizer

    recipe = yaml.safe_load((work / "recipe.yaml").read_text(encoding="utf-8"))
    roster = load_roster(recipe["roster"])
    split = json.loads((HERE / "split.json").read_text(encoding="utf-8"))["rosters"][recipe["roster"]]
    tokenizer = AutoTokenizer.from_pretrained(model)
    rubrics = {r: load_rubric(r) for r in recipe["eval"]["rubrics"]}
    per_episode: dict[str, dict[str, dict[str, float]]] = {}
    clusters: dict[str, str] = {}
    routing_rows: dict[str, dict[str, float]] = {}
    by_position: dict[str, dict[str, float]] = {}
    speakers: dict[str, dict[str, int]] = {}
    episodes: dict[str, list[Episode]] = {}
    for name, eval_name in SYSTEMS.items():
        if not (work / "eval" / "episodes" / f"{eval_name}.jsonl").is_file():
            continue  # a system this recipe does not run
        episodes[name] = read_episodes(work / "eval" / "episodes" / f"{eval_name}.jsonl")
        held = {e.scenario.id for e in episodes[name] if e.scenario}
        if held - set(split["heldout"]) - set(split["test"]):
            raise SystemExit(f"{name}: episodes of scenarios that are not held out: "
                             f"{sorted(held - set(split['heldout']) - set(split['test']))}")
        judged = work / "eval" / "judgements" / f"{eval_name}.jsonl"  # none for a metrics-only system
        judgements = [r for _, r in read_jsonl(judged)] if judged.is_file() else []
        scores = system_scores(name, "trained" if name == "trained" else "baseline", episodes[name], judgements,
                               roster=roster, rubrics=rubrics)
        values = {m: dict(v) for m, v in scores.tables["metrics"].items()}
        values.update({m: dict(v) for m, v in scores.tables.get("guards", {}).items()})
        clusters.update(scores.clusters)
        routing = work / "eval" / "routing" / f"{eval_name}.json"
        if routing.is_file():  # per routing point, not per episode: summarised, not bootstrapped
            routed = json.loads(routing.read_text(encoding="utf-8"))
            routing_rows[name] = {"accuracy": 100 * sum(bool(r["right"]) for r in routed.values()) / len(routed),
                                  "misfits": 100 * sum(bool(r["misfit"]) for r in routed.values()) / len(routed),
                                  "points": len(routed)}
        for rubric in rubrics:
            values[f"{rubric}_overall"] = dict(scores.tables.get(rubric, {}).get("overall", {}))
        for episode in episodes[name]:
            for metric, value in direction_metrics(episode, roster, tokenizer).items():
                values.setdefault(metric, {})[episode.id] = value
        per_episode[name] = values
        by_position[name] = {str(k): v for k, v in sorted(scores.redundancy_by_position.items())}
        counts = {pid: 0 for pid in roster.persona_ids}
        for episode in episodes[name]:
            for message in episode.messages:
                if message.role == "assistant" and message.name in counts:
                    counts[message.name] += 1
        speakers[name] = counts
    comparisons = {}
    lower = {**METRICS, **GUARDS}
    for metric in [*(f"{r}_overall" for r in rubrics), *METRICS, *GUARDS]:
        trained, untrained = per_episode["trained"].get(metric, {}), per_episode["untrained"].get(metric, {})
        if not trained or not untrained:
            continue
        difference = bootstrap_difference(trained, untrained, seed=0, clusters=clusters)
        comparisons[metric] = {
            **{system: _mean(values[metric]) if values.get(metric) else None for system, values in per_episode.items()},
            "diff_ci95": [difference.low, difference.high], "diff": difference.estimate, "n_pairs": difference.n,
            "n_clusters": len({clusters[k] for k in set(trained) & set(untrained)}),
            "lower_is_better": lower.get(metric, False), "guard": metric in GUARDS,
        }
    for metric, field in {"routing_accuracy": "accuracy", "routing_misfits": "misfits"}.items():
        if routing_rows:
            comparisons[metric] = {**{s: r[field] for s, r in routing_rows.items()}, "diff": None,
                                   "diff_ci95": [None, None], "n_pairs": None, "n_clusters": None,
                                   "lower_is_better": GUARDS[metric], "guard": True,
                                   "points": next(iter(routing_rows.values()))["points"]}
    setup = json.loads((work / "eval" / "results.json").read_text(encoding="utf-8")).get("setup", {})
    return {
        "quick": quick, "model": str(model), "roster": roster.id,
        "judge": f"{model} (the same model judges itself)" if judge in (None, model) else str(judge),
        "train_scenarios": split["train"], "heldout_scenarios": split["test"], "dev_scenarios": split["heldout"],
        "episodes_per_system": {name: len(e) for name, e in episodes.items()},
        "systems": list(episodes), "bootstrap": f"paired by episode, resampled by whole {CLUSTER}",
        "reply_budgets": setup.get("reply_budgets"), "max_rounds": setup.get("max_rounds"),
        "max_speakers": setup.get("max_speakers"),
        "profiles_per_scenario": _profiles_per_scenario(episodes.get("trained", [])),
        "comparisons": comparisons, "targets": targets(comparisons),
        "redundancy_by_position": by_position, "speakers": speakers,
        "sanity": _sanity(work), "samples": _samples(work, roster), "reward_models": _reward_models(work),
        "training": _training(work),
        "stage_seconds": timings,
        "per_episode": per_episode,
    }


def direction_metrics(episode: Episode, roster: Any, tokenizer: Any) -> dict[str, float]:
    """Per episode: replaced (fallback) directions among the Director's, consecutive persona
    turns by the same persona, and mean reply tokens (the model's tokenizer)."""
    decided = [m.stage_direction for m in episode.messages if m.role == "assistant" and m.stage_direction]
    replaced = [d for d in decided if d.get("fallback") and not str(d["fallback"]).startswith("repaired")]
    turns = [m for m in episode.messages if m.role in ("user", "assistant")]
    adjacent = [(a, b) for a, b in zip(turns, turns[1:], strict=False) if a.role == b.role == "assistant"]
    replies = [m.content for m in episode.messages if m.role == "assistant" and m.name in roster.persona_ids]
    return {
        "fallback_rate": len(replaced) / len(decided) if decided else 0.0,
        "consecutive_same_persona": sum(a.name == b.name for a, b in adjacent) / len(adjacent) if adjacent else 0.0,
        "mean_reply_tokens": (sum(len(tokenizer(t)["input_ids"]) for t in replies) / len(replies)) if replies else 0.0,
    }


def targets(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The issue's targets (held-out, trained vs untrained; guards in percent), each with the
    measured figure and whether it was met; a target whose metric was not measured is not met."""
    def get(metric: str, key: str) -> Any:
        return c.get(metric, {}).get(key)

    def row(metrics: tuple[str, ...], met: Any, **measured: Any) -> dict[str, Any]:
        found = all(m in c and get(m, "trained") is not None for m in metrics)
        return {**measured, "met": bool(found and met()), **({} if found else {"missing": True})}

    t, u = (lambda m: get(m, "trained")), (lambda m: get(m, "untrained"))

    def ci(m: str) -> Any:
        return get(m, "diff_ci95") or [None, None]

    out = {}
    for metric, name, bound in (("reply_refusals", "reply_refusals", 2), ("helpdesk_rate", "reply_helpdesk", 3),
                                ("style_copies", "reply_style_copies", 5), ("voice_copies", "reply_voice_copies", 5),
                                ("action_refusals", "action_refusals", 2),
                                ("action_first_person", "action_first_person_or_naming", 10),
                                ("copied_actions", "action_copies", 10)):
        out[f"{name}_at_most_{bound}pct"] = row((metric,), lambda m=metric, b=bound: t(m) <= b,
                                                trained=t(metric), untrained=u(metric))
    out["short_tones_at_least_95pct"] = row(("short_tones",), lambda: t("short_tones") >= 95,
                                            trained=t("short_tones"), untrained=u("short_tones"))
    out["multi_voice_rounds_all_at_least_70pct"] = row(
        ("multi_voice_rounds_all",), lambda: t("multi_voice_rounds_all") >= 70,
        trained=t("multi_voice_rounds_all"), untrained=u("multi_voice_rounds_all"))
    relative = ((t("redundancy") - u("redundancy")) / u("redundancy")) if t("redundancy") is not None and u(
        "redundancy") else None
    out["redundancy_15pct_lower_ci_below_0"] = row(
        ("redundancy",), lambda: relative is not None and relative <= -0.15 and ci("redundancy")[1] < 0,
        relative=relative, ci95=ci("redundancy"))
    k = t("offered_voices")
    out["first_offered_at_most_100_over_k_plus_10"] = row(
        ("first_offered", "offered_voices"), lambda: t("first_offered") <= 100 / k + 10,
        trained=t("first_offered"), untrained=u("first_offered"), bound=(100 / k + 10) if k else None,
        voices_offered=k)
    out["routing_at_least_20_points_above_untrained"] = row(
        ("routing_accuracy",), lambda: t("routing_accuracy") >= u("routing_accuracy") + 20,
        trained=t("routing_accuracy"), untrained=u("routing_accuracy"))
    for name in ("judge_prefers_trained_in_65pct_of_pairs", "blind_reading_doubles_acceptable"):
        out[name] = {"met": False, "missing": True}  # not measured by this run (see the report)
    return out


def _profiles_per_scenario(episodes: list[Episode]) -> dict[str, int]:
    """Held-out scenario -> how many different people played it."""
    people: dict[str, set[str]] = {}
    for episode in episodes:
        if episode.scenario:
            people.setdefault(episode.scenario.id, set()).add(episode.user_profile.id if episode.user_profile else "")
    return {k: len(v) for k, v in sorted(people.items())}


def _mean(values: dict[str, float]) -> float:
    return sum(values.values()) / len(values)


def _sanity(work: Path) -> dict[str, Any]:
    found = {}
    for rubric in ("persona", "group"):
        path = work / f"sanity-{rubric}.json"
        if path.is_file():
            report = json.loads(path.read_text(encoding="utf-8"))
            found[rubric] = {k: report.get(k) for k in ("judge", "right", "total", "accuracy", "p_value", "threshold",
                                                        "passed", "by_kind", "failed_judgements", "seconds", "mode",
                                                        "modes")}
            metric = report.get("metric_judge") or {}
            found[rubric]["metric_judge"] = {k: metric.get(k) for k in ("right", "total", "accuracy")} or None
    return found


def _samples(work: Path, roster: Any) -> dict[str, Any]:
    """Per selection iteration, source and role: how many were sampled, passed the checks and
    were kept (the best of their group), and what the others failed on."""
    from mascot.training.data.selection import selection_counts

    found = {}
    for path in sorted((work / "select").glob("*/samples.jsonl"), key=lambda p: int(p.parent.name)):
        found[path.parent.name] = selection_counts(path, roster, keep=1)
    return found


def _reward_models(work: Path) -> dict[str, Any]:
    found = {}
    for name in ("rm-persona", "rm-group"):
        path = work / name / "adapter_card.json"
        if path.is_file():
            card = json.loads(path.read_text(encoding="utf-8"))
            found[name] = {k: card.get(k) for k in ("data_size", "test_pairs", "accuracy_before", "accuracy_after",
                                                    "train_loss", "steps", "seconds")}
    for name, folder in (("persona", "pairs"), ("group", "group-pairs")):
        for split in ("train", "test"):
            path = work / folder / f"{split}.jsonl"
            if path.is_file():
                found.setdefault(f"{name}_pairs", {})[split] = sum(1 for _ in path.open(encoding="utf-8"))
    return found


def _training(work: Path) -> dict[str, Any]:
    """Each training run's curve per logged step (GRPO: the weighted reward and every term;
    the SFT warm start: token accuracy and loss), from its trainer state."""
    found: dict[str, Any] = {}
    cards = [("", c) for c in sorted((work / "adapters").glob("*/adapter_card.json"))]
    cards += [("sft-", c) for c in sorted((work / "sft").glob("*/adapter_card.json"))]
    cards += [(f"select-{c.parent.parent.name}-", c) for c in sorted((work / "select").glob("*/*/adapter_card.json"))]
    for prefix, card in cards:
        info = json.loads(card.read_text(encoding="utf-8"))
        entry: dict[str, Any] = {"method": info.get("method"), "reward": info.get("rewards", []),
                                 "reward_metric": info.get("reward_metric"), "terms": info.get("reward_terms"),
                                 "weights": info.get("reward_weights"), "steps": info.get("steps"),
                                 "rows": info.get("data_size"), "init_adapter": info.get("init_adapter"),
                                 "seconds": info.get("seconds")}
        states = sorted((card.parent.parent / "checkpoints" / card.parent.name).glob("checkpoint-*/trainer_state.json"),
                        key=lambda p: int(p.parent.name.split("-")[-1]))
        if states:
            history = json.loads(states[-1].read_text(encoding="utf-8"))["log_history"]
            keep = ("rewards/", "reward", "step", "loss", "mean_token_accuracy")
            entry["log"] = [{k: v for k, v in h.items() if k.startswith(keep) and not k.endswith("/std")}
                            for h in history if "reward" in h or "mean_token_accuracy" in h]
        found[prefix + card.parent.name] = entry
    return found


def write_docs(work: Path, docs: Path, results: dict[str, Any]) -> None:
    """report.md, results.json, the plots and the raw held-out episodes."""
    docs.mkdir(parents=True, exist_ok=True)
    (docs / "episodes").mkdir(exist_ok=True)
    for name, eval_name in SYSTEMS.items():
        if (work / "eval" / "episodes" / f"{eval_name}.jsonl").is_file():
            shutil.copyfile(work / "eval" / "episodes" / f"{eval_name}.jsonl", docs / "episodes" / f"{name}.jsonl")
    plots = _plots(results, docs)
    (docs / "results.json").write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    (docs / "report.md").write_text(_report(results, plots), encoding="utf-8")


#: The results page's section that ``write_pages`` fills from a run (between these lines).
README_START, README_END = "<!-- learning-run: start -->", "<!-- learning-run: end -->"
#: The README's first command's output: the trained ensemble on the README message (seed 0).
MESSAGE_START, MESSAGE_END = "<!-- readme-message: start -->", "<!-- readme-message: end -->"
#: The rows of the README's table: metric -> label.
README_ROWS = {"multi_voice_rounds_all": "rounds with 2+ voices (every round), %",
               "voices_per_round": "voices per round",
               "redundancy": "redundancy, rounds of 2+ voices (lower is better)",
               "persona_identifiability": "persona identifiability", "reply_refusals": "replies refusing, %",
               "helpdesk_rate": "replies with help-desk talk, %", "style_copies": "replies copying a style line, %",
               "voice_copies": "replies repeating an earlier voice, %", "action_refusals": "actions refusing, %",
               "action_first_person": "actions in the first person or naming the voice, %",
               "copied_actions": "actions copying 6+ words, %", "short_tones": "tones of at most 6 words, %",
               "first_offered": "first voice offered chosen, %", "routing_accuracy": "routing set, right voice, %",
               "reply_words": "words per reply"}


def write_pages(pages: list[Path], docs: Path, results: dict[str, Any]) -> list[Path]:
    """Fill each page's marked sections from a run, and return the pages rewritten: the
    learning-run section (between ``README_START`` and ``README_END``: the table trained vs
    untrained and the other systems, the targets met and missed, the plots, one held-out
    round of each ensemble verbatim) and the first command's output (between
    ``MESSAGE_START`` and ``MESSAGE_END``)."""
    return [page for page in pages if _write_page(page, docs, results)]


def _write_page(page: Path, docs: Path, results: dict[str, Any]) -> bool:
    text = original = page.read_text(encoding="utf-8")
    if README_START in text and README_END in text:
        text = _learning_section(text, page, docs, results)
    played = (results.get("readme_message") or {}).get("trained") or []
    if played and MESSAGE_START in text and MESSAGE_END in text:  # the first command's output
        shown = [MESSAGE_START, "```text"]
        for turn in played[0]["turns"]:
            shown += [f"» {turn['speaker']}: {turn['action']} (tone: {turn['tone']})",
                      f"[{turn['speaker']}] {turn['text']}"]
        shown += ["```", MESSAGE_END]
        start, end = text.index(MESSAGE_START), text.index(MESSAGE_END) + len(MESSAGE_END)
        text = text[:start] + "\n".join(shown) + text[end:]
    if text == original:
        return False
    page.write_text(text, encoding="utf-8")
    return True


def _learning_section(text: str, page: Path, docs: Path, results: dict[str, Any]) -> str:
    """``text`` with its learning-run section written from a run; links relative to ``page``."""
    c, systems = results["comparisons"], [s for s in ("untrained", "sft", "trained", "round_robin")
                                          if s in results["systems"]]
    winner = results.get("winner")
    rel = Path(os.path.relpath(Path(docs).resolve(), page.resolve().parent)).as_posix()

    def f(value: Any) -> str:
        return "-" if value is None else f"{value:.2f}" if isinstance(value, float) else str(value)

    lines = [README_START, "",
             f"Held-out, {results['episodes_per_system'].get('trained')} episodes of "
             f"{results['max_rounds']} rounds per "
             f"system over {len(results['heldout_scenarios'])} scenarios the training never saw; "
             f"{results['machine']}, {results.get('minutes_total')} min for the whole run "
             f"(`python bench/learning.py`; report: [{rel}/report.md]({rel}/report.md)).", "",
             "| | " + " | ".join(systems) + " | trained - untrained, 95 % CI |", "|---|" + "---|" * (len(systems) + 1)]
    for metric, label in README_ROWS.items():
        row = c.get(metric)
        if row is None:
            continue
        ci = row.get("diff_ci95") or [None, None]
        interval = f"{f(row['diff'])} [{f(ci[0])}, {f(ci[1])}]" if row.get("diff") is not None else "-"
        lines.append(f"| {label} | " + " | ".join(f(row.get(s)) for s in systems) + f" | {interval} |")
    met = [n for n, t in results["targets"].items() if t["met"]]
    missed = [n for n, t in results["targets"].items() if not t["met"]]
    not_shipped = ("" if winner != "trained" else
                   " (chosen on the split reported here, so not shipped: that choice belongs to the dev split)")
    lines += ["", f"Targets met: {', '.join(met) or 'none'}. **Missed:** {', '.join(missed) or 'none'} "
                  f"(figures in the report). Winner on the fault rates: **{winner or '-'}**"
                  f"{not_shipped}.", ""]
    lines += [f"![{p}]({rel}/{p})" for p in ("faults.png", "yield.png", "redundancy_by_position.png", "speakers.png")
              if (Path(docs) / p).is_file()]
    round_of = _first_round(docs, ("untrained", "trained"))
    if round_of:
        lines += ["", f"One held-out round of each, verbatim (episode `{round_of['id']}`, the same scenario, person "
                      "and seed):", ""]
        for system, turns in round_of["turns"].items():
            lines += [f"**{system}**", "", "```text"]
            lines += [line for turn in turns for line in turn.splitlines()] + ["```", ""]
    lines.append(README_END)
    start, end = text.index(README_START), text.index(README_END) + len(README_END)
    return text[:start] + "\n".join(lines) + text[end:]


def _first_round(docs: Path, systems: tuple[str, ...]) -> dict[str, Any] | None:
    """The first round of the first held-out episode every system played: the person's
    message, then each direction and voice, as ``mascot chat`` prints them."""
    played = {}
    for system in systems:
        path = Path(docs) / "episodes" / f"{system}.jsonl"
        if not path.is_file():
            return None
        played[system] = {e.id: e for e in read_episodes(path)}
    common = sorted(set.intersection(*(set(v) for v in played.values())))
    if not common:
        return None
    turns: dict[str, list[str]] = {}
    for system in systems:
        out, users = [], 0
        for message in played[system][common[0]].messages:
            if message.role == "user":
                users += 1
                if users > 1:
                    break
                out.append(f"person: {message.content}")
            elif message.role == "assistant" and message.name:
                d = message.stage_direction or {}
                out.append(f"» {message.name}: {d.get('action', '')} (tone: {d.get('tone', '')})")
                out.append(f"[{message.name}] {message.content}")
        turns[system] = out
    return {"id": common[0], "turns": turns}


def _save(fig: Any, docs: Path, name: str, names: list[str]) -> None:
    """Write one plot into the report folder and list it."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    fig.savefig(docs / name, dpi=120)
    names.append(name)
    plt.close(fig)


def _plots(results: dict[str, Any], docs: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = []
    fig, ax = plt.subplots(figsize=(5.5, 3.5))
    count = len(results["redundancy_by_position"])
    for i, (system, values) in enumerate(results["redundancy_by_position"].items()):
        xs = [int(k) + 0.04 * (i - (count - 1) / 2) for k in values]
        ax.plot(xs, list(values.values()), marker="o", label=system)
    ax.set_xticks(sorted({int(k) for v in results["redundancy_by_position"].values() for k in v}))
    ax.set(xlabel="voice in the round", ylabel="redundancy (max cosine to earlier voices)",
           title="Redundancy by position, held-out")
    ax.legend()
    _save(fig, docs, "redundancy_by_position.png", names)

    fig, ax = plt.subplots(figsize=(6, 3.5))
    systems = list(results["speakers"])
    personas = list(next(iter(results["speakers"].values())))
    width = 0.8 / len(systems)
    for i, system in enumerate(systems):
        counts = results["speakers"][system]
        total = sum(counts.values()) or 1
        ax.bar([p + i * width for p in range(len(personas))], [counts[p] / total for p in personas], width,
               label=system)
    ax.set_xticks([p + width * (len(systems) - 1) / 2 for p in range(len(personas))], personas)
    ax.set(ylabel="share of persona turns", title="Who speaks, held-out")
    ax.legend()
    _save(fig, docs, "speakers.png", names)

    faults = [m for m in ("reply_refusals", "helpdesk_rate", "style_copies", "voice_copies", "prompt_echoes",
                          "action_refusals", "action_first_person", "copied_actions")
              if m in results["comparisons"]]
    if faults:
        fig, ax = plt.subplots(figsize=(7.5, 3.8))
        width = 0.8 / len(systems)
        for i, system in enumerate(systems):
            ax.bar([x + i * width for x in range(len(faults))],
                   [results["comparisons"][m].get(system) or 0 for m in faults], width, label=system)
        ax.set_xticks([x + width * (len(systems) - 1) / 2 for x in range(len(faults))],
                      [m.replace("_rate", "").replace("_", " ") for m in faults], rotation=30, ha="right", fontsize=8)
        ax.set(ylabel="% of replies / directions", title="Faults per system, held-out test (lower is better)")
        ax.legend(fontsize=8)
        _save(fig, docs, "faults.png", names)
    if results.get("samples"):
        fig, ax = plt.subplots(figsize=(6, 3.5))
        keys = sorted({k for counts in results["samples"].values() for k in counts})
        iterations = sorted(results["samples"], key=int)
        for key in keys:
            shares = [100 * results["samples"][i][key]["passed"] / results["samples"][i][key]["sampled"]
                      if key in results["samples"][i] and results["samples"][i][key]["sampled"] else None
                      for i in iterations]
            ax.plot([int(i) for i in iterations], shares, marker="o", label=key)
        ax.set(xlabel="selection iteration", ylabel="samples passing the verifiers, %",
               title="Kept yield per iteration and source")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.legend(fontsize=7)
        _save(fig, docs, "yield.png", names)

    runs = {k: v for k, v in results["training"].items() if v.get("log")}
    if runs:
        fig, axes = plt.subplots(1, len(runs), figsize=(4.5 * len(runs), 3.5), squeeze=False)
        for ax, (run, entry) in zip(axes[0], runs.items(), strict=True):
            steps = [h.get("step", i + 1) for i, h in enumerate(entry["log"])]
            sft = entry["method"] == "sft"
            keys = ["mean_token_accuracy"] if sft else sorted(
                {k for h in entry["log"] for k in h if k.endswith("/mean") or k == "reward"})
            for key in keys:
                ax.plot(steps, [h.get(key) for h in entry["log"]], marker=".", label=key.replace("rewards/", ""))
            ax.set(xlabel="SFT step" if sft else "GRPO step",
                   ylabel="token accuracy" if sft else "reward (weighted sum and terms)",
                   title=f"{run} {'SFT warm start' if sft else 'GRPO'}")
            ax.xaxis.get_major_locator().set_params(integer=True)
            ax.legend(fontsize=7)
        _save(fig, docs, "reward_curves.png", names)
    return names


def _report(results: dict[str, Any], plots: list[str]) -> str:
    c = results["comparisons"]

    def f(value: Any) -> str:
        return "-" if value is None else f"{value:.3f}" if isinstance(value, float) else str(value)

    lines = ["# Learning evidence: trained vs untrained on held-out scenarios", ""]
    if results["quick"]:
        lines += ["> **Quick run** (`--quick`): every stage at the smallest size. A smoke test; the numbers mean "
                  "nothing.", ""]
    systems = results["systems"]
    lines += [
        f"Policy model: `{Path(results['model']).name}` (the offline Qwen2.5-Coder-0.5B-Instruct) as Director, "
        f"speakers, user simulator and reward-model base, on a CPU; judge: `{Path(results['judge']).name}`. Roster "
        f"`{results['roster']}`; {len(results['train_scenarios'])} train scenarios, "
        f"{len(results['heldout_scenarios'])} held-out ({', '.join(results['heldout_scenarios'])}; "
        "`bench/learning/split.json`). Episodes per system: "
        + ", ".join(f"{k} {v}" for k, v in results["episodes_per_system"].items())
        + f", paired by episode id (same scenario, person and seed), {results['max_rounds']} rounds of up to "
        f"{results['max_speakers']} voices; people per held-out scenario: "
        + ", ".join(f"{k} {v}" for k, v in results["profiles_per_scenario"].items())
        + f". Reply budgets (tokens, every system): {json.dumps(results['reply_budgets'])}. Intervals: "
        f"{results['bootstrap']}.", "",
    ]
    for title, guard in (("Quality", False), ("Guards (percent unless named otherwise)", True)):
        lines += [f"## {title}", "", "| metric | " + " | ".join(systems) + " | trained - untrained, 95 % CI |",
                  "|---|" + "---|" * (len(systems) + 1)]
        for metric, row in c.items():
            if row.get("guard", False) != guard:
                continue
            arrow = " (lower is better)" if row["lower_is_better"] else ""
            lines.append(f"| {metric}{arrow} | " + " | ".join(f(row.get(s)) for s in systems)
                         + f" | {f(row['diff'])} [{f(row['diff_ci95'][0])}, {f(row['diff_ci95'][1])}] |")
        lines.append("")
    lines += [f"Winner on the fault rates (mean of {', '.join(WIN_FAULTS)}, without fewer rounds of two or more "
              f"voices): **{results.get('winner', '-')}**; the trained adapters are shipped only by `--ship` "
              "on a run that evaluates the dev split.", ""]
    lines += ["## Targets", "", "| target | measured | met |", "|---|---|---|"]
    for name, target in results["targets"].items():
        measured = ", ".join(f"{k} {f(v)}" for k, v in target.items() if k != "met")
        lines.append(f"| {name} | {measured} | {'yes' if target['met'] else '**no**'} |")
    if results.get("readme_message"):
        lines += ["", f"## The README's message, verbatim (\"{README_MESSAGE}\", local engine, seeds "
                      f"{', '.join(map(str, README_SEEDS))})", ""]
        for system, rounds in results["readme_message"].items():
            for played in rounds:
                lines.append(f"**{system}, seed {played['seed']}**")
                lines.append("")
                for turn in played["turns"]:
                    lines.append(f"- *{turn['speaker']}* (action: {turn['action']!r}; tone: {turn['tone']!r}): "
                                 f"{turn['text']}")
                lines.append("")
    lines += ["", "## The judge and the reward models", ""]
    for rubric, report in results["sanity"].items():
        metric = report.get("metric_judge") or {}
        labelled_by = ("the LLM judge (trusted: at least 75 % with p < 0.01)" if report["passed"]
                       else "the metric judge alone (the LLM judge is not trusted)")
        lines.append(f"- Sanity set, {rubric} rubric: `{Path(str(report['judge'])).name}` {report['right']}/"
                     f"{report['total']} ({f(report['accuracy'])}, p = {report['p_value']:.2g} against chance; "
                     f"{report['failed_judgements']} judgements failed); the metric judge {metric.get('right')}/"
                     f"{metric.get('total')}. Labels of this rubric: "
                     f"{labelled_by}.")
        for mode, tally in (report.get("modes") or {}).items():
            lines.append(f"  - {mode} mode: {tally['right']}/{tally['total']} ({f(tally['accuracy'])}, p = "
                         f"{tally['p_value']:.2g}; {tally['failed_judgements']} failed; {f(tally['seconds'])} s)"
                         f"{' - passed the gate' if tally['passed'] else ''}"
                         f"{' - labels' if mode == report.get('mode') and report['passed'] else ''}")
    for name, info in results["reward_models"].items():
        lines.append(f"- {name}: {json.dumps(info)}")
    if results.get("samples"):
        lines += ["", "## Selection: samples per iteration", "",
                  "| iteration | source/role | sampled | passed the verifiers | kept (best of group) "
                  "| dropped (fault: count) |",
                  "|---|---|---|---|---|---|"]
        for iteration, counts in results["samples"].items():
            for key, row in sorted(counts.items()):
                dropped = ", ".join(f"{k} {v}" for k, v in sorted(row.items(), key=lambda kv: -kv[1])
                                    if k not in ("sampled", "passed", "kept")) or "-"
                lines.append(f"| {iteration} | {key} | {row['sampled']} | {row['passed']} | {row['kept']} "
                             f"| {dropped} |")
    lines += ["", "## Training", "",
              "| run | method | rows | steps | starts from | curve first -> last quarter | seconds |",
              "|---|---|---|---|---|---|---|"]
    for run, entry in results["training"].items():
        curve = entry["reward"] or []
        window = max(1, len(curve) // 4)
        first_last = (f"{sum(curve[:window]) / window:.3f} -> {sum(curve[-window:]) / window:.3f}" if curve else "-")
        start = Path(entry["init_adapter"]).parent.name + "/" + Path(entry["init_adapter"]).name if entry.get(
            "init_adapter") else "a new adapter"
        lines.append(f"| {run} | {entry['method']} ({entry['reward_metric']}) | {entry['rows']} | {entry['steps']} | "
                     f"{start} | {first_last} | {f(entry['seconds'])} |")
    lines += ["", "## Plots", ""] + [f"![{p}]({p})" for p in plots]
    lines += ["", "## Time per stage (seconds)", "", "| stage | seconds |", "|---|---|"]
    lines += [f"| {k} | {v:.0f} |" for k, v in results["stage_seconds"].items()]
    lines += ["", f"Whole run: {results.get('minutes_total', '-')} min (the stages' seconds, summed over resumed "
              "invocations; each invocation also starts its vLLM servers, 30-50 s each). "
              "Raw held-out episodes: `episodes/`; "
              "every number: `results.json` (per-episode values under `per_episode`).", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt as stopped:
        print(f"learning: interrupted ({stopped or 'Ctrl-C'}); a rerun resumes where this one stopped", file=sys.stderr)
        sys.exit(130)
