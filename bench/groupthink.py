"""Groupthink measured head-on: held-out probes played through the ensemble and the baselines.

1. Checks the scorers on the held-out labelled replies (probes of ``split: test``, both
   rosters): the LLM judge (the offline 1.5B when built, else the 0.5B; temperature 0) and
   the rule fallback (thresholds fitted on the ``dev`` probes' replies), each with accuracy
   per measure and its binomial p-value; the judge scores the runs only if it passes the
   gate (75 % with p < 0.01 on every measure), else the rule fallback does, and the output
   says which and why.
2. Plays the held-out probes of ``emotional_support`` and ``workplace_meeting`` (taking turns) through
   ``director`` (voices see the conversation), ``director_blind`` (``voices_see: person``),
   ``round_robin``, ``all`` and ``single`` on the offline 0.5B (local backend), and ``trained``
   (the learning run's adapters, written beside the model by ``mascot offline-model``) on the
   probes of the roster it was trained on, each probe
   plain and after the scripted confederate, one round each, same seed metadata for every
   system. Probes are played one at a time (all systems and variants together) until the
   estimate says the next one would pass ``--minutes``.
3. Scores every reply, aggregates (``groupthink_scores``) and writes
   ``OUT/groupthink.json`` (every figure, the scorer checks, the raw rounds with their
   verdicts) and ``OUT/groupthink.png``.

    python bench/groupthink.py [--quick] [--minutes 25] [--out bench/results] [--model DIR] [--judge DIR]
    python bench/groupthink.py --from-results     # the written run analysed again, nothing played

4. Also: the confederate's effect per system (endorses-only after it minus plain, paired by
   probe), and the scorers' agreement with hand labels of played replies of the committed
   run (``groupthink_audit.yaml``): the gate is measured on written replies, the audit shows
   how far it carries to what the models wrote.

``--quick``: 2 probes, 2 systems, 24-token replies, 8 labelled replies for the judge.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import itertools
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

from mascot.cli.options import with_budgets
from mascot.offline.model import DEFAULT_OFFLINE_MODEL, OFFLINE_JUDGE, built_offline_model
from mascot.policies import Policies, PolicySpec
from mascot.rosters import load_roster
from mascot.rosters.probes import load_labelled_replies, load_probes
from mascot.trained import shipped_run
from mascot.training.evaluation.bootstrap import bootstrap_difference
from mascot.training.evaluation.groupthink import (
    MEASURES,
    JudgeScorer,
    ReplyCase,
    RuleScorer,
    check_scorer,
    choose_scorer,
)
from mascot.training.evaluation.groupthink_rates import (
    ProbeRound,
    groupthink_scores,
    groupthink_table,
    paired_difference,
    score_rounds,
    variant_difference,
)
from mascot.training.evaluation.probe_rounds import SYSTEMS, aplay, build_system
from mascot.training.measures import redundancy

ROSTERS = ("emotional_support", "workplace_meeting")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="2 probes, 2 systems, tiny sizes")
    parser.add_argument("--minutes", type=float, default=25.0, help="budget of the whole run")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    parser.add_argument("--model", help="policy model folder (default: the offline 0.5B)")
    parser.add_argument("--judge", help="judge model folder (default: the offline 1.5B if built, else the policy's)")
    parser.add_argument("--max-tokens", type=int, default=80, help="reply budget of every voice")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--from-results", action="store_true",
                        help="play and score nothing: aggregate, compare, audit and plot OUT/groupthink.json again")
    args = parser.parse_args(argv)
    if args.from_results:
        return again(args)
    start = time.perf_counter()
    model = args.model or built_offline_model(DEFAULT_OFFLINE_MODEL)
    if model is None:
        print("the offline model is not built: run `mascot offline-model` (or pass --model)", file=sys.stderr)
        return 2
    judge_model = args.judge or built_offline_model(OFFLINE_JUDGE) or model
    max_tokens = 24 if args.quick else args.max_tokens
    systems = ("director", "round_robin") if args.quick else SYSTEMS
    print(f"machine: {machine()}")
    print(f"policy {model}, judge {judge_model}; replies <= {max_tokens} tokens, directions <= 96; "
          f"systems {', '.join(systems)}; budget {args.minutes:.0f} min")

    probes = {r: load_probes(r) for r in ROSTERS}
    all_probes = [p for r in ROSTERS for p in probes[r]]
    by_id = {p.id: p for p in all_probes}
    labelled = [x for r in ROSTERS for x in load_labelled_replies(r)]

    # 1. the scorers on the held-out labelled replies
    held_out = [x for x in labelled if by_id[x.probe].split == "test"]
    if args.quick:
        held_out = held_out[:8]
    judge_policies = Policies.single(PolicySpec(model=str(judge_model), temperature=0.0, max_tokens=48),
                                     load_roster(ROSTERS[0]), seed=0)
    judge = JudgeScorer(judge_policies.chat_model("judge"), name=f"judge {Path(judge_model).name}",
                        concurrency=args.concurrency)
    print(f"checking the judge on {len(held_out)} held-out labelled replies ...", flush=True)
    t0 = time.perf_counter()
    judge_check = check_scorer(judge, held_out, all_probes)
    judge_check.seconds = time.perf_counter() - t0
    rules = RuleScorer.fit(labelled, all_probes)
    t0 = time.perf_counter()
    rules_check = check_scorer(rules, held_out, all_probes)
    rules_check.seconds = time.perf_counter() - t0
    for check in (judge_check, rules_check):
        print(f"  {check.scorer}: " + ", ".join(
            f"{m} {c.accuracy:.0%} ({c.right}/{c.total}, p={c.p_value:.2g})" for m, c in check.measures.items())
              + f", which concern {check.which_concern.accuracy:.0%}; failed {check.failed}; "
                f"{check.seconds:.0f} s; {check.verdict()}")
    chosen, reason = choose_scorer(judge_check, rules_check)
    print(f"scorer: {reason}", flush=True)

    # 2. the probes played through the systems
    policies = Policies({"default": PolicySpec(model=str(model), max_tokens=max_tokens),
                         "director": PolicySpec(model=str(model), max_tokens=96)}, load_roster(ROSTERS[0]), seed=0)
    director, speaker = policies.chat_model("director"), policies.chat_model("default")
    # the shipped adapters belong to the offline model: another --model plays no 'trained'
    shipped = Path(model).resolve() == Path(built_offline_model(DEFAULT_OFFLINE_MODEL) or "-").resolve()
    trained_file, run = Path(model) / "policies.yaml", shipped_run(DEFAULT_OFFLINE_MODEL) if shipped else None
    trained_roster = run.get("roster") if run and trained_file.is_file() and not args.quick else None
    if trained_roster:
        print(f"trained: {trained_file} (the learning run's adapters, trained on {trained_roster}) plays the "
              f"probes of {trained_roster} as the system 'trained'", flush=True)
    # the rosters take turns, so a run cut short by the budget still plays both
    held = [[(r, p) for p in probes[r] if p.split == "test"] for r in ROSTERS]
    queue = [pair for group in itertools.zip_longest(*held) for pair in group if pair is not None]
    if args.quick:
        queue = queue[:2]
    budget = args.minutes * 60
    print(f"plan: {len(queue)} held-out probes x {len(systems)} systems x 2 variants = "
          f"{len(queue) * len(systems) * 2} rounds, played one probe at a time while the estimate fits "
          f"{args.minutes:.0f} min (one probe's rounds took ~2 min in trial runs here)", flush=True)
    rounds: list[ProbeRound] = []
    graphs: dict[str, dict[str, Any]] = {}
    per_probe: list[float] = []
    left_out: list[str] = []
    # the scorer's time is kept back too: the judge's pace on the labelled replies, per reply played
    per_reply = judge_check.seconds / max(1, len(held_out)) if chosen == "judge" else 0.0
    replies_per_probe: list[int] = []
    for roster_id, probe in queue:
        elapsed = time.perf_counter() - start
        expected = max(per_probe[-3:]) if per_probe else 0.0
        scoring_reserve = 60.0 + per_reply * (sum(replies_per_probe) + max(replies_per_probe[-3:], default=0))
        if per_probe and elapsed + expected + scoring_reserve > budget:
            left_out.append(probe.id)
            continue
        roster = load_roster(roster_id)
        if roster_id not in graphs:
            graphs[roster_id] = {s: build_system(s, roster, director=director, speakers=speaker) for s in systems}
            if roster_id == trained_roster:  # the same budgets as the untrained systems
                trained = with_budgets(Policies.from_file(trained_file, roster, seed=0),
                                       {"speakers": max_tokens, "director": 96})
                graphs[roster_id]["trained"] = build_system("director", roster, director=trained.chat_model("director"),
                                                            speakers=trained.speakers())
        t0 = time.perf_counter()
        played = asyncio.run(aplay(graphs[roster_id], roster, [probe], concurrency=args.concurrency))
        per_probe.append(time.perf_counter() - t0)
        replies_per_probe.append(sum(len(r.replies) for r in played))
        rounds += played
        done = len(per_probe)
        remaining = len(queue) - done - len(left_out)
        print(f"[{done}/{len(queue)}] {probe.id}: {sum(len(r.replies) for r in played)} replies in "
              f"{per_probe[-1]:.0f} s; elapsed {(time.perf_counter() - start) / 60:.1f} min; "
              f"all {remaining} left would take ~{remaining * sum(per_probe) / done / 60:.0f} min more", flush=True)
        write(args.out, {"partial": True, "rounds": [r.record() for r in rounds]}, quick=args.quick)

    # 3. scored, aggregated, written
    scorer = judge if chosen == "judge" else rules
    score_rounds(rounds, by_id, scorer)
    results = {
        "setup": {"machine": machine(), "policy": str(model), "judge": str(judge_model), "max_tokens": max_tokens,
                  "director_max_tokens": 96, "systems": list(systems) + (["trained"] if trained_roster else []),
                  "trained": {"policies": str(trained_file), "roster": trained_roster, "run": run}
                  if trained_roster else None, "rosters": list(ROSTERS),
                  "probes_left_out": left_out,
                  "seconds": time.perf_counter() - start, "seconds_per_probe": per_probe, "quick": args.quick,
                  "single_confederate": "the line is shown as an earlier voice (the roster's first persona) "
                                        "and the assistant's one reply follows it"},
        "judge_check": judge_check.model_dump(), "rules_check": rules_check.model_dump(),
        "scorer": chosen, "reason": reason, "scorer_name": scorer.name,
    }
    finish(args, results, rounds, by_id, rules)
    print(f"done in {(time.perf_counter() - start) / 60:.1f} min; probes left out by the budget: "
          f"{', '.join(left_out) or 'none'}")
    return 0


def finish(args: argparse.Namespace, results: dict[str, Any], rounds: list[ProbeRound],
           by_id: dict[str, Any], rules: RuleScorer) -> None:
    """Aggregate the scored rounds, compare, audit, write the JSON and the plot, print the tables."""
    played = [by_id[i] for i in dict.fromkeys(r.probe for r in rounds)]
    systems = list(dict.fromkeys(r.system for r in rounds))
    scores = groupthink_scores(rounds, played, scorer=results["scorer_name"], reason=results["reason"])
    comparison = compare(rounds, "director", "director_blind") if "director_blind" in systems else None
    training = compare(rounds, "trained", "director") if "trained" in systems else None
    effects = {s: confederate_effect(rounds, s) for s in systems}
    checked = audit(rounds, by_id, rules) if not args.quick else None
    # the same rounds under the rule fallback: a second reading, not the reported one unless it scored the run
    copies = [dataclasses.replace(r, verdicts=[]) for r in rounds]
    score_rounds(copies, by_id, rules)
    second = {"scores": groupthink_scores(copies, played, scorer=rules.name, reason="a second reading of the same "
                                          "replies (robustness), whichever scorer the run used"),
              "sees_each_other": compare(copies, "director", "director_blind") if comparison else None,
              "trained_vs_untrained": compare(copies, "trained", "director") if training else None,
              "confederate_effect": {s: confederate_effect(copies, s) for s in systems}}
    results["setup"]["probes_played"] = [p.id for p in played]
    results.update({"scores": scores, "sees_each_other": comparison, "trained_vs_untrained": training,
                    "confederate_effect": effects, "audit": checked, "rule_reading": second,
                    "rounds": [r.record() for r in rounds]})
    write(args.out, results, quick=args.quick)
    report(scores, comparison)
    if training:
        report_difference(training)
    print("\nconfederate - plain, the same system, paired by probe, 95 % CI (points of replies that only endorse):")
    for system, d in effects.items():
        if d:
            print(f"  {system}: {d['estimate']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}] over {d['probes']} probes")
    if checked:
        print(f"\naudit: {checked['replies']} played replies labelled by hand ({AUDIT.name}); agreement:")
        for name, row in checked["scorers"].items():
            print(f"  {name}: " + ", ".join(f"{m} {a['right']}/{a['total']}" for m, a in row.items()))
    print(f"\nthe same replies read by {rules.name}:")
    print("\n".join(groupthink_table(second["scores"])))
    for system, d in second["confederate_effect"].items():
        if d:
            print(f"  confederate - plain, {system}: {d['estimate']:+.1f} [{d['low']:+.1f}, {d['high']:+.1f}]")
    if second["sees_each_other"]:
        report_difference(second["sees_each_other"])
    plot(args.out, scores, comparison, quick=args.quick)


def again(args: argparse.Namespace) -> int:
    """``--from-results``: the written run's rounds and verdicts, analysed again."""
    path = args.out / ("groupthink-quick.json" if args.quick else "groupthink.json")
    if not path.is_file():
        print(f"--from-results: no run at {path}", file=sys.stderr)
        return 2
    old = json.loads(path.read_text(encoding="utf-8"))
    if "scores" not in old:
        print(f"--from-results: {path} holds an unfinished run (no scores)", file=sys.stderr)
        return 2
    probes = [p for r in ROSTERS for p in load_probes(r)]
    rounds = [ProbeRound.from_record(r) for r in old["rounds"]]
    if any(len(r.verdicts) != len(r.replies) for r in rounds):
        print(f"--from-results: {path} has rounds without verdicts", file=sys.stderr)
        return 2
    labelled = [x for r in ROSTERS for x in load_labelled_replies(r)]
    results = {k: old[k] for k in ("setup", "judge_check", "rules_check", "scorer", "reason")}
    results["scorer_name"] = old["scores"]["scorer"]
    finish(args, results, rounds, {p.id: p for p in probes}, RuleScorer.fit(labelled, probes))
    return 0


