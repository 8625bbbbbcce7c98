"""The crisis detector's settings, chosen on the dev sets, reported on the held-out sets.

For every shipped roster with safety rules: recall, false alarms and precision of
``SafetyDetector`` on ``safety_dev.yaml`` over the classifier's thresholds, near-miss
weights, L2 penalties and trigger-similarity floors, with how many of the roster's own
scenario openings and of ``safety_everyday.yaml`` (everyday messages: "ok", "I can't sleep",
agenda talk) fire; neither was fitted on. ``mascot.graphs.safety_detector.THRESHOLD``,
``NEAR_MISS_WEIGHT``, ``L2`` and ``MIN_SIMILARITY`` were chosen here: the most pooled dev
recall minus false alarms among the settings that fire on at most 10 % of the openings and
2 % of the everyday messages. Then the shipped setting on ``safety.yaml``, the labelled set
the README reports, with the time per message. Each encoder (lexical, all-MiniLM-L6-v2 from
the metrics extra, all-mpnet-base-v2 from ``mascot offline-encoder``) side by side in one
run; the context settings (``CONTEXT_FLOOR``, ``CONTEXT_THRESHOLD``, ``ALONE_THRESHOLD``) on
the dev conversations, and the held-out conversations reported with the messages. Last, the
import and first guarded round of a plain install (no extras).

    python bench/safety.py [--encoders lexical,minilm,mpnet] [--thresholds 0.3,0.4,...]
                           [--weights 1,2,4] [--l2 1e-4,1e-3] [--similarities 0.4,0.45,0.5] [--out DIR]

Writes ``DIR/safety.json`` (every setting's dev figures, the held-out figures, per encoder)
and, with matplotlib (the ``eval`` extra), ``DIR/safety.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from mascot.graphs import risk
from mascot.graphs.embeddings import EMBEDDERS, Embedder, Vector, embedder_by_name
from mascot.graphs.safety_detector import SafetyDetector
from mascot.rosters import list_rosters, load_roster, load_scenarios
from mascot.rosters.yaml_file import read_yaml
from mascot.training.evaluation.safety import (
    conversation_report,
    detector_report,
    load_conversation_set,
    load_safety_set,
    safety_set_path,
)

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
    parser.add_argument("--encoders", default=",".join(EMBEDDERS),
                        help="encoders to compare side by side (those not installed or built are skipped)")
    parser.add_argument("--thresholds", default="0.3,0.4,0.5,0.6,0.7", help="classifier probabilities to try")
    parser.add_argument("--weights", default="1,2,4", help="near-miss weights to try")
    parser.add_argument("--l2", default="0.0001", help="L2 penalties to try (0.001 lost recall everywhere)")
    parser.add_argument("--similarities", default="0,0.4,0.45,0.5,0.55",
                        help="cosine similarities to a trigger of the rule to require")
    parser.add_argument("--out", default=str(Path(__file__).parent / "results"), help="folder for safety.json/.png")
    parser.add_argument("--signals-only", action="store_true",
                        help="only each signal alone and together on the conversations (no sweep), written into "
                             "the encoders' entries of an existing safety.json")
    args = parser.parse_args()
    if args.signals_only:
        return _signals_only(args)
    grid = list(itertools.product(*(sorted(float(x) for x in value.split(","))
                                    for value in (args.l2, args.weights, args.thresholds, args.similarities))))
    everyday = read_yaml(EVERYDAY)["messages"]
    rosters = _rosters()
    record: dict = {"encoders": {}}
    for name, raw in _embedders(args.encoders):
        shipped = SafetyDetector([], embedder=raw).settings
        print(f"\n=== encoder {name}; shipped settings {shipped}; {len(everyday)} everyday messages")
        record["encoders"][name] = {"shipped": shipped, **_encoder(raw, rosters, grid, everyday)}
    record["plain_install_first_round_s"] = _plain_install_seconds()
    print(f"\nplain install (no extras: lexical, shipped classifier): import and first guarded round "
          f"{record['plain_install_first_round_s']:.2f} s (median of 3)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "safety.json").write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {out / 'safety.json'}" + (f" and {out / 'safety.png'}" if _plot(record, rosters, out / "safety.png")
                                           else ""))
    return 0


NAMES = ("l2", "near_miss_weight", "threshold", "min_similarity")
#: The context settings tried on the dev conversations (at the shipped single-message setting),
#: and the context off (every message read alone).
CONTEXT_OFF = (1.01, 1.01, 0.0)
CONTEXT_GRID = [CONTEXT_OFF, *itertools.product((0.05, 0.1, 0.2), (0.2, 0.3, 0.4), (0.4, 0.5, 0.7, 1.01))]


def _encoder(raw: Embedder, rosters: list, grid: list, everyday: list[str]) -> dict:
    """One encoder: the single-message sweep and the context sweep on the dev sets, then the
    shipped setting on the held-out sets, the openings and the everyday messages."""
    embedder = _Cached(raw)
    scores: dict[tuple[float, ...], list[tuple[float, float, float, float]]] = {}
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
    context: dict[tuple[float, ...], list[tuple[float, float]]] = {}
    for roster in rosters:
        talks = load_conversation_set(roster, split="dev")
        for floor, together, alone in CONTEXT_GRID:
            detector = SafetyDetector(roster.safety, embedder=embedder, context_floor=floor,
                                      context_threshold=together, alone_threshold=alone)
            report = conversation_report(detector, talks)
            context.setdefault((floor, together, alone), []).append((report.recall, report.false_alarm_rate))
    # the most pooled recall among the settings that raise no roster's false alarms above the
    # context off: a false alarm persists for the rest of a conversation
    calm = {k: v for k, v in context.items()
            if all(f <= off_f for (_, f), (_, off_f) in zip(v, context[CONTEXT_OFF], strict=True))}
    chosen = max(calm, key=lambda k: (sum(r for r, _ in calm[k]), -sum(f for _, f in calm[k])))
    print("\ndev conversations, context settings (floor, together, alone): recall / false alarms per roster")
    for key, values in sorted(context.items(), key=lambda kv: -sum(r - f for r, f in kv[1]))[:8]:
        print(f"  {key}: " + ", ".join(f"{r:.2f} / {f:.1%}" for r, f in values))
    print("  context off: " + ", ".join(f"{r:.2f} / {f:.1%}" for r, f in context[CONTEXT_OFF]))
    print(f"  chosen on the dev conversations (no more false alarms than the context off, then the most recall): "
          f"floor {chosen[0]}, together {chosen[1]}, alone {chosen[2]}: "
          + ", ".join(f"{r:.2f} / {f:.1%}" for r, f in context[chosen]))
    held_out = {}
    for roster in rosters:
        detector = SafetyDetector.for_roster(roster, embedder=raw)  # the real encoder: the time per message is real
        single = detector_report(detector, load_safety_set(roster))
        talks = conversation_report(detector, load_conversation_set(roster))
        openings = [s.opening for s in load_scenarios(roster.id)]
        fired = [o for o in openings if detector.detect(o) is not None]
        ordinary = [e for e in everyday if detector.detect(e) is not None]
        held_out[roster.id] = {
            "recall": single.recall, "false_alarms": single.false_alarm_rate, "precision": single.precision,
            "right_rule": single.right_rule, "ms_per_message": round(single.ms_per_message, 2),
            "missed": single.missed, "false_alarm_messages": single.false_alarms,
            "conversation_recall": talks.recall, "conversation_on_time": talks.on_time,
            "conversation_false_alarms": talks.false_alarm_rate, "conversation_right_rule": talks.right_rule,
            "conversations_missed": talks.missed, "conversation_false_alarm_ids": talks.false_alarms,
            "openings_fired": len(fired), "openings": len(openings), "openings_fired_texts": fired,
            "everyday_fired": len(ordinary) / len(everyday), "everyday_fired_texts": ordinary}
        print(f"{roster.id}, held out at the shipped setting: {single.line()}")
        print(f"{roster.id}, held out: {talks.line()}")
        print(f"{roster.id}: {len(fired)} of {len(openings)} scenario openings fire; {len(ordinary)} of "
              f"{len(everyday)} everyday messages")
    names_context = ("context_floor", "context_threshold", "alone_threshold")
    return {"chosen": dict(zip(NAMES, best, strict=True)) if best else None,
            "dev": [{**dict(zip(NAMES, k, strict=True)), **{
                r.id: {"recall": v[0], "false_alarms": v[1], "openings_fired": v[2], "everyday_fired": v[3]}
                for r, v in zip(rosters, values, strict=True)}} for k, values in scores.items()],
            "context_chosen": dict(zip(names_context, chosen, strict=True)),
            "context_dev": [{**dict(zip(names_context, k, strict=True)), **{
                r.id: {"recall": v[0], "false_alarms": v[1]} for r, v in zip(rosters, values, strict=True)}}
                for k, values in context.items()],
            "held_out": held_out, "signals": _signals(embedder, rosters)}


def _rosters() -> list:
    """The shipped rosters with safety rules and labelled dev sets."""
    return [r for r in map(load_roster, list_rosters()) if r.safety and safety_set_path(r, "dev").is_file()]


def _embedders(names: str) -> list[tuple[str, Embedder]]:
    """The encoders named (comma-separated) that are installed or built; the others are skipped, said once."""
    found = []
    for name in (n for n in names.split(",") if n):
        try:
            found.append((name, embedder_by_name(name)))
        except ValueError as exc:
            print(f"\n{name}: skipped ({exc})")
    return found


def _ask_rate(detector: SafetyDetector, conversations: list[list[str]]) -> float:
    """The share of ``conversations`` in which, before any rule fires, a rule's running risk
    is from ``risk.ASK`` to ``risk.FIRE`` at some message: where a second opinion is asked."""
    asked = 0
    for said in conversations:
        level: dict[str, float] = {}
        for index, message in enumerate(said):
            found = detector.detect(message, said[:index])
            level = risk.update(level, message, detector.signal(message, said[:index]),
                                fired=found.rule if found else None)
            if found is not None or any(v >= risk.FIRE for v in level.values()):
                break
            if any(risk.ASK <= v for v in level.values()):
                asked += 1
                break
    return round(asked / len(conversations), 4) if conversations else 0.0


def _signals_only(args: argparse.Namespace) -> int:
    """``--signals-only``: the signals of each encoder, merged into the existing record."""
    path = Path(args.out) / "safety.json"
    record = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {"encoders": {}}
    rosters = _rosters()
    for name, raw in _embedders(args.encoders):
        print(f"\n=== encoder {name}")
        record["encoders"].setdefault(name, {})["signals"] = _signals(_Cached(raw), rosters)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")
    print(f"wrote {path}")
    return 0


#: The guard's signals, alone and together: (name, window classifier, running risk).
SIGNALS = (("message", False, False), ("message + running risk", False, True),
           ("message + window", True, False), ("all: message + window + running risk", True, True))


def _signals(embedder: Embedder, rosters: list) -> dict:
    """Each signal of the guard alone and together on the dev and held-out conversations:
    recall, on time (no later than the message labelled), false alarms."""
    out: dict = {}
    print("\nconversations by signal: recall / on time / false alarms (dev | held out)")
    for roster in rosters:
        sets = {split: load_conversation_set(roster, split=split) for split in ("dev", "test")}
        for name, window, running in SIGNALS:
            detector = (SafetyDetector.for_roster(roster, embedder=embedder) if window
                        else SafetyDetector(roster.safety, embedder=embedder))
            reports = {split: conversation_report(detector, talks, running=running) for split, talks in sets.items()}
            out.setdefault(roster.id, {})[name] = {
                split: {"recall": r.recall, "on_time": r.on_time, "false_alarms": r.false_alarm_rate,
                        "ms_per_message": round(r.ms_per_message, 2)} for split, r in reports.items()}
            if window and running:  # how often a second opinion would be asked where no rule fired
                everyday = [[s.opening, *s.followups] for s in load_scenarios(roster.id)]
                negatives = [c.messages for c in sets["test"] if c.kind == "hard_negative"]
                out[roster.id]["second_opinion_asked"] = {
                    "scenarios": _ask_rate(detector, everyday),
                    "held_out_hard_negatives": _ask_rate(detector, negatives)}
                print(f"  {roster.id}: second opinion asked on {out[roster.id]['second_opinion_asked']}")
            print(f"  {roster.id}, {name}: " + " | ".join(
                f"{r.recall:.2f} / {r.on_time:.2f} / {r.false_alarm_rate:.1%}" for r in reports.values()))
    return out


def _plain_install_seconds() -> float:
    """The import and first guarded round of a plain install (no extras), in a new process."""
    import os
    import statistics
    import subprocess
    import tempfile

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from test_safety_memory import PLAIN

    times = []
    for _ in range(3):
        with tempfile.TemporaryDirectory() as cache:
            env = {**{k: v for k, v in os.environ.items() if k != "MASCOT_ENCODER"}, "MASCOT_CACHE": cache}
            start = time.perf_counter()
            subprocess.run([sys.executable, "-c", PLAIN], check=True, capture_output=True, env=env)
            times.append(time.perf_counter() - start)
    return statistics.median(times)


def _plot(record: dict, rosters: list, path: Path) -> bool:
    """Per roster, each encoder's dev settings (dots), its shipped setting on the held-out
    messages (star) and conversations (triangle); ``False`` without matplotlib."""
    try:
        import matplotlib
    except ImportError:
        print("matplotlib is not installed (pip install 'mascot[eval]'): no plot")
        return False
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"lexical": "tab:grey", "minilm": "tab:blue", "mpnet": "tab:green"}
    fig, axes = plt.subplots(1, len(rosters), figsize=(5.5 * len(rosters), 4.6), squeeze=False)
    for ax, roster in zip(axes[0], rosters, strict=True):
        for name, result in record["encoders"].items():
            colour = colours.get(name, "tab:purple")
            dev = [(row[roster.id]["false_alarms"], row[roster.id]["recall"]) for row in result["dev"]]
            ax.scatter(*zip(*dev, strict=True), s=10, color=colour, alpha=0.25)
            held = result["held_out"][roster.id]
            ax.scatter(held["false_alarms"], held["recall"], marker="*", s=170, color=colour,
                       label=f"{name}: messages, held out")
            ax.scatter(held["conversation_false_alarms"], held["conversation_recall"], marker="^", s=90,
                       color=colour, edgecolors="black", label=f"{name}: conversations, held out")
        ax.axhline(0.95, color="grey", lw=0.8, ls="--")
        ax.axvline(0.05, color="grey", lw=0.8, ls="--")
        ax.set(title=roster.id, xlabel="false alarms (hard negatives)", ylabel="recall", ylim=(-0.02, 1.02))
        ax.legend(loc="lower right", fontsize=7)
    fig.suptitle("Crisis detector by encoder: dots, settings on the dev messages; dashed, the message targets")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return True


if __name__ == "__main__":
    sys.exit(main())
