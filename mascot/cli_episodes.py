"""The commands that make episodes: ``mascot rollout`` and ``mascot import-logs``."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path

from langchain_core.tracers.langchain import wait_for_all_tracers
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from mascot.cli_options import (
    add_policy_flags,
    err,
    mask_secrets_in_logs,
    non_negative,
    out,
    policies_from_args,
    positive,
)
from mascot.graphs import BASELINES, create_baseline_graph, create_director_graph
from mascot.rosters import load_profiles, load_roster, load_scenarios, roster_path
from mascot.training.checkpoint_import import import_checkpoints
from mascot.training.episode import TurnPolicy
from mascot.training.jsonl import check_writable
from mascot.training.retry import model_retry_policy
from mascot.training.rollout import RolloutStatus, collect_episodes, failures_path
from mascot.training.trace import JsonlTracer

def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``rollout`` and ``import-logs`` to the ``mascot`` command line."""
    rollout = commands.add_parser(
        "rollout", help="run many episodes with a simulated user, resumable, into a JSONL file"
    )
    rollout.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    add_policy_flags(rollout)
    rollout.add_argument("--episodes", type=positive, required=True, metavar="N")
    rollout.add_argument("--concurrency", type=positive, default=8, metavar="C",
                         help="episodes at once (default 8)")
    rollout.add_argument("--scenarios", metavar="FILE",
                         help="scenario JSONL (default: the roster's scenarios)")
    rollout.add_argument("--profiles", metavar="FILE",
                         help="user profiles, JSONL or YAML (default: the roster's)")
    rollout.add_argument("--max-rounds", type=positive, default=3, metavar="R",
                         help="person turns per episode (default 3)")
    rollout.add_argument("--max-speakers", type=positive, default=3, metavar="N",
                         help="persona turns per round (default 3)")
    rollout.add_argument("--baseline", choices=BASELINES,
                         help="roll out a baseline ordering instead of the Director")
    rollout.add_argument("--seed", type=int, default=0, help="plan and sampling seed (default 0)")
    rollout.add_argument("--retries", type=non_negative, default=4, metavar="N",
                         help="retries of a model call on timeouts, connection errors, 429 "
                              "and 5xx, with exponential backoff (default 4)")
    rollout.add_argument("--out", required=True, metavar="FILE", help="episode JSONL (appended)")
    rollout.add_argument("--failures", metavar="FILE",
                         help="failed episodes (default: OUT's name + .failures.jsonl)")
    rollout.add_argument("--trace", metavar="FILE", help="write every model call to this JSONL")
    rollout.set_defaults(run=_rollout)

    imports = commands.add_parser(
        "import-logs", help="turn conversations from a LangGraph checkpointer into episodes"
    )
    imports.add_argument("--from", dest="source", required=True, metavar="URI",
                         help="sqlite:///relative.db, sqlite:////absolute.db or postgresql://...")
    imports.add_argument("--thread-id", action="append", metavar="ID",
                         help="import only this thread (repeatable)")
    imports.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    imports.add_argument("--out", required=True, metavar="FILE", help="episode JSONL (appended)")
    imports.set_defaults(run=_import_logs)


def _rollout(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    scenarios = load_scenarios(args.scenarios or roster_path(args.roster).parent)
    profiles = load_profiles(args.profiles) if args.profiles else list(roster.user_profiles)
    episodes_file = check_writable(args.out)
    failures = check_writable(args.failures or failures_path(episodes_file))
    policies = policies_from_args(args, roster)
    redact = mask_secrets_in_logs(policies)
    tracer = JsonlTracer(args.trace, redact=redact) if args.trace else None
    common = dict(
        user=policies.chat_model("user"),
        max_rounds=args.max_rounds,
        max_speakers_per_round=args.max_speakers,
        retry_policy=model_retry_policy(args.retries + 1),
    )
    if args.baseline:
        speakers = policies.chat_model("default") if args.baseline == "single" else policies.speakers()
        graph = create_baseline_graph(args.baseline, roster, speakers=speakers, seed=args.seed, **common)
    else:
        graph = create_director_graph(
            roster,
            director=policies.chat_model("director"),
            speakers=policies.speakers(),
            structured_output=policies.spec("director").kind == "openai",
            **common,
        )
    roles = ("director", "user", *roster.persona_ids)
    with _progress() as progress:
        task = progress.add_task("episodes", total=args.episodes, failed=0, rate=0.0)

        def show(status: RolloutStatus) -> None:
            progress.update(task, completed=status.done, failed=status.failed, rate=status.episodes_per_s)

        try:
            status = asyncio.run(
                collect_episodes(
                    graph,
                    scenarios,
                    profiles,
                    roster=roster.id,
                    out=episodes_file,
                    episodes=args.episodes,
                    concurrency=args.concurrency,
                    seed=args.seed,
                    failures=failures,
                    policies={role: TurnPolicy(**policies.record(role)) for role in roles},
                    callbacks=[tracer] if tracer else [],
                    redact=redact,
                    on_progress=show,
                )
            )
        finally:
            if tracer is not None:
                tracer.close()
            wait_for_all_tracers()  # LangSmith, when its environment variables turn it on
    line = (
        f"rollout: {status.done}/{status.planned} episodes in {status.out} "
        f"({status.completed} new, {status.skipped} already there), {status.failed} failed, "
        f"{status.episodes_per_s:.2f} episodes/s"
    )
    if tracer is not None:
        line += f"; trace: {tracer.path}"
    out.print(line, markup=False)
    if status.done < status.planned:
        err.print(f"{status.planned - status.done} episodes missing; reasons in {status.failures}; "
                  "run the same command again to retry them", markup=False)
        return 1
    return 0


def _progress() -> Progress:
    return Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("failed {task.fields[failed]}"),
        TextColumn("{task.fields[rate]:.2f} ep/s"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        console=err,
    )


def _import_logs(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    redact = mask_secrets_in_logs()
    report = import_checkpoints(
        args.source, roster=roster.id, out=Path(args.out), thread_ids=args.thread_id, redact=redact
    )
    for thread, reason in report.unreadable:
        err.print(f"mascot: warning: thread {thread!r} not imported: {reason}", markup=False)
    out.print(
        f"import-logs: {report.threads} threads, {report.imported} new episodes, "
        f"{report.already} already in {report.out}, {len(report.unreadable)} unreadable",
        markup=False,
    )
    return 1 if report.unreadable else 0
