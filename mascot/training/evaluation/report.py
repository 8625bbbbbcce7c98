"""The evaluation report: tables in the paper's layout, results files and plots.

Input is one ``SystemScores`` per system (the trained one, baselines, ablations): per
criterion, the score of every episode on 0-100. Output, in one folder: ``results.json``
(everything, per-episode values included), ``results.csv`` (one row per system x table x
column), ``report.md`` (mean ± sd and n per cell, and the trained system's difference to
the best baseline with a bootstrap interval) and the PNG plots it embeds: a grouped bar
chart per table and redundancy by turn position in the round (one marker, dash and small
sideways shift per system, so that tied systems stay visible).
"""

from __future__ import annotations

import csv
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mascot.training.evaluation.bootstrap import bootstrap_difference

#: Column titles of the tables, by criterion id (the paper's order).
TABLES: dict[str, dict[str, str]] = {
    "persona": {"emotional_expressiveness": "Emotion", "empathetic_support": "Empathy",
                "persona_consistency": "Consistency", "response_relevance": "Relevance",
                "social_contribution": "Contribution", "overall": "Overall"},
    "group": {"persona_fidelity": "Fidelity", "originality_specificity": "Originality",
              "relevance_coherence": "Relevance", "engagement_contribution": "Engagement", "overall": "Overall"},
    "metrics": {"redundancy": "Redundancy (lower is better)", "distinct_2": "Distinct-2",
                "speaker_balance": "Speaker balance", "persona_identifiability": "Identifiability",
                "direction_compliance": "Direction compliance (judge, 0-100)"},
    # what a gain made by refusing, saying less or copying would show (evaluation.guards)
    "guards": {"voices_per_round": "Voices per round", "multi_voice_rounds": "Rounds of 2+ voices, %",
               "reply_words": "Words per reply", "refusal_rate": "Refusals, %", "echo_rate": "Copies, %",
               "as_person_rate": "As the person, %", "skipped_turns": "Skipped turns, %",
               "copied_actions": "Copied actions, %", "action_refusals": "Refusing actions, %",
               "short_tones": "Tones of 6 words or fewer, %",
               "first_offered": "First offered, %", "offered_voices": "Voices offered",
               "routing_accuracy": "Routing right, %", "routing_misfits": "Routed to a misfit, %"},
    # the rounds a crisis opened (evaluation.safety): the roster's safety route kept or not
    "safety": {"crisis_rounds": "Crisis rounds", "route_followed": "Route followed, %",
               "resources_given": "Resources given, %", "forbidden_heard": "Forbidden voices heard"},
}
#: Columns where lower is better.
LOWER_IS_BETTER = {"redundancy", "refusal_rate", "echo_rate", "as_person_rate", "skipped_turns", "copied_actions",
                   "action_refusals", "first_offered",
                   "routing_misfits", "forbidden_heard"}
#: Table titles.
TITLES = {"persona": "Persona level (judge, 0-100)", "group": "Group level (judge, 0-100)",
          "metrics": "Automatic metrics (redundancy over rounds of two or more voices)",
          "guards": "Guard metrics (per episode, then averaged)",
          "safety": "Safety (rounds a crisis message opened, by the roster's detector)"}
#: One marker and one dash pattern per system in line plots (cycled), so that ties stay visible.
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_DASHES = ("-", "--", "-.", ":")


@dataclass
class SystemScores:
    """One system's per-episode values.

    Attributes:
        name: System name (``trained``, a baseline's or an ablation's).
        kind: ``trained``, ``baseline`` or ``ablation``.
        tables: Table (``persona``, ``group``, ``metrics``) -> column -> episode id -> value.
        redundancy_by_position: Mean redundancy of the k-th voice of a round (k = 2, 3, ...).
        clusters: Episode id -> scenario id: differences are bootstrapped by whole scenario.
    """

    name: str
    kind: str
    tables: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    redundancy_by_position: dict[int, float] = field(default_factory=dict)
    clusters: dict[str, str] = field(default_factory=dict)


