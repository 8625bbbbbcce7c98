"""``mascot rosters``: list, show and check persona rosters."""

from __future__ import annotations

import argparse

import yaml

from mascot.cli.options import out
from mascot.rosters import list_rosters, load_roster, load_scenarios, roster_path


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``rosters``, ``rosters show`` and ``rosters check``."""
    rosters = commands.add_parser("rosters", help="list, show or check persona rosters")
    rosters.set_defaults(run=_rosters_list)
    roster_commands = rosters.add_subparsers(metavar="ACTION")
    show = roster_commands.add_parser("show", help="print one roster")
    show.add_argument("roster", metavar="ID_OR_PATH")
    show.set_defaults(run=_rosters_show)
    check = roster_commands.add_parser("check", help="validate a roster file (exit 0 or 2)")
    check.add_argument("path", metavar="PATH")
    check.set_defaults(run=_rosters_check)


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
    scenarios = path.parent / "scenarios.jsonl"
    if scenarios.is_file():
        summary += f", {len(load_scenarios(scenarios))} scenarios"
    out.print(summary, markup=False)
    return 0
