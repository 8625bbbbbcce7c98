"""The commands that make episodes: ``mascot rollout`` and ``mascot import-logs``."""

from __future__ import annotations

import argparse
import asyncio
from pathlib import Path
from typing import TYPE_CHECKING

from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from mascot.cli.options import (
    BASELINES,
    ROSTER_HELP,
    UsageError,
    add_policy_flags,
    add_safety_flags,
    err,
    mask_secrets_in_logs,
    masked,
    non_negative,
    on_engine,
    out,
    policies_from_args,
    positive,
    roster_scenarios,
    safety_from_args,
)
from mascot.rosters import load_profiles, load_roster, load_scenarios

if TYPE_CHECKING:
    from mascot.training.episodes.rollout import RolloutStatus


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``rollout`` and ``import-logs`` to the ``mascot`` command line."""
    rollout = commands.add_parser(
        "rollout", help="run many episodes with a simulated user, resumable, into a JSONL file"
    )
    rollout.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    add_policy_flags(rollout)
    rollout.add_argument("--episodes", type=positive, required=True, metavar="N",
                         help="episodes the file holds when done (a rerun plays only the missing ones)")
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
    rollout.add_argument("--workers", type=positive, default=1, metavar="W",
                         help="processes sharing the episodes and --concurrency, for fast servers "
                              "(OpenAI-compatible roles only; default 1)")
    rollout.add_argument("--shard", type=_shard, help=argparse.SUPPRESS)  # set by --workers
    add_safety_flags(rollout)
    rollout.set_defaults(run=_rollout)

    imports = commands.add_parser(
        "import-logs", help="turn conversations from a LangGraph checkpointer into episodes"
    )
    imports.add_argument("--from", dest="source", required=True, metavar="URI",
                         help="sqlite:///relative.db, sqlite:////absolute.db or postgresql://...")
    imports.add_argument("--thread-id", action="append", metavar="ID",
                         help="import only this thread (repeatable)")
    imports.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    imports.add_argument("--out", required=True, metavar="FILE", help="episode JSONL (appended)")
    imports.set_defaults(run=_import_logs)


def _rollout(args: argparse.Namespace) -> int:
    from langchain_core.tracers.langchain import wait_for_all_tracers

    from mascot.cli.rollout_workers import EPISODES_MISSING, end_with_parent, run_workers
    from mascot.graphs import create_baseline_graph, create_director_graph
    from mascot.training.episodes.episode import TurnPolicy, read_episodes
    from mascot.training.episodes.rollout import RolloutStatus, collect_episodes, failures_path, plan_episodes
    from mascot.training.episodes.trace import JsonlTracer
    from mascot.training.jsonl import check_writable, exclusive
    from mascot.training.retry import model_retry_policy

    roster = load_roster(args.roster)
    scenarios = load_scenarios(args.scenarios) if args.scenarios else roster_scenarios(args.roster, "rollout")
    profiles = load_profiles(args.profiles) if args.profiles else list(roster.user_profiles)
    episodes_file = check_writable(args.out)
    failures = check_writable(args.failures or failures_path(episodes_file))
    trace = check_writable(args.trace) if args.trace else None
    files = [path.resolve() for path in (episodes_file, failures, trace) if path is not None]
    if len(set(files)) < len(files):
        raise UsageError("--out, --failures and --trace must be different files")
    policies = policies_from_args(args, roster)
    if args.engine == "vllm" and args.workers > 1:
        raise UsageError("--engine vllm runs one server for this command; use --concurrency, or start "
                         "`mascot serve --engine vllm` and give its URL to the workers with --base-url")
    policies = on_engine(args, policies)
    redact = mask_secrets_in_logs(policies)
    roles = ("director", "user", *roster.persona_ids)
    if args.workers > 1:
        if any(policies.spec(role).kind != "openai" for role in roles):
            raise UsageError("--workers needs every role on a server (--base-url or kind 'openai'); "
                             "the local backend runs in one process")
        plan = plan_episodes(roster.id, scenarios, profiles, episodes=args.episodes, seed=args.seed)
        done = {e.id for e in read_episodes(episodes_file)} & {p.id for p in plan}
        status = RolloutStatus(planned=len(plan), skipped=len(done), out=episodes_file, failures=failures)
        with exclusive(episodes_file), _progress() as progress:
            task = progress.add_task("episodes", total=args.episodes, failed=0, rate=0.0)
            broken = run_workers(args.argv, workers=args.workers, concurrency=args.concurrency, plan=plan,
                                 status=status, trace=trace, on_progress=lambda s: _show(progress, task, s))
        for worker in broken:
            err.print(f"mascot: error: worker {worker.shard} stopped ({worker.returncode}): "
                      f"{masked(worker.message)}", markup=False)
        status.completed = len({e.id for e in read_episodes(episodes_file)} & {p.id for p in plan}) - len(done)
        return 2 if broken else _report(status, args.trace)
    tracer = JsonlTracer(args.trace, redact=redact, repair=args.shard is None) if args.trace else None
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
            structured_output=True,
            safety=safety_from_args(args, roster),
            **common,
        )
    run = dict(
        graph=graph,
        scenarios=scenarios,
        profiles=profiles,
        roster=roster.id,
        out=episodes_file,
        episodes=args.episodes,
        concurrency=args.concurrency,
        seed=args.seed,
        failures=failures,
        policies={role: TurnPolicy(**policies.record(role)) for role in roles},
        callbacks=[tracer] if tracer else [],
        redact=redact,
        shard=args.shard,
    )
    try:
        if args.shard is not None:  # one of several workers: the parent shows progress
            end_with_parent()
            return EPISODES_MISSING if asyncio.run(collect_episodes(**run)).failed else 0
        with _progress() as progress:
            task = progress.add_task("episodes", total=args.episodes, failed=0, rate=0.0)
            status = asyncio.run(collect_episodes(**run, on_progress=lambda s: _show(progress, task, s)))
    finally:
        if tracer is not None:
            tracer.close()
        wait_for_all_tracers()  # LangSmith, when its environment variables turn it on
    return _report(status, args.trace)


def _report(status: RolloutStatus, trace: str | None) -> int:
    line = (
        f"rollout: {status.done}/{status.planned} episodes in {status.out} "
        f"({status.completed} new, {status.skipped} already there), {status.failed} failed, "
        f"{status.episodes_per_s:.2f} episodes/s"
    )
    if trace:
        line += f"; trace: {trace}"
    out.print(line, markup=False)
    if status.done < status.planned:
        err.print(f"{status.planned - status.done} episodes missing; reasons in {status.failures}; "
                  "run the same command again to retry them", markup=False)
        return 1
    return 0


def _show(progress: Progress, task: TaskID, status: RolloutStatus) -> None:
    progress.update(task, completed=status.done, failed=status.failed, rate=status.episodes_per_s)


def _shard(text: str) -> tuple[int, int]:
    try:
        k, n = (int(part) for part in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected K/N, got '{text}'") from None
    if not 0 <= k < n:
        raise argparse.ArgumentTypeError(f"expected 0 <= K < N, got '{text}'")
    return k, n


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
    from mascot.training.episodes.checkpoint_import import import_checkpoints

    roster = load_roster(args.roster)
    redact = mask_secrets_in_logs()
    report = import_checkpoints(
        args.source, roster=roster.id, out=Path(args.out), thread_ids=args.thread_id, redact=redact
    )
    for thread, reason in report.unreadable:
        err.print(f"mascot: warning: thread {thread!r} not imported: {reason}", markup=False)
    out.print(
        f"import-logs: {_count(report.imported, 'new episode')} from {_count(report.threads, 'thread')}, "
        f"{report.already} already in {report.out}, {len(report.unreadable)} unreadable",
        markup=False,
    )
    return 1 if report.unreadable else 0


def _count(number: int, noun: str) -> str:
    return f"{number} {noun}{'' if number == 1 else 's'}"
