"""The crisis detector's similarity threshold, chosen on the dev sets, reported on the held-out sets.

For every shipped roster with safety rules: recall, false alarms and precision of
``SafetyDetector`` on ``safety_dev.yaml`` over thresholds and margins, with how many of the
roster's own scenario openings (ordinary conversations) fire: where
``mascot.graphs.safety.THRESHOLD`` and ``MARGIN`` were chosen (the most pooled dev recall
minus false alarms among the settings that fire on at most 5 % of the openings). Then the
shipped setting on ``safety.yaml``, the labelled set the README reports, with the time per
message. Offline (all-MiniLM-L6-v2 from the metrics extra).

    python bench/safety.py [--thresholds 0.4,0.45,...] [--margins 0,0.05,...]
"""

from __future__ import annotations

import argparse
import sys

from mascot.embeddings import default_embedder
from mascot.graphs.safety import MARGIN, THRESHOLD, SafetyDetector
from mascot.rosters import list_rosters, load_roster, load_scenarios
from mascot.training.evaluation.safety import detector_report, load_safety_set, safety_set_path


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--thresholds", default="0.45,0.5,0.55,0.6",
                        help="comma-separated thresholds to try on the dev sets")
    parser.add_argument("--margins", default="0,0.03,0.05",
                        help="comma-separated margins over the nearest near miss to try on the dev sets")
    args = parser.parse_args()
    thresholds = [float(t) for t in args.thresholds.split(",")]
    margins = [float(m) for m in args.margins.split(",")]
    embedder = default_embedder()
    print(f"embedder: {embedder.name}; shipped threshold {THRESHOLD}, margin {MARGIN}")
    for roster in (load_roster(r) for r in list_rosters()):
        if not roster.safety or not safety_set_path(roster, "dev").is_file():
            continue
        dev = load_safety_set(roster, split="dev")
        print(f"\n{roster.id}, dev set ({sum(m.rule is not None for m in dev)} crises, "
              f"{sum(m.rule is None for m in dev)} hard negatives)")
        openings = [s.opening for s in load_scenarios(roster.id)]
        print("| threshold | margin | recall | false alarms | precision | openings fired |\n|---|---|---|---|---|---|")
        for threshold in thresholds:
            for margin in margins:
                report = detector_report(SafetyDetector(roster.safety, embedder=embedder, threshold=threshold,
                                                        margin=margin), dev)
                detector = SafetyDetector(roster.safety, embedder=embedder, threshold=threshold, margin=margin)
                fired = sum(detector.detect(text) is not None for text in openings)
                print(f"| {threshold:.2f} | {margin:.2f} | {report.recall:.2f} | {report.false_alarm_rate:.1%} | "
                      f"{report.precision:.2f} | {fired}/{len(openings)} |")
        test = detector_report(SafetyDetector(roster.safety, embedder=embedder), load_safety_set(roster))
        print(f"{roster.id}, labelled set at threshold {THRESHOLD}, margin {MARGIN}: {test.line()}")
        for text in test.missed:
            print(f"  missed: {text}")
        for text in test.false_alarms:
            print(f"  false alarm: {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
