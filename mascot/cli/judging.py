"""``mascot judge``: score episodes, candidate replies, sibling blocks or a roster's sanity set
with a rubric LLM judge."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mascot.cli.options import (
    CONCURRENCY_HELP,
    ROSTER_HELP,
    UsageError,
    add_judge_flags,
    add_policy_flags,
    err,
    judge_policies_from_args,
    mask_secrets_in_logs,
    non_negative,
    on_engine,
    out,
    policies_from_args,
    positive,
)
from mascot.rosters import Roster, load_roster

if TYPE_CHECKING:
    from mascot.policies import Policies


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``judge`` to the command line."""
    judge = commands.add_parser("judge", help="score episodes or candidates with a rubric LLM judge")
    judge.add_argument("--in", dest="source", metavar="FILE",
                       help="episode JSONL (rollout, import-logs) or candidate JSONL (candidates); "
                            "required unless --sanity")
    judge.add_argument("--rubric", required=True, metavar="persona|group|FILE",
                       help="a shipped rubric (persona: each turn; group: a block of turns) or a rubric YAML file")
    judge.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    judge.add_argument("--sanity", action="store_true",
                       help="judge the roster's sanity set instead of --in: fixed better/worse pairs, "
                            "reported as the judge's pairwise accuracy (--out: the report, JSON)")
    judge.add_argument("--mode", choices=("absolute", "ranking", "pairwise"), default="absolute",
                       help="absolute: the rubric's scores per target (default); ranking: a context's candidates "
                            "scored together, both orders; pairwise: each two candidates compared from the judge's "
                            "token probabilities, both orders (judging.relative)")
    judge.add_argument("--modes", metavar="A,B", help="with --sanity: measure each of these modes; the report is "
                                                      "the mode that passes the gate best (which then labels)")
    judge.add_argument("--mode-from", metavar="REPORT", help="judge --in with the mode a sanity report chose "
                                                             "(judge --sanity --modes ... --out REPORT)")
    judge.add_argument("--sanity-set", metavar="FILE",
                       help="with --sanity: a sanity set file in the shipped format (for a roster without one)")
    add_policy_flags(judge)
    add_judge_flags(judge, required=False)
    judge.add_argument("--block-turns", type=positive, default=4, metavar="N",
                       help="turns per block for a group rubric (default 4)")
    judge.add_argument("--attempts", type=positive, default=3, metavar="N",
                       help="tries per target when the judge's answer is malformed (default 3)")
    judge.add_argument("--retries", type=non_negative, default=4, metavar="N",
                       help="retries of a model call on timeouts, connection errors, 429 and 5xx, "
                            "with exponential backoff (default 4)")
    judge.add_argument("--concurrency", type=positive, default=8, metavar="C", help=CONCURRENCY_HELP)
    judge.add_argument("--seed", type=int, help="seed for sampling")
    judge.add_argument("--cache", metavar="FILE", help="judgement cache (default: OUT's name + .cache.jsonl; "
                                                        "none with --sanity)")
    judge.add_argument("--out", metavar="FILE",
                       help="judgements (episodes) or judged candidates (candidates), JSONL, appended; "
                            "with --sanity the report (JSON, optional)")
    judge.set_defaults(run=_judge)