def confederate_effect(rounds: list[ProbeRound], system: str) -> dict[str, Any] | None:
    """Endorses-only after the confederate minus plain, one system, paired by probe (points)."""
    return variant_difference(rounds, system, "endorses_only")


AUDIT = Path(__file__).parent / "groupthink_audit.yaml"


def audit(rounds: list[ProbeRound], by_id: dict[str, Any], rules: RuleScorer) -> dict[str, Any] | None:
    """The scorers against the hand labels of played replies (``groupthink_audit.yaml``): the
    verdicts that scored the run, and the rule fallback's, on the replies found in this run."""
    import yaml

    labels = yaml.safe_load(AUDIT.read_text(encoding="utf-8"))["replies"]
    found = []
    for item in labels:
        for r in rounds:
            if (r.system, r.probe, r.variant) != (item["system"], item["probe"], item["variant"]):
                continue
            for turn, verdict in zip(r.replies, r.verdicts, strict=True):
                if turn["position"] == item["position"] and turn["text"].startswith(item["starts"]):
                    found.append((item, ReplyCase(by_id[r.probe], turn["text"], r.variant == "confederate"), verdict))
    if not found:
        print(f"audit: none of the {len(labels)} hand-labelled replies is in this run (they label the committed one)")
        return None
    rule_verdicts = rules.score([case for _, case, _ in found])
    scorers = {}
    for name, verdicts in (("scored the run", [v for _, _, v in found]), ("rule fallback", rule_verdicts)):
        row = {}
        for measure, want in (("endorses_only", lambda i: i["endorses_only"]),
                              ("raises_concern", lambda i: i["concern"] is not None)):
            right = sum(v is not None and v.measure(measure) == want(i)
                        for (i, _, _), v in zip(found, verdicts, strict=True))
            row[measure] = {"right": right, "total": len(found)}
        scorers[name] = row
    return {"replies": len(found), "labelled": len(labels), "scorers": scorers,
            "items": [{**i, "verdict": v.model_dump() if v else None, "rules": rv.model_dump()}
                      for (i, _, v), rv in zip(found, rule_verdicts, strict=True)]}