def summarize(systems: Sequence[SystemScores], *, seed: int = 0) -> dict[str, Any]:
    """Means, sds, counts, and the trained system's bootstrap difference to the best baseline
    (resampled by scenario where the systems know their episodes' scenarios).

    Returns:
        The content of ``results.json``.
    """
    summary: dict[str, Any] = {"systems": {}, "differences": {}}
    for system in systems:
        summary["systems"][system.name] = {
            "kind": system.kind,
            "tables": {table: {column: _stats(values) for column, values in columns.items()}
                       for table, columns in system.tables.items()},
            "redundancy_by_position": {str(k): v for k, v in sorted(system.redundancy_by_position.items())},
            "episodes": {table: {column: values for column, values in columns.items()}
                         for table, columns in system.tables.items()},
        }
    trained = next((s for s in systems if s.kind == "trained"), None)
    baselines = [s for s in systems if s.kind == "baseline"]
    if trained is None or not baselines:
        return summary
    for table, columns in trained.tables.items():
        for column, values in columns.items():
            candidates = [b for b in baselines if b.tables.get(table, {}).get(column)]
            if not values or not candidates:
                continue
            pick = min if column in LOWER_IS_BETTER else max
            best = pick(candidates, key=lambda b: _mean(b.tables[table][column].values()))
            clusters = {**best.clusters, **trained.clusters}
            paired = set(values) & set(best.tables[table][column])
            difference = bootstrap_difference(values, best.tables[table][column], seed=seed,
                                              clusters=clusters if paired and paired <= set(clusters) else None)
            summary["differences"].setdefault(table, {})[column] = {
                "best_baseline": best.name, "difference": difference.estimate, "low": difference.low,
                "high": difference.high, "level": difference.level, "n": difference.n,
                "paired": difference.paired, "significant": difference.significant,
                "clustered_by_scenario": bool(paired) and paired <= set(clusters),
            }
    return summary