def _judge(args: argparse.Namespace) -> int:
    from mascot.training.data.candidates import read_candidates
    from mascot.training.episodes.episode import read_episodes
    from mascot.training.jsonl import JsonlAppender, check_writable, exclusive, read_jsonl
    from mascot.training.judging.judge import Judge
    from mascot.training.judging.judgement import JudgementCache
    from mascot.training.judging.rubric import load_rubric
    from mascot.training.judging.targets import block_targets, reply_target, reply_targets

    if args.sanity:
        return _judge_sanity(args)
    if args.sanity_set:
        raise UsageError("--sanity-set needs --sanity")
    if not args.source or not args.out:
        raise UsageError("--in and --out are required (or --sanity to check the judge on its sanity set)")
    roster = load_roster(args.roster)
    rubric = load_rubric(args.rubric)
    source = Path(args.source)
    if not source.is_file():
        raise UsageError(f"--in: no such file {args.source}")
    first = next(read_jsonl(source), (0, {}))[1]
    on_candidates = "context_id" in first
    candidate_kind = "block" if "turns" in first else "reply"  # mascot blocks / mascot candidates
    if on_candidates and rubric.target != candidate_kind:
        raise UsageError(f"{args.source} holds candidate {candidate_kind}s; "
                         f"rubric '{rubric.id}' judges {rubric.target}s")
    out_file = check_writable(args.out)
    cache_file = check_writable(args.cache or out_file.with_name(f"{out_file.name.removesuffix('.jsonl')}.cache.jsonl"))
    if out_file.resolve() in (cache_file.resolve(), source.resolve()):
        raise UsageError("--out must differ from --in and --cache")
    policies = _judge_policies(args, roster)
    redact = mask_secrets_in_logs(policies)
    if on_candidates and candidate_kind == "block":
        from mascot.training.data.sibling_blocks import SiblingBlockError, read_block_candidates

        try:
            candidates = {(c.context_id, c.sample): c for c in read_block_candidates(source)}
        except SiblingBlockError as exc:
            raise UsageError(str(exc)) from None
        targets = [c.target(roster) for c in candidates.values()]
    elif on_candidates:
        candidates = {(c.context_id, c.sample): c for c in read_candidates(source)}
        targets = [reply_target(roster, episode_id=c.context_id, persona=c.persona, context=c.context,
                                reply=c.reply, direction=c.stage_direction, turn=c.turn, sample=c.sample)
                   for c in candidates.values()]
    else:
        episodes = read_episodes(source)
        try:
            targets = [t for e in episodes for t in (
                reply_targets(e, roster) if rubric.target == "reply"
                else block_targets(e, roster, block_turns=args.block_turns))]
        except ValueError as exc:
            raise UsageError(f"--in: {exc}") from None
    if not targets:
        raise UsageError(f"--in: nothing to judge in {args.source}")
    mode = _mode(args)
    if mode != "absolute" and not on_candidates:
        raise UsageError(f"--mode {mode} compares the candidates of a context: give --in a candidates or blocks file")
    model_name = _judge_model_name(policies)
    with exclusive(out_file), JudgementCache(cache_file) as cache, JsonlAppender(out_file, redact=redact) as sink:
        done = {_done_key(r, on_candidates) for _, r in read_jsonl(out_file) if _is_ok(r, on_candidates)}
        judge = Judge(rubric, policies.chat_model("judge"), model_name=model_name,
                      structured_output=True, max_attempts=args.attempts,
                      fault_tries=args.retries + 1, cache=cache)
        todo = [t for t in targets if _target_key(t, rubric.target) not in done]
        groups: dict[str, list[Any]] = {}
        if mode != "absolute":  # a context is judged again whole when any of its candidates is not done
            for target in targets:
                groups.setdefault(target.episode_id, []).append(target)
            alone = [g for g in groups.values() if len(g) < 2]
            groups = {k: g for k, g in groups.items() if len(g) >= 2
                      and any(_target_key(t, rubric.target) not in done for t in g)}
            todo = [t for g in groups.values() for t in g]
            if alone:
                err.print(f"judge: {len(alone)} contexts have one candidate and are left out (--mode {mode} "
                          f"compares two or more)", markup=False)
        tally = {"ok": 0, "failed": 0}
        progress = Progress(TextColumn("judging"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                            console=err)

        def write(judgement: Any) -> None:
            tally[judgement.status] += 1
            if on_candidates:
                c = candidates[(judgement.episode_id, judgement.sample)]
                sink.write({"context_id": c.context_id, "prompt": c.prompt, "persona": getattr(c, "persona", "group"),
                            "reply": c.reply, "overall": judgement.overall, "judgement": judgement.record()})
            else:
                sink.write(judgement.record())
            progress.update(task, advance=1)

        with progress:
            task = progress.add_task("judging", total=len(todo))
            if mode == "absolute":
                asyncio.run(judge.ajudge_many(todo, concurrency=args.concurrency, on_judgement=write))
            else:
                from mascot.training.judging.relative import RelativeJudge

                relative = RelativeJudge(judge, policies.chat_model("judge"), mode, structured_output=True)
                asyncio.run(relative.ajudge_groups(list(groups.values()), concurrency=args.concurrency,
                                                   on_judgement=write))
    out.print(f"judge: {tally['ok']} judged, {tally['failed']} failed (retried next run), "
              f"{len(targets) - len(todo)} already in {out_file}; rubric {rubric.id} v{rubric.version}, "
              f"{mode} mode, judge {model_name}", markup=False)
    return 1 if tally["failed"] else 0


def _mode(args: argparse.Namespace) -> str:
    """The judging mode of ``judge --in``: ``--mode``, or the one a sanity report chose."""
    from mascot.training.judging.judge_sanity import read_sanity_report
    from mascot.training.judging.sanity_set import SanityError

    if args.modes:
        raise UsageError("--modes needs --sanity (use --mode or --mode-from to label)")
    if not args.mode_from:
        return args.mode
    if args.mode != "absolute":
        raise UsageError("use either --mode or --mode-from, not both")
    try:
        return read_sanity_report(args.mode_from).mode
    except SanityError as exc:
        raise UsageError(f"--mode-from: {exc}") from None


def _judge_model_name(policies: Policies) -> str:
    record = policies.record("judge")
    return record["model"] + (f"+{record['adapter']}" if record["adapter"] else "")


def _judge_sanity(args: argparse.Namespace) -> int:
    """``judge --sanity``: the judge on the roster's sanity set, reported as pairwise accuracy."""
    from mascot.training.jsonl import check_writable
    from mascot.training.judging.judge import Judge
    from mascot.training.judging.judge_sanity import arun_relative_sanity, arun_sanity, choose_mode, metric_sanity
    from mascot.training.judging.judgement import JudgementCache
    from mascot.training.judging.relative import RelativeJudge
    from mascot.training.judging.rubric import load_rubric
    from mascot.training.judging.sanity_set import SanityError, load_sanity_set

    if args.source:
        raise UsageError("--sanity judges the roster's sanity set; leave out --in")
    roster = load_roster(args.roster)
    rubric = load_rubric(args.rubric)
    try:
        sanity_set = load_sanity_set(roster, rubric.target, path=args.sanity_set)
    except SanityError as exc:
        raise UsageError(f"--sanity: {exc}") from None
    report_file = check_writable(args.out) if args.out else None
    cache_file = check_writable(args.cache) if args.cache else None
    policies = _judge_policies(args, roster)
    redact = mask_secrets_in_logs(policies)
    model_name = _judge_model_name(policies)
    progress = Progress(TextColumn("judging the sanity set"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err)
    if args.mode_from:
        raise UsageError("--mode-from labels --in; with --sanity use --mode or --modes")
    modes = [m for m in (args.modes or args.mode).split(",") if m]
    unknown = sorted(set(modes) - {"absolute", "ranking", "pairwise"})
    if unknown or not modes or len(set(modes)) != len(modes):
        raise UsageError(f"--modes {args.modes}: give distinct modes of absolute, ranking, pairwise")
    reports = []
    with JudgementCache(cache_file) if cache_file else contextlib.nullcontext() as cache, progress:
        judge = Judge(rubric, policies.chat_model("judge"), model_name=model_name, structured_output=True,
                      max_attempts=args.attempts, fault_tries=args.retries + 1, cache=cache)

        async def measure() -> None:  # one event loop for every mode: a server's client lives in it
            for mode in modes:
                if mode == "absolute":
                    task = progress.add_task("judging", total=len(sanity_set.targets()))
                    reports.append(await arun_sanity(judge, sanity_set, concurrency=args.concurrency,
                                                     on_judgement=lambda judgement, task=task: progress.update(
                                                         task, advance=1)))
                else:
                    task = progress.add_task(mode, total=2 * len(sanity_set.pairs))
                    relative = RelativeJudge(judge, policies.chat_model("judge"), mode, structured_output=True)
                    reports.append(await arun_relative_sanity(relative, sanity_set, concurrency=args.concurrency,
                                                              on_judgement=lambda judgement, task=task: progress.update(
                                                                  task, advance=1)))

        asyncio.run(measure())
    report = choose_mode(reports) if len(reports) > 1 else reports[0]
    report = report.model_copy(update={"metric_judge": metric_sanity(sanity_set, roster)})
    if report_file:
        report_file.write_text(redact(json.dumps(report.model_dump(mode="json"), indent=2)) + "\n", encoding="utf-8")
    metric = report.metric_judge
    verdict = report.verdict() + ("" if report.passed else " (`mascot pairs --sanity REPORT`)")
    out.print(f"judge sanity: {rubric.id} rubric, {report.summary()}; judge {model_name}, "
              f"{report.judgements} judgements ({report.failed_judgements} failed) in {report.seconds:.1f} s "
              f"({report.seconds / report.judgements:.1f} s each); "
              f"{verdict}", markup=False)
    out.print(f"metric judge ({metric.judge}): {metric.summary()}"
              + (f"; report {report_file}" if report_file else ""), markup=False)
    return 0


def _is_ok(record: dict[str, Any], on_candidates: bool) -> bool:
    judgement = record.get("judgement", {}) if on_candidates else record
    return isinstance(judgement, dict) and judgement.get("status") == "ok"


def _done_key(record: dict[str, Any], on_candidates: bool) -> tuple[Any, ...]:
    judgement = record["judgement"] if on_candidates else record
    return (judgement.get("episode_id"), judgement.get("turn"), judgement.get("sample"), judgement.get("block_start"))


def _target_key(target: Any, kind: str) -> tuple[Any, ...]:
    if kind == "reply":
        return (target.episode_id, target.turn, target.sample, None)
    return (target.episode_id, None, target.sample, target.start)


def _judge_policies(args: argparse.Namespace, roster: Roster) -> Policies:
    """The judge's policies: the judge flags, else the model flags (their ``judge`` role)."""
    judge = judge_policies_from_args(args, roster)
    if judge is None:
        return on_engine(args, policies_from_args(args, roster))
    if args.model or args.policies or args.base_url:
        raise UsageError("use either the judge flags (--judge-model, --judge-policies) or --model/--policies/"
                         "--base-url, not both")
    return on_engine(args, judge)