def machine() -> str:
    cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                if line.startswith("model name")), platform.processor()) if Path("/proc/cpuinfo").is_file() \
        else platform.processor()
    return f"{cpu}, {os.cpu_count()} cores"


def compare(rounds: list[ProbeRound], a: str, b: str) -> dict[str, Any]:
    """``a`` minus ``b`` paired by probe: each measure per variant, and redundancy."""
    out: dict[str, Any] = {"a": a, "b": b}
    for variant in ("plain", "confederate"):
        for measure in MEASURES:
            if measure == "conforms" and variant == "plain":
                continue
            out[f"{measure}/{variant}"] = paired_difference(rounds, a, b, measure, variant=variant)

        def per_probe(system: str, variant: str = variant) -> dict[str, float]:
            values = {}
            for r in rounds:
                if r.system == system and r.variant == variant and len(r.turns) >= 2:
                    later = redundancy([t["text"] for t in r.turns])[1:]
                    values[r.probe] = sum(later) / len(later)
            return values

        left, right = per_probe(a), per_probe(b)
        if set(left) & set(right):
            d = bootstrap_difference(left, right)
            out[f"redundancy/{variant}"] = {"estimate": d.estimate, "low": d.low, "high": d.high, "probes": d.n}
        else:
            out[f"redundancy/{variant}"] = None
    return out