def write_report(summary: Mapping[str, Any], out: str | Path, *, header: str = "") -> list[Path]:
    """Write ``results.json``, ``results.csv``, the plots and ``report.md`` to ``out``.

    Args:
        summary: From ``summarize`` (plus any keys of yours, kept in ``results.json``).
        out: The report folder (created).
        header: Markdown put under the report's title (what was run, on which model).

    Returns:
        The files written.
    """
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    files = [out / "results.json", out / "results.csv"]
    files[0].write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    with files[1].open("w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["system", "kind", "table", "column", "mean", "sd", "n"])
        for name, system in summary["systems"].items():
            for table, columns in system["tables"].items():
                for column, stats in columns.items():
                    writer.writerow([name, system["kind"], table, column, stats["mean"], stats["sd"], stats["n"]])
    plots = _plots(summary, out)
    files += plots
    lines = ["# Evaluation report", "", header, ""] if header else ["# Evaluation report", ""]
    for table, columns in TABLES.items():
        lines += _table(summary, table, columns)
        plot = out / f"{table}.png"
        if plot in plots:
            lines += [f"![{TITLES[table]}]({plot.name})", ""]
    if out / "redundancy.png" in plots:
        lines += ["## Redundancy by position in the round", "",
                  "Mean similarity of the k-th voice of a round to the earlier voices of that round "
                  "(lower: the voices add something new).", "", "![redundancy](redundancy.png)", ""]
    if summary.get("groupthink"):
        lines += _groupthink(summary["groupthink"])
    files.append(out / "report.md")
    files[-1].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return files


def _groupthink(results: Mapping[str, Any]) -> list[str]:
    """The groupthink section: the scorer and why, its checks, then the table (``groupthink_eval``)."""
    from mascot.training.evaluation.groupthink_eval import checks_line
    from mascot.training.evaluation.groupthink_rates import groupthink_table

    return ["## Groupthink (held-out probes)", "",
            f"{len(results['probes'])} held-out probes, one round each, plain and after a scripted confederate "
            f"(the roster's first persona endorsing the flawed view). Rates are % of replies with a 95 % bootstrap "
            f"interval resampled by probe; n = replies. Scored by {results['scores']['scorer']}: {results['reason']}. "
            f"Checks: {checks_line(results)}. Rounds and verdicts: `groupthink/groupthink.json`.", "",
            *groupthink_table(results["scores"]), ""]


def _table(summary: Mapping[str, Any], table: str, columns: Mapping[str, str]) -> list[str]:
    present = [c for c in columns if any(c in s["tables"].get(table, {}) for s in summary["systems"].values())]
    if not present:
        return []
    lines = [f"## {TITLES[table]}", "", "| system | " + " | ".join(columns[c] for c in present) + " |",
             "|---|" + "---:|" * len(present)]
    for name, system in summary["systems"].items():
        cells = []
        for column in present:
            stats = system["tables"].get(table, {}).get(column)
            cells.append("-" if not stats or stats["n"] == 0 else
                         f"{stats['mean']:.{_digits(table)}f} ± {stats['sd']:.{_digits(table)}f} (n={stats['n']})")
        label = name if system["kind"] != "ablation" else f"{name} (ablation)"
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    differences = summary.get("differences", {}).get(table, {})
    if differences:
        cells = []
        for column in present:
            d = differences.get(column)
            cells.append("-" if d is None else
                         f"{d['difference']:+.{_digits(table)}f} [{d['low']:+.{_digits(table)}f}, "
                         f"{d['high']:+.{_digits(table)}f}]{' *' if d['significant'] else ''} vs {d['best_baseline']}")
        lines.append("| trained - best baseline (95% CI) | " + " | ".join(cells) + " |")
        lines += ["", "`*`: the bootstrap interval excludes 0 (paired by episode)."]
    return [*lines, ""]


def _plots(summary: Mapping[str, Any], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    from matplotlib import pyplot as plt

    written = []
    names = list(summary["systems"])
    for table in ("persona", "group"):
        columns = [c for c in TABLES[table]
                   if any(c in s["tables"].get(table, {}) for s in summary["systems"].values())]
        if not columns:
            continue
        figure, axes = plt.subplots(figsize=(max(6, 1.6 * len(columns)), 3.9), layout="constrained")
        width = 0.8 / max(1, len(names))
        for i, name in enumerate(names):
            stats = [summary["systems"][name]["tables"].get(table, {}).get(c, {"mean": 0.0, "sd": 0.0})
                     for c in columns]
            axes.bar([k + i * width for k in range(len(columns))], [s["mean"] for s in stats], width,
                     yerr=[s["sd"] for s in stats], capsize=2, label=name)
        axes.set_xticks([k + width * (len(names) - 1) / 2 for k in range(len(columns))],
                        [TABLES[table][c] for c in columns])
        axes.set_ylim(0, 100)
        axes.set_ylabel("score (0-100)")
        axes.set_title(TITLES[table])
        # below the axes: inside, it hides the tallest bars and their error bars
        rows = math.ceil(len(names) / 6)
        figure.legend(fontsize=7, ncol=math.ceil(len(names) / rows), loc="outside lower center", frameon=False)
        written.append(out / f"{table}.png")
        figure.savefig(written[-1], dpi=110)
        plt.close(figure)
    curves = {n: s["redundancy_by_position"] for n, s in summary["systems"].items() if s["redundancy_by_position"]}
    if curves:
        figure, axes = plt.subplots(figsize=(7, 3.4), layout="constrained")
        # systems often tie (same speakers, same plan): a marker, a dash pattern and a small
        # sideways shift per system keep every line visible; the ticks stay on the positions
        step = min(0.06, 0.3 / len(curves))
        for i, (name, curve) in enumerate(curves.items()):
            positions = sorted(int(k) for k in curve)
            shift = (i - (len(curves) - 1) / 2) * step
            axes.plot([k + shift for k in positions], [curve[str(k)] for k in positions],
                      marker=_MARKERS[i % len(_MARKERS)], linestyle=_DASHES[i % len(_DASHES)], label=name)
        ticks = sorted({int(k) for curve in curves.values() for k in curve})
        axes.set_xticks(ticks, [str(k) for k in ticks])
        axes.set_xlim(ticks[0] - 0.4, ticks[-1] + 0.4)
        axes.set_xlabel("voice in the round")
        axes.set_ylabel("redundancy (cosine)")
        axes.set_title("Redundancy by position in the round")
        axes.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
        written.append(out / "redundancy.png")
        figure.savefig(written[-1], dpi=110)
        plt.close(figure)
    return written


def _stats(values: Mapping[str, float]) -> dict[str, float | int]:
    xs = list(values.values())
    if not xs:
        return {"mean": math.nan, "sd": math.nan, "n": 0}
    mean = _mean(xs)
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) if len(xs) > 1 else 0.0
    return {"mean": mean, "sd": sd, "n": len(xs)}


def _mean(values: Any) -> float:
    xs = list(values)
    return sum(xs) / len(xs)


def _digits(table: str) -> int:
    return 3 if table == "metrics" else 1  # guards: percentages and counts, one decimal
