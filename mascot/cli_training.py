"""The commands that turn episodes into training data: ``mascot candidates``."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mascot.cli_options import (
    UsageError,
    add_policy_flags,
    err,
    mask_secrets_in_logs,
    out,
    policies_from_args,
    positive,
)
from mascot.rosters import load_roster
from mascot.training.candidates import CandidateReport, candidate_contexts, sample_candidates
from mascot.training.episode import TurnPolicy, read_episodes


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``candidates`` to the ``mascot`` command line."""
    candidates = commands.add_parser(
        "candidates", help="sample K replies per persona turn of episodes, for preference pairs"
    )
    candidates.add_argument("--in", dest="source", required=True, metavar="EPISODES",
                            help="episode JSONL (from rollout or import-logs)")
    candidates.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    add_policy_flags(candidates)
    candidates.add_argument("--k", type=positive, default=4, help="replies per context (default 4)")
    candidates.add_argument("--max-contexts", type=positive, metavar="N",
                            help="use only the first N persona turns")
    candidates.add_argument("--concurrency", type=positive, default=8, metavar="C")
    candidates.add_argument("--seed", type=int, help="seed for sampling")
    candidates.add_argument("--out", required=True, metavar="FILE", help="candidate JSONL (appended)")
    candidates.set_defaults(run=_candidates)


def _candidates(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    if not Path(args.source).is_file():
        raise UsageError(f"--in: no such file {args.source}")
    episodes = read_episodes(args.source)
    if not episodes:
        raise UsageError(f"--in: no episodes in {args.source}")
    try:
        contexts = candidate_contexts(episodes, roster)
    except ValueError as exc:
        raise UsageError(f"--in: {exc}") from None
    contexts = contexts[: args.max_contexts] if args.max_contexts else contexts
    if not contexts:
        raise UsageError(f"--in: the episodes in {args.source} have no persona turns with a stage direction")
    policies = policies_from_args(args, roster)
    mask_secrets_in_logs(policies)
    progress = Progress(TextColumn("candidates"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                        console=err)
    with progress:
        task = progress.add_task("candidates", total=len(contexts) * args.k)

        def show(report: CandidateReport) -> None:
            progress.update(task, completed=report.skipped + report.written + report.empty)

        report = asyncio.run(sample_candidates(
            contexts, roster, policies.speakers(), k=args.k, out=args.out, concurrency=args.concurrency,
            policies={pid: TurnPolicy(**policies.record(pid)) for pid in roster.persona_ids},
            on_progress=show,
        ))
    out.print(f"candidates: {report.written} new in {report.out} ({report.skipped} already there, "
              f"{report.empty} empty replies dropped) for {report.contexts} contexts x {args.k}",
              markup=False)
    return 0