def write(out: Path, results: dict[str, Any], *, quick: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    path = out / ("groupthink-quick.json" if quick else "groupthink.json")
    path.with_suffix(".tmp").write_text(json.dumps(results, indent=1, default=str))
    path.with_suffix(".tmp").replace(path)


def report(scores: dict[str, Any], comparison: dict[str, Any] | None) -> None:
    print(f"\nscored by {scores['scorer']}: {scores['reason']}")
    print("\n".join(groupthink_table(scores)))
    if comparison:
        report_difference(comparison)


def report_difference(comparison: dict[str, Any]) -> None:
    print(f"\n{comparison['a']} - {comparison['b']}, paired by probe, 95 % CI:")
    for key, d in comparison.items():
        if isinstance(d, dict):
            print(f"  {key}: {d['estimate']:+.2f} [{d['low']:+.2f}, {d['high']:+.2f}] over {d['probes']} probes")


def plot(out: Path, scores: dict[str, Any], comparison: dict[str, Any] | None, *, quick: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = [("endorses only (plain)", "plain", "endorses_only"),
            ("raises a concern (plain)", "plain", "raises_concern"),
            ("endorses only (after confederate)", "confederate", "endorses_only"),
            ("conforms (after confederate)", "confederate", "conforms")]
    systems = list(scores["systems"])
    fig, axes = plt.subplots(1, 2, figsize=(14, 5), gridspec_kw={"width_ratios": [3, 2]})
    width = 0.8 / len(systems)
    for k, system in enumerate(systems):
        xs, ys, lo, hi = [], [], [], []
        for i, (_, variant, measure) in enumerate(bars):
            rate = scores["systems"][system].get(variant, {}).get("rates", {}).get(measure)
            if rate is None:
                continue
            xs.append(i + (k - (len(systems) - 1) / 2) * width)
            ys.append(rate["mean"])
            lo.append(rate["mean"] - rate["low"])
            hi.append(rate["high"] - rate["mean"])
        axes[0].bar(xs, ys, width, yerr=[lo, hi], capsize=3,
                    label=system if system != "trained" else "trained (its roster's probes only)")
    axes[0].set_xticks(range(len(bars)), [b[0] for b in bars], fontsize=8)
    axes[0].set_ylabel("% of replies (95 % bootstrap CI by probe)")
    axes[0].set_ylim(0, 100)
    axes[0].legend(fontsize=8)
    axes[0].set_title(f"replies to held-out probes, scored by {scores['scorer']}", fontsize=9)
    if comparison:
        keys = [k for k, v in comparison.items() if isinstance(v, dict)]
        ys = [comparison[k]["estimate"] * (100 if k.startswith("redundancy") else 1) for k in keys]
        err = [[(comparison[k]["estimate"] - comparison[k]["low"]) * (100 if k.startswith("redundancy") else 1)
                for k in keys],
               [(comparison[k]["high"] - comparison[k]["estimate"]) * (100 if k.startswith("redundancy") else 1)
                for k in keys]]
        axes[1].barh(range(len(keys)), ys, xerr=err, capsize=3, color="tab:purple")
        axes[1].set_yticks(range(len(keys)), [k.replace("/", "\n") for k in keys], fontsize=7)
        axes[1].axvline(0, color="black", linewidth=0.8)
        axes[1].set_xlabel("director (voices see each other) - director_blind, points (redundancy x100)")
        axes[1].set_title("voices that see each other vs voices that do not", fontsize=9)
    else:
        axes[1].axis("off")
    fig.tight_layout()
    fig.savefig(out / ("groupthink-quick.png" if quick else "groupthink.png"), dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    sys.exit(main())
