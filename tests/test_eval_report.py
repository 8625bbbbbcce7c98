"""Bootstrap intervals and the evaluation report, on constructed scores with known answers."""

from __future__ import annotations

import csv
import json
import random
from pathlib import Path

import pytest

from mascot.training.evaluation.bootstrap import bootstrap_difference
from mascot.training.evaluation.report import SystemScores, summarize, write_report


def test_bootstrap_finds_a_known_difference() -> None:
    rng = random.Random(0)
    base = {f"e{i}": rng.gauss(50, 10) for i in range(60)}
    better = {k: v + 8 + rng.gauss(0, 2) for k, v in base.items()}
    difference = bootstrap_difference(better, base)
    assert difference.paired and difference.n == 60
    assert difference.low < 8 < difference.high and difference.low > 6 and difference.significant
    same = {k: v + rng.gauss(0, 2) for k, v in base.items()}
    noise = bootstrap_difference(same, base)
    assert noise.low < 0 < noise.high and not noise.significant
    unpaired = bootstrap_difference({"x": 1.0, "y": 3.0}, {"z": 1.0})
    assert not unpaired.paired and unpaired.estimate == pytest.approx(1.0)
    with pytest.raises(ValueError, match="both samples"):
        bootstrap_difference({}, base)


def test_a_clustered_bootstrap_is_wider_when_the_difference_lives_in_the_scenarios() -> None:
    rng = random.Random(1)
    # 8 scenarios x 6 people: the gain is the scenario's (shared by its episodes), not the episode's
    gains = {s: rng.gauss(2, 6) for s in range(8)}
    clusters = {f"s{s}-p{p}": f"s{s}" for s in range(8) for p in range(6)}
    base = {k: 50.0 for k in clusters}
    better = {k: 50.0 + gains[int(c[1:])] + rng.gauss(0, 0.5) for k, c in clusters.items()}
    naive, clustered = bootstrap_difference(better, base), bootstrap_difference(better, base, clusters=clusters)
    assert clustered.estimate == pytest.approx(naive.estimate) and clustered.n == naive.n == 48
    # 48 episodes look like 48 draws; there are 8: the honest interval is about sqrt(6) wider
    assert (clustered.high - clustered.low) > 2 * (naive.high - naive.low)
    with pytest.raises(ValueError, match="no cluster"):
        bootstrap_difference(better, base, clusters={"s0-p0": "s0"})


def systems() -> list[SystemScores]:
    ids = [f"e{i}" for i in range(10)]
    def table(offset: float) -> dict:
        return {"persona": {"overall": {e: 50 + offset + i for i, e in enumerate(ids)},
                            "persona_consistency": {e: 40 + offset for e in ids}},
                "group": {"overall": {e: 60 + offset for e in ids}},
                "metrics": {"redundancy": {e: 0.5 - offset / 100 for e in ids}}}
    return [SystemScores("trained", "trained", table(10), {2: 0.2, 3: 0.3}),
            SystemScores("round_robin", "baseline", table(4), {2: 0.4, 3: 0.5}),
            SystemScores("random", "baseline", table(0), {2: 0.5}),
            SystemScores("no_director", "ablation", table(2))]


def test_report_tables_are_recomputed_from_the_results(tmp_path: Path) -> None:
    summary = summarize(systems())
    files = write_report(summary, tmp_path, header="tiny model")
    assert {f.name for f in files} == {"results.json", "results.csv", "report.md", "persona.png", "group.png",
                                       "redundancy.png"}
    results = json.loads((tmp_path / "results.json").read_text())
    overall = results["systems"]["trained"]["tables"]["persona"]["overall"]
    values = list(results["systems"]["trained"]["episodes"]["persona"]["overall"].values())
    assert overall["mean"] == pytest.approx(sum(values) / len(values)) and overall["n"] == 10
    difference = results["differences"]["persona"]["overall"]
    assert difference["best_baseline"] == "round_robin" and difference["difference"] == pytest.approx(6.0)
    assert results["differences"]["metrics"]["redundancy"]["best_baseline"] == "round_robin"  # lower is better
    report = (tmp_path / "report.md").read_text()
    assert f"{overall['mean']:.1f} ± {overall['sd']:.1f} (n=10)" in report
    assert "+6.0 [+6.0, +6.0] * vs round_robin" in report and "no_director (ablation)" in report
    assert "![Persona level (judge, 0-100)](persona.png)" in report
    rows = list(csv.DictReader((tmp_path / "results.csv").open()))
    assert {(r["system"], r["table"], r["column"]) for r in rows} >= {("random", "group", "overall")}
    assert (tmp_path / "persona.png").read_bytes()[:4] == b"\x89PNG"


@pytest.fixture
def saved_figures(monkeypatch: pytest.MonkeyPatch) -> dict:
    """Every figure ``write_report`` saves, by file name (kept after the report closes it)."""
    from matplotlib.figure import Figure

    figures = {}
    savefig = Figure.savefig

    def recording(self: Figure, fname: object, *args: object, **kwargs: object) -> None:
        figures[Path(str(fname)).name] = self
        savefig(self, fname, *args, **kwargs)

    monkeypatch.setattr(Figure, "savefig", recording)
    return figures


def test_plots_have_integer_positions_and_keep_equal_series_apart(tmp_path: Path, saved_figures: dict) -> None:
    same = {2: 0.4, 3: 0.55, 4: 0.6}
    scores = [*systems()[:2], SystemScores("no_alignment", "ablation", systems()[0].tables, dict(same)),
              SystemScores("all_speak", "baseline", systems()[1].tables, dict(same))]
    write_report(summarize(scores), tmp_path)
    assert set(saved_figures) == {"persona.png", "group.png", "redundancy.png"}
    axes = saved_figures["redundancy.png"].axes[0]
    # the voice in the round is a count: one tick per position, labelled as an integer
    assert [label.get_text() for label in axes.get_xticklabels()] == ["2", "3", "4"]
    assert list(axes.get_xticks()) == [2, 3, 4]
    lines = {line.get_label(): line for line in axes.get_lines()}
    assert set(lines) == {"trained", "round_robin", "no_alignment", "all_speak"}
    legend = {text.get_text() for text in axes.get_legend().get_texts()}
    assert legend == set(lines)
    # two systems with the same values stay visible: each line has its own marker and x offset
    assert len({line.get_marker() for line in lines.values()}) == len(lines)
    xs = {name: tuple(line.get_xdata()) for name, line in lines.items()}
    assert xs["no_alignment"] != xs["all_speak"]
    assert all(abs(x - round(x)) <= 0.2 for x in xs["no_alignment"] + xs["all_speak"])
    assert list(lines["no_alignment"].get_ydata()) == list(lines["all_speak"].get_ydata())
    # the bar charts' x axis is the criteria, named; no fractional positions are labelled
    bars = saved_figures["persona.png"].axes[0]
    assert [label.get_text() for label in bars.get_xticklabels()] == ["Consistency", "Overall"]
    figure_legend = saved_figures["persona.png"].legends[0]
    assert [text.get_text() for text in figure_legend.get_texts()] == [s.name for s in scores]
