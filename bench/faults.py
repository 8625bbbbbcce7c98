"""How well the fault verifiers agree with hand labels of what real models wrote.

``bench/faults/labels.yaml`` holds replies and directions the offline Qwen2.5-Coder 0.5B
and 1.5B instruct models wrote (as voices and as the Director), each labelled by reading
it against ``bench/faults/rule.md`` before the detector was fitted. The detector's patterns
were fitted on the ``dev`` half only; this prints precision and recall per fault on both
halves (``test`` is the figure to quote) and writes ``bench/results/faults.json``.

    python bench/faults.py [--labels FILE ...] [--split dev|test|all] [--misses] [--write PAGE]

``--misses`` lists every disagreement of the chosen split (for fitting on dev); ``--write``
puts the table of both halves into a page, between ``<!-- faults: start -->`` and
``<!-- faults: end -->`` (docs/evaluation.md).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

from mascot.graphs.faults import (
    DIRECTION_FAULTS,
    REPLY_FAULTS,
    direction_faults,
    persona_texts,
    reply_faults,
    roster_texts,
    voice_names,
)
from mascot.rosters import Roster, load_roster

HERE = Path(__file__).resolve().parent
LABELS = (HERE / "faults" / "labels.yaml",)
#: The agreement each fault must reach on the test half (the verifiers' gate).
GATE = 0.9


def load_items(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Every labelled item of ``paths`` (a missing file is an error, a missing label too)."""
    items = []
    for path in paths:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        for item in data["items"]:
            if item.get("labels") is None:
                raise SystemExit(f"{path}: item {item.get('id')} has no labels")
            items.append(item)
    return items


def detect(item: dict[str, Any], roster: Roster) -> set[str]:
    """The detector's faults for one labelled item, given what its writer saw."""
    voices = [v.split(": ", 1)[-1] for v in item.get("earlier_voices") or []]
    if item["kind"] == "reply":
        direction = item.get("direction") or {}
        return set(reply_faults(item["text"], person=item.get("person", ""), voices=voices,
                                personas=persona_texts(roster),
                                instructions=[direction.get("action", ""), direction.get("tone", "")]))
    return set(direction_faults(item.get("action", ""), item.get("tone", ""), names=voice_names(roster),
                                shown=[item.get("person", ""), *voices, *roster_texts(roster)]))


def agreement(items: Sequence[dict[str, Any]], roster: Roster) -> dict[str, dict[str, Any]]:
    """Per kind and fault: true and false positives, false negatives, precision and recall."""
    table: dict[str, dict[str, Any]] = {}
    for kind, faults in (("reply", REPLY_FAULTS), ("direction", DIRECTION_FAULTS)):
        rows = [(set(i["labels"]), detect(i, roster)) for i in items if i["kind"] == kind]
        for fault in (*faults, "any"):
            def has(found: set[str], fault: str = fault) -> bool:
                return bool(found) if fault == "any" else fault in found
            tp = sum(has(lab) and has(det) for lab, det in rows)
            fp = sum(not has(lab) and has(det) for lab, det in rows)
            fn = sum(has(lab) and not has(det) for lab, det in rows)
            table[f"{kind}/{fault}"] = {"items": len(rows), "labelled": tp + fn, "tp": tp, "fp": fp, "fn": fn,
                                        "precision": tp / (tp + fp) if tp + fp else None,
                                        "recall": tp / (tp + fn) if tp + fn else None}
    return table


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--labels", nargs="+", type=Path, default=list(LABELS), help="labelled items (YAML)")
    parser.add_argument("--split", choices=("dev", "test", "all"), default="test", help="which half --misses lists")
    parser.add_argument("--misses", action="store_true", help="list the disagreements of --split")
    parser.add_argument("--out", type=Path, default=HERE / "results" / "faults.json", help="figures (JSON)")
    parser.add_argument("--write", type=Path, metavar="PAGE", help="write the table into PAGE's marked section")
    args = parser.parse_args()
    roster = load_roster("emotional_support")
    items = load_items(args.labels)
    results = {"gate": GATE, "models": sorted({i["model"] for i in items}), "splits": {}}
    for split in ("dev", "test"):
        chosen = [i for i in items if i["split"] == split]
        results["splits"][split] = agreement(chosen, roster)
        print(f"\n{split}: {sum(i['kind'] == 'reply' for i in chosen)} replies, "
              f"{sum(i['kind'] == 'direction' for i in chosen)} directions")
        print(f"{'fault':28} {'labelled':>8} {'tp':>4} {'fp':>4} {'fn':>4} {'precision':>9} {'recall':>7}")
        for name, row in results["splits"][split].items():
            p, r = (f"{v:.2f}" if v is not None else "-" for v in (row["precision"], row["recall"]))
            print(f"{name:28} {row['labelled']:8} {row['tp']:4} {row['fp']:4} {row['fn']:4} {p:>9} {r:>7}")
    if args.misses:
        for item in items:
            if args.split != "all" and item["split"] != args.split:
                continue
            found, labelled = detect(item, roster), set(item["labels"])
            if found != labelled:
                shown = item.get("text") or f"action={item.get('action')!r} tone={item.get('tone')!r}"
                print(f"\n[{item['id']} {item['kind']}] labelled {sorted(labelled)} detected {sorted(found)}"
                      f"\n  {shown}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1) + "\n", encoding="utf-8")
    if args.write:
        page = args.write.read_text(encoding="utf-8")
        if START not in page or END not in page:
            raise SystemExit(f"{args.write}: no {START} ... {END} section")
        head, rest = page.split(START, 1)
        args.write.write_text(head + START + "\n" + table(results, items) + END + rest.split(END, 1)[1],
                              encoding="utf-8")
    return 0


START, END = "<!-- faults: start -->", "<!-- faults: end -->"


def table(results: dict[str, Any], items: Sequence[dict[str, Any]]) -> str:
    """The agreement per fault on both halves, as a Markdown table (test first: the figure to quote)."""
    counts = {(m, k): sum(i["model"] == m and i["kind"] == k for i in items) for m in results["models"]
              for k in ("reply", "direction")}
    lines = ["Labelled outputs: " + ", ".join(f"{m}: {counts[m, 'reply']} replies, {counts[m, 'direction']} directions"
                                              for m in results["models"]) + ". Each cell: precision / recall "
             f"(items labelled with the fault); the gate is {GATE:.2f} for both on test.", "",
             "| fault | test | dev |", "|---|---|---|"]

    def cell(row: dict[str, Any]) -> str:
        p, r = (f"{v:.2f}" if v is not None else "-" for v in (row["precision"], row["recall"]))
        return f"{p} / {r} ({row['labelled']})"

    for name in results["splits"]["test"]:
        lines.append(f"| {name} | {cell(results['splits']['test'][name])} | {cell(results['splits']['dev'][name])} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
