"""``mascot rosters``: list, show, check and start persona rosters; print their schema."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import yaml

from mascot.cli.options import ROSTER_HELP, UsageError, err, out
from mascot.rosters import Roster, list_rosters, load_roster, load_scenarios, roster_path, scenario_path
from mascot.rosters.reference import schema_reference, with_reference
from mascot.rosters.scaffold import scaffold_roster

#: The encoders ``rosters safety-heads`` fits for by default (those installed or built).
HEAD_ENCODERS = "lexical,minilm,mpnet"


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``rosters``, ``rosters show``, ``rosters check``, ``rosters new``, ``rosters safety-heads``
    and ``rosters schema``."""
    rosters = commands.add_parser("rosters", help="list, show, check or start persona rosters")
    rosters.set_defaults(run=_rosters_list)
    roster_commands = rosters.add_subparsers(metavar="ACTION")
    show = roster_commands.add_parser("show", help="print one roster")
    show.add_argument("roster", metavar="ID_OR_PATH", help=ROSTER_HELP)
    show.set_defaults(run=_rosters_show)
    check = roster_commands.add_parser(
        "check", help="validate a roster folder or file and the scenarios.jsonl beside it (exit 0 or 2)")
    check.add_argument("path", metavar="PATH", help="a roster folder, its roster.yaml, or a shipped id")
    check.add_argument("--safety", action="store_true",
                       help="also run the crisis detector over the labelled set beside the roster (safety.yaml): "
                            "precision, recall, false alarms and time per message")
    check.add_argument("--safety-set", metavar="FILE", help="with --safety: another labelled set (same format)")
    check.set_defaults(run=_rosters_check)
    new = roster_commands.add_parser(
        "new", help="write a new roster folder to edit: a commented roster.yaml and scenarios.jsonl")
    new.add_argument("roster_id", metavar="ID", help="the new roster's id, e.g. study_group")
    new.add_argument("--out", required=True, metavar="DIR", help="folder to create (new or empty)")
    new.set_defaults(run=_rosters_new)
    heads = roster_commands.add_parser(
        "safety-heads", help="fit the shipped rosters' safety classifiers and write them into the package, with "
                             "their figures on the held-out sets (apps load them instead of fitting)")
    heads.add_argument("--encoder", default=HEAD_ENCODERS, metavar="NAMES",
                       help="comma-separated encoders to fit for (default: each of lexical, minilm, mpnet that is "
                            "installed or built)")
    heads.add_argument("--check", action="store_true",
                       help="refit and compare with the shipped files instead of writing them (exit 2 on a "
                            "difference)")
    heads.set_defaults(run=_rosters_safety_heads)
    schema = roster_commands.add_parser("schema", help="print the roster schema reference (Markdown)")
    schema.add_argument("--write", metavar="FILE",
                        help="replace the reference between the roster-schema markers in FILE (docs/rosters.md)")
    schema.set_defaults(run=_rosters_schema)


def _rosters_list(args: argparse.Namespace) -> int:
    for roster_id in list_rosters():
        roster = load_roster(roster_id)
        names = ", ".join(p.name for p in roster.personas)
        out.print(f"{roster.id:20} {roster.domain:24} {names}", markup=False)
    return 0


