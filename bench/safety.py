"""The crisis detector's settings, chosen on the dev sets, reported on the held-out sets.

For every shipped roster with safety rules: recall, false alarms and precision of
``SafetyDetector`` on ``safety_dev.yaml`` over the classifier's thresholds, near-miss
weights and L2 penalties, with how many of the roster's own scenario openings (ordinary
conversations, never fitted on) fire. ``mascot.graphs.safety.THRESHOLD``,
``NEAR_MISS_WEIGHT`` and ``L2`` were chosen here: the most pooled dev recall minus false
alarms among the settings that fire on at most 10 % of the openings. Then the shipped
setting on ``safety.yaml``, the labelled set the README reports, with the time per message.
Offline (all-MiniLM-L6-v2 from the metrics extra).

    python bench/safety.py [--thresholds 0.3,0.4,...] [--weights 1,2,4] [--l2 1e-4,1e-3]
"""

from __future__ import annotations

import argparse
import itertools
import sys

from mascot.embeddings import default_embedder
from mascot.graphs.safety import L2, NEAR_MISS_WEIGHT, THRESHOLD, SafetyDetector
from mascot.rosters import list_rosters, load_roster, load_scenarios
from mascot.training.evaluation.safety import detector_report, load_safety_set, safety_set_path

#: The most of a roster's ordinary scenario openings a chosen setting may fire on.
MAX_OPENINGS_FIRED = 0.10


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thresholds", default="0.3,0.4,0.5,0.6,0.7", help="classifier probabilities to try")
    parser.add_argument("--weights", default="1,2,4", help="near-miss weights to try")
    parser.add_argument("--l2", default="0.0001,0.001", help="L2 penalties to try")
    args = parser.parse_args()
    grid = list(itertools.product(*(sorted(float(x) for x in value.split(","))
                                    for value in (args.l2, args.weights, args.thresholds))))
    embedder = default_embedder()
    print(f"embedder: {embedder.name}; shipped threshold {THRESHOLD}, near-miss weight {NEAR_MISS_WEIGHT}, L2 {L2}")
    scores: dict[tuple[float, float, float], list[tuple[float, float, float]]] = {}
    rosters = [r for r in map(load_roster, list_rosters()) if r.safety and safety_set_path(r, "dev").is_file()]
    for roster in rosters:
        dev = load_safety_set(roster, split="dev")
        openings = [s.opening for s in load_scenarios(roster.id)]
        print(f"\n{roster.id}, dev set ({sum(m.rule is not None for m in dev)} crises, "
              f"{sum(m.rule is None for m in dev)} hard negatives), {len(openings)} scenario openings")
        print("| L2 | near-miss weight | threshold | recall | false alarms | precision | openings fired |\n"
              "|---|---|---|---|---|---|---|")
        head = None
        for l2, weight, threshold in grid:
            detector = SafetyDetector(roster.safety, embedder=embedder, threshold=threshold,
                                      near_miss_weight=weight, l2=l2)
            if head is not None and head[0] == (l2, weight):
                detector._head = head[1]  # the same fit at another threshold
            head = ((l2, weight), detector.head())
            report = detector_report(detector, dev)
            fired = sum(detector.detect(text) is not None for text in openings) / len(openings)
            scores.setdefault((l2, weight, threshold), []).append((report.recall, report.false_alarm_rate, fired))
            print(f"| {l2:g} | {weight:g} | {threshold:.2f} | {report.recall:.2f} | {report.false_alarm_rate:.1%} | "
                  f"{report.precision:.2f} | {fired:.1%} |")
    allowed = {k: v for k, v in scores.items() if all(f <= MAX_OPENINGS_FIRED for _, _, f in v)}
    if allowed:
        best = max(allowed, key=lambda k: sum(r - f for r, f, _ in allowed[k]))
        print(f"\nchosen on the dev sets (openings fired <= {MAX_OPENINGS_FIRED:.0%}): L2 {best[0]:g}, "
              f"near-miss weight {best[1]:g}, threshold {best[2]:.2f}")
    for roster in rosters:
        test = detector_report(SafetyDetector(roster.safety, embedder=embedder), load_safety_set(roster))
        print(f"{roster.id}, labelled set at the shipped setting: {test.line()}")
        for text in test.missed:
            print(f"  missed: {text}")
        for text in test.false_alarms:
            print(f"  false alarm: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
