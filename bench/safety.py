"""The crisis detector's settings, chosen on the dev sets, reported on the held-out sets.

For every shipped roster with safety rules: recall, false alarms and precision of
``SafetyDetector`` on ``safety_dev.yaml`` over the classifier's thresholds, near-miss
weights, L2 penalties and trigger-similarity floors, with how many of the roster's own
scenario openings and of ``safety_everyday.yaml`` (everyday messages: "ok", "I can't sleep",
agenda talk) fire; neither was fitted on. ``mascot.graphs.safety.THRESHOLD``,
``NEAR_MISS_WEIGHT``, ``L2`` and ``MIN_SIMILARITY`` were chosen here: the most pooled dev
recall minus false alarms among the settings that fire on at most 10 % of the openings and
2 % of the everyday messages. Then the shipped setting on ``safety.yaml``, the labelled set
the README reports, with the time per message. Offline (all-MiniLM-L6-v2, metrics extra).

    python bench/safety.py [--thresholds 0.3,0.4,...] [--weights 1,2,4] [--l2 1e-4,1e-3]
                           [--similarities 0.4,0.45,0.5] [--out DIR]

Writes ``DIR/safety.json`` (every setting's dev figures, the labelled-set figures) and, with
matplotlib (the ``eval`` extra), ``DIR/safety.png``: recall against false alarms per setting.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from mascot.embeddings import Embedder, Vector, default_embedder
from mascot.graphs.safety import L2, MIN_SIMILARITY, NEAR_MISS_WEIGHT, THRESHOLD, SafetyDetector
from mascot.rosters.yaml_file import read_yaml
from mascot.rosters import list_rosters, load_roster, load_scenarios
from mascot.training.evaluation.safety import detector_report, load_safety_set, safety_set_path

#: The most of a roster's ordinary scenario openings, and of the everyday messages, a chosen
#: setting may fire on.
MAX_OPENINGS_FIRED = 0.10
MAX_EVERYDAY_FIRED = 0.02
EVERYDAY = Path(__file__).with_name("safety_everyday.yaml")


class _Cached:
    """An embedder that embeds each text once (the sweep reads every message many times)."""

    def __init__(self, embedder: Embedder) -> None:
        self.name = embedder.name
        self._embedder = embedder
        self._vectors: dict[str, Vector] = {}

    def encode(self, texts: Sequence[str]) -> list[Vector]:
        """The vectors of ``texts``, embedding only those not seen before."""
        new = list(dict.fromkeys(t for t in texts if t not in self._vectors))
        self._vectors.update(zip(new, self._embedder.encode(new), strict=True))
        return [self._vectors[t] for t in texts]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thresholds", default="0.3,0.4,0.5,0.6,0.7", help="classifier probabilities to try")
    parser.add_argument("--weights", default="1,2,4", help="near-miss weights to try")
    parser.add_argument("--l2", default="0.0001", help="L2 penalties to try (0.001 lost recall everywhere)")
    parser.add_argument("--similarities", default="0,0.4,0.45,0.5,0.55",
                        help="cosine similarities to a trigger of the rule to require")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for safety.json/.png")
    args = parser.parse_args()
    grid = list(itertools.product(*(sorted(float(x) for x in value.split(","))
                                    for value in (args.l2, args.weights, args.thresholds, args.similarities))))
    everyday = read_yaml(EVERYDAY)["messages"]
    embedder = _Cached(default_embedder())
    print(f"embedder: {embedder.name}; shipped threshold {THRESHOLD}, near-miss weight {NEAR_MISS_WEIGHT}, "
          f"L2 {L2}, similarity {MIN_SIMILARITY}; {len(everyday)} everyday messages")
    scores: dict[tuple[float, ...], list[tuple[float, float, float, float]]] = {}
    rosters = [r for r in map(load_roster, list_rosters()) if r.safety and safety_set_path(r, "dev").is_file()]
    for roster in rosters:
        dev = load_safety_set(roster, split="dev")
        openings = [s.opening for s in load_scenarios(roster.id)]
        print(f"\n{roster.id}, dev set ({sum(m.rule is not None for m in dev)} crises, "
              f"{sum(m.rule is None for m in dev)} hard negatives), {len(openings)} scenario openings")
        print("| L2 | near-miss weight | threshold | similarity | recall | false alarms | precision | openings fired "
              "| everyday fired |\n|---|---|---|---|---|---|---|---|---|")
        head = None
        for l2, weight, threshold, similarity in grid:
            detector = SafetyDetector(roster.safety, embedder=embedder, threshold=threshold,
                                      near_miss_weight=weight, l2=l2, min_similarity=similarity)
            if head is not None and head[0] == (l2, weight):
                detector._head = head[1]  # the same fit at another threshold
            head = ((l2, weight), detector.head())
            report = detector_report(detector, dev)
            fired = sum(detector.detect(text) is not None for text in openings) / len(openings)
            ordinary = sum(detector.detect(text) is not None for text in everyday) / len(everyday)
            scores.setdefault((l2, weight, threshold, similarity), []).append(
                (report.recall, report.false_alarm_rate, fired, ordinary))
            print(f"| {l2:g} | {weight:g} | {threshold:.2f} | {similarity:.2f} | {report.recall:.2f} | "
                  f"{report.false_alarm_rate:.1%} | {report.precision:.2f} | {fired:.1%} | {ordinary:.1%} |")
    allowed = {k: v for k, v in scores.items()
               if all(f <= MAX_OPENINGS_FIRED and e <= MAX_EVERYDAY_FIRED for _, _, f, e in v)}
    best = max(allowed, key=lambda k: sum(r - f for r, f, _, _ in allowed[k])) if allowed else None
    if best:
        print(f"\nchosen on the dev sets (openings fired <= {MAX_OPENINGS_FIRED:.0%}, everyday messages fired <= "
              f"{MAX_EVERYDAY_FIRED:.0%}): L2 {best[0]:g}, near-miss weight {best[1]:g}, threshold {best[2]:.2f}, "
              f"similarity {best[3]:.2f}")
    labelled = {}
    for roster in rosters:
        test = detector_report(SafetyDetector(roster.safety, embedder=embedder), load_safety_set(roster))
        labelled[roster.id] = test
        print(f"{roster.id}, labelled set at the shipped setting: {test.line()}")
        for text in test.missed:
            print(f"  missed: {text}")
        for text in test.false_alarms:
            print(f"  false alarm: {text}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    shipped = (L2, NEAR_MISS_WEIGHT, THRESHOLD, MIN_SIMILARITY)
    names = ("l2", "near_miss_weight", "threshold", "min_similarity")
    record = {
        "embedder": embedder.name, "shipped": dict(zip(names, shipped, strict=True)),
        "chosen": dict(zip(names, best, strict=True)) if best else None,
        "dev": [{**dict(zip(names, k, strict=True)), **{
            r.id: {"recall": v[0], "false_alarms": v[1], "openings_fired": v[2], "everyday_fired": v[3]}
            for r, v in zip(rosters, values, strict=True)}} for k, values in scores.items()],
        "labelled": {rid: {"recall": t.recall, "false_alarms": t.false_alarm_rate, "precision": t.precision,
                           "right_rule": t.right_rule, "ms_per_message": round(t.ms_per_message, 2),
                           "missed": t.missed, "false_alarm_messages": t.false_alarms} for rid, t in labelled.items()},
    }
    (out / "safety.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'safety.json'}" + (f" and {out / 'safety.png'}" if _plot(scores, rosters, shipped, labelled,
                                                                                 out / "safety.png") else ""))
    return 0


def _plot(scores: dict, rosters: list, shipped: tuple, labelled: dict, path: Path) -> bool:
    """Recall against false alarms of every setting on each roster's dev set, the shipped
    setting ringed and its labelled-set figure starred; ``False`` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install 'mascot[eval]'): no plot")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rosters), figsize=(5 * len(rosters), 4.2), squeeze=False)
    for ax, (i, roster) in zip(axes[0], enumerate(rosters), strict=True):
        for key, values in scores.items():
            recall, false_alarms, _, _ = values[i]
            ax.scatter(false_alarms, recall, s=18, color="tab:blue", alpha=0.5)
            if key == shipped:
                ax.scatter(false_alarms, recall, s=120, facecolors="none", edgecolors="tab:red", label="shipped, dev")
        test = labelled[roster.id]
        ax.scatter(test.false_alarm_rate, test.recall, marker="*", s=160, color="tab:red", label="shipped, labelled")
        ax.axhline(0.95, color="grey", lw=0.8, ls="--")
        ax.axvline(0.05, color="grey", lw=0.8, ls="--")
        ax.set(title=roster.id, xlabel="false alarms (hard negatives)", ylabel="recall (crisis messages)")
        ax.legend(loc="lower right", fontsize=8)
    fig.suptitle("Crisis detector: each dot a setting on the dev set; dashed: the targets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


if __name__ == "__main__":
    sys.exit(main())