def _rosters_show(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    out.print(yaml.safe_dump(roster.model_dump(), sort_keys=False, allow_unicode=True), markup=False)
    return 0


def _rosters_check(args: argparse.Namespace) -> int:
    path = roster_path(args.path)
    roster = load_roster(path)
    summary = f"{path}: OK, roster '{roster.id}' with {len(roster.personas)} personas, " \
              f"{len(roster.user_profiles)} user profiles"
    scenarios = scenario_path(path)
    if scenarios.is_file():
        out.print(f"{summary}, {len(load_scenarios(scenarios))} scenarios", markup=False)
    else:
        out.print(summary, markup=False)
        err.print(f"mascot: warning: no scenario file at {scenarios}: chat works without it; rollout needs it "
                  "there or --scenarios FILE.jsonl", markup=False)
    if args.safety:
        _check_safety(roster, Path(args.safety_set) if args.safety_set else path.parent / "safety.yaml")
    elif args.safety_set:
        raise UsageError("--safety-set needs --safety")
    return 0


def _check_safety(roster: Roster, labelled: Path) -> None:
    """Print the detector's figures on a labelled set, and what it missed or raised falsely."""
    from mascot.graphs.safety_detector import SafetyDetector
    from mascot.graphs.safety_window import TRAIN_FILE
    from mascot.training.evaluation.safety import (
        CONVERSATION_FILES,
        SafetySetError,
        conversation_report,
        detector_report,
        load_conversation_set,
        load_safety_set,
    )

    if not roster.safety:
        raise UsageError(f"roster '{roster.id}' has no safety rules to check")
    try:
        messages = load_safety_set(roster, labelled)
    except SafetySetError as exc:
        raise UsageError(str(exc)) from None
    training = labelled.with_name(TRAIN_FILE)
    detector = SafetyDetector.for_roster(roster, training if training.is_file() else None)
    report = detector_report(detector, messages)
    window = f", window classifier from {training.name}" if detector.window is not None else ""
    out.print(f"{labelled}: safety detector ({detector.embedder.name} classifier, threshold {detector.threshold}"
              f"{window}): {report.line()}", markup=False)
    for text in report.missed:
        out.print(f"  missed: {text}", markup=False)
    for text in report.false_alarms:
        out.print(f"  false alarm: {text}", markup=False)
    talks_file = labelled.with_name(CONVERSATION_FILES["test"])
    if not talks_file.is_file():
        out.print(f"{talks_file}: none beside the labelled set; no per-conversation figures", markup=False)
        return
    try:
        talks = conversation_report(detector, load_conversation_set(roster, talks_file))
    except SafetySetError as exc:
        raise UsageError(str(exc)) from None
    out.print(f"{talks_file}: {talks.line()}", markup=False)
    for name in talks.missed:
        out.print(f"  missed: conversation {name}", markup=False)
    for name in talks.false_alarms:
        out.print(f"  false alarm: conversation {name}", markup=False)


def _rosters_safety_heads(args: argparse.Namespace) -> int:
    from mascot.graphs.embeddings import embedder_by_name
    from mascot.graphs.safety_detector import SafetyDetector
    from mascot.graphs.safety_heads import load_head
    from mascot.training.evaluation.safety import ship_heads

    names = [n.strip() for n in args.encoder.split(",") if n.strip()]
    encoders = []
    for name in names:
        try:
            encoders.append(embedder_by_name(name))
        except ValueError as exc:
            if args.encoder != HEAD_ENCODERS:
                raise UsageError(f"--encoder: {exc}") from None
            err.print(f"mascot: {name} skipped: {exc}", markup=False)
    different = 0
    for roster in (r for r in map(load_roster, list_rosters()) if r.safety):
        for embedder in encoders:
            if args.check:
                detector = SafetyDetector.for_roster(roster, embedder=embedder)
                heads = [detector, *([detector.window] if detector.window is not None else [])]
                same = all(_shipped_is_fit(load_head(h.key()), h.fit()) for h in heads)
                different += not same
                verdict = ("the shipped classifier is the fit" if same else
                           "no shipped classifier is this fit: run mascot rosters safety-heads")
                out.print(f"{roster.id} {embedder.name}: {verdict}", markup=False)
            else:
                entry = ship_heads(roster, embedder)
                out.print(f"{roster.id} {embedder.name}: wrote {entry['file']} (held out: {entry['measured']})",
                          markup=False)
    return 2 if different else 0


def _rosters_new(args: argparse.Namespace) -> int:
    roster_file, scenario_file = scaffold_roster(args.roster_id, args.out)
    out.print(f"wrote {roster_file} and {scenario_file}; edit them, then run: "
              f"mascot rosters check {roster_file.parent}", markup=False)
    return 0


def _rosters_schema(args: argparse.Namespace) -> int:
    if args.write is None:
        out.print(schema_reference(), markup=False, end="")
        return 0
    target = Path(args.write)
    try:
        document = target.read_text(encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--write: cannot read {target} ({exc.strerror or exc})") from None
    try:
        updated = with_reference(document)
    except ValueError as exc:
        raise UsageError(f"--write {target}: {exc}") from None
    target.write_text(updated, encoding="utf-8")
    out.print(f"{target}: roster schema reference {'unchanged' if updated == document else 'updated'}",
              markup=False)
    return 0


def _shipped_is_fit(shipped: Any, fitted: Any) -> bool:
    """Whether a shipped head (``StoredHead`` or ``None``) is the head fitted now."""
    import numpy as np

    return shipped is not None and shipped.source == "shipped" and all(
        np.allclose(a, b, atol=1e-3) for a, b in ((shipped.weights, fitted.weights), (shipped.bias, fitted.bias),
                                                  (shipped.triggers, fitted.triggers)))
