"""The commands that turn episodes into training data and reward models: ``mascot judge``,
``candidates``, ``pairs`` and ``train-rm``."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mascot.cli.options import (
    UsageError,
    add_policy_flags,
    add_recipe_flags,
    err,
    mask_secrets_in_logs,
    non_negative,
    out,
    policies_from_args,
    positive,
    recipe_from_args,
)
from mascot.policies import Policies
from mascot.rosters import load_roster
from mascot.training.data.candidates import (
    CandidateReport,
    candidate_contexts,
    read_candidates,
    sample_candidates,
)
from mascot.training.episodes.episode import TurnPolicy, read_episodes
from mascot.training.jsonl import JsonlAppender, check_writable, exclusive, read_jsonl


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``judge``, ``candidates``, ``pairs`` and ``train-rm`` to the command line."""
    judge = commands.add_parser("judge", help="score episodes or candidates with a rubric LLM judge")
    judge.add_argument("--in", dest="source", metavar="FILE",
                       help="episode JSONL (rollout, import-logs) or candidate JSONL (candidates); "
                            "required unless --sanity")
    judge.add_argument("--rubric", required=True, metavar="persona|group|FILE")
    judge.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    judge.add_argument("--sanity", action="store_true",
                       help="judge the roster's sanity set instead of --in: fixed better/worse pairs, "
                            "reported as the judge's pairwise accuracy (--out: the report, JSON)")
    judge.add_argument("--sanity-set", metavar="FILE",
                       help="with --sanity: a sanity set file in the shipped format (for a roster without one)")
    add_policy_flags(judge)
    judge.add_argument("--judge-model", dest="model", metavar="HF_ID_OR_PATH", help="same as --model")
    judge.add_argument("--block-turns", type=positive, default=4, metavar="N",
                       help="turns per block for a group rubric (default 4)")
    judge.add_argument("--attempts", type=positive, default=3, metavar="N",
                       help="tries per target when the judge's answer is malformed (default 3)")
    judge.add_argument("--retries", type=non_negative, default=4, metavar="N",
                       help="retries of a model call on timeouts, connection errors, 429 and 5xx, "
                            "with exponential backoff (default 4)")
    judge.add_argument("--concurrency", type=positive, default=8, metavar="C")
    judge.add_argument("--seed", type=int, help="seed for sampling")
    judge.add_argument("--cache", metavar="FILE", help="judgement cache (default: OUT's name + .cache.jsonl; "
                                                        "none with --sanity)")
    judge.add_argument("--out", metavar="FILE",
                       help="judgements (episodes) or judged candidates (candidates), JSONL, appended; "
                            "with --sanity the report (JSON, optional)")
    judge.set_defaults(run=_judge)

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

    blocks = commands.add_parser(
        "blocks", help="play G sibling blocks at each Director decision point, for the group reward model")
    blocks.add_argument("--in", dest="source", required=True, metavar="EPISODES",
                        help="episode JSONL (from rollout or import-logs)")
    blocks.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    add_policy_flags(blocks)
    blocks.add_argument("--g", type=positive, default=4, metavar="G", help="blocks per decision point (default 4)")
    blocks.add_argument("--block-turns", type=positive, default=3, metavar="N",
                        help="turns played after each decision (default 3)")
    blocks.add_argument("--max-points", type=positive, metavar="N", help="use only the first N decision points")
    blocks.add_argument("--max-speakers-per-round", type=positive, default=3, metavar="N")
    blocks.add_argument("--concurrency", type=positive, default=8, metavar="C")
    blocks.add_argument("--seed", type=int, help="seed for sampling")
    blocks.add_argument("--out", required=True, metavar="FILE", help="sibling block JSONL (appended)")
    blocks.set_defaults(run=_blocks)

    pairs = commands.add_parser("pairs", help="preference pairs from judged candidates")
    pairs.add_argument("--in", dest="source", required=True, metavar="JUDGED",
                       help="judged candidates: replies (mascot candidates) or sibling blocks (mascot blocks)")
    pairs.add_argument("--min-margin", type=float, default=0.5, metavar="M",
                       help="least difference of the overall scores, in 1-5 judge units (default 0.5)")
    pairs.add_argument("--metric-weight", type=_unit_interval, metavar="W",
                       help="label = (1-W) x judge + W x metric judge overall (default 0: judge only)")
    pairs.add_argument("--sanity", metavar="REPORT.json",
                       help="the judge's sanity report (mascot judge --sanity --out): without --metric-weight, "
                            "W = 0.5 when its accuracy is under 70%%, else 0")
    pairs.add_argument("--roster", metavar="ID_OR_PATH", help="the candidates' roster (needed when W > 0)")
    pairs.add_argument("--test-fraction", type=float, default=0.1, metavar="F")
    pairs.add_argument("--seed", type=int, default=0)
    pairs.add_argument("--out", required=True, metavar="DIR", help="folder for train.jsonl and test.jsonl")
    pairs.set_defaults(run=_pairs)

    train_rm = commands.add_parser("train-rm", help="train a LoRA reward model on preference pairs")
    train_rm.add_argument("--pairs", required=True, metavar="DIR", help="folder from mascot pairs")
    add_recipe_flags(train_rm, "RewardModelConfig", "RewardConfig")
    train_rm.add_argument("--out", required=True, metavar="DIR")
    train_rm.set_defaults(run=_train_rm)


def _input_episodes(source: str) -> list[Any]:
    """The episodes of ``--in``, or a one-line usage error (missing file, no episodes)."""
    if not Path(source).is_file():
        raise UsageError(f"--in: no such file {source}")
    episodes = read_episodes(source)
    if not episodes:
        raise UsageError(f"--in: no episodes in {source}")
    return episodes


def _candidates(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    episodes = _input_episodes(args.source)
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


def _blocks(args: argparse.Namespace) -> int:
    from mascot.training.data.block_rollout import BlockRollout, decision_points
    from mascot.training.data.sibling_blocks import SiblingBlockError, sample_sibling_blocks

    roster = load_roster(args.roster)
    episodes = _input_episodes(args.source)
    if args.g < 2:
        raise UsageError(f"--g must be at least 2 (blocks of one decision point compete), got {args.g}")
    try:
        points = decision_points(episodes, roster, max_speakers_per_round=args.max_speakers_per_round)
    except ValueError as exc:
        raise UsageError(f"--in: {exc}") from None
    points = points[: args.max_points] if args.max_points else points
    if not points:
        raise UsageError(f"--in: no Director decision points in {args.source}")
    policies = policies_from_args(args, roster)
    mask_secrets_in_logs(policies)
    rollout = BlockRollout(roster, speakers=policies.speakers(), director=policies.chat_model("director"),
                           user=policies.chat_model("user"), block_turns=args.block_turns,
                           max_speakers_per_round=args.max_speakers_per_round, concurrency=args.concurrency)
    progress = Progress(TextColumn("blocks"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err)
    try:
        with progress:
            task = progress.add_task("blocks", total=len(points) * args.g)
            report = sample_sibling_blocks(
                points, rollout, g=args.g, out=args.out, batch=args.concurrency,
                on_progress=lambda r: progress.update(task, completed=r.skipped + r.written + r.empty))
    except SiblingBlockError as exc:
        raise UsageError(str(exc)) from None
    finally:
        rollout.close()
    out.print(f"blocks: {report.written} new in {args.out} ({report.skipped} already there, {report.empty} empty) "
              f"for {report.points} decision points x {args.g}, {args.block_turns} turns each", markup=False)
    return 0


def _judge(args: argparse.Namespace) -> int:
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
        raise UsageError(f"{args.source} holds candidate {candidate_kind}s; rubric '{rubric.id}' judges {rubric.target}s")
    out_file = check_writable(args.out)
    cache_file = check_writable(args.cache or out_file.with_name(f"{out_file.name.removesuffix('.jsonl')}.cache.jsonl"))
    if out_file.resolve() in (cache_file.resolve(), source.resolve()):
        raise UsageError("--out must differ from --in and --cache")
    policies = policies_from_args(args, roster)
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
                reply_targets(e, roster) if rubric.target == "reply" else block_targets(e, roster, block_turns=args.block_turns))]
        except ValueError as exc:
            raise UsageError(f"--in: {exc}") from None
    if not targets:
        raise UsageError(f"--in: nothing to judge in {args.source}")
    model_name = _judge_model_name(policies)
    with exclusive(out_file), JudgementCache(cache_file) as cache, JsonlAppender(out_file, redact=redact) as sink:
        done = {_done_key(r, on_candidates) for _, r in read_jsonl(out_file) if _is_ok(r, on_candidates)}
        judge = Judge(rubric, policies.chat_model("judge"), model_name=model_name,
                      structured_output=True, max_attempts=args.attempts,
                      fault_tries=args.retries + 1, cache=cache)
        todo = [t for t in targets if _target_key(t, rubric.target) not in done]
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
            asyncio.run(judge.ajudge_many(todo, concurrency=args.concurrency, on_judgement=write))
    out.print(f"judge: {tally['ok']} judged, {tally['failed']} failed (retried next run), "
              f"{len(targets) - len(todo)} already in {out_file}; rubric {rubric.id} v{rubric.version}, "
              f"judge {model_name}", markup=False)
    return 1 if tally["failed"] else 0


def _judge_model_name(policies: Policies) -> str:
    record = policies.record("judge")
    return record["model"] + (f"+{record['adapter']}" if record["adapter"] else "")


def _judge_sanity(args: argparse.Namespace) -> int:
    """``judge --sanity``: the judge on the roster's sanity set, reported as pairwise accuracy."""
    from mascot.training.judging.judge import Judge
    from mascot.training.judging.judge_sanity import SanityError, load_sanity_set, metric_sanity, run_sanity
    from mascot.training.judging.judgement import JudgementCache
    from mascot.training.judging.rubric import load_rubric

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
    policies = policies_from_args(args, roster)
    redact = mask_secrets_in_logs(policies)
    model_name = _judge_model_name(policies)
    progress = Progress(TextColumn("judging the sanity set"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=err)
    with JudgementCache(cache_file) if cache_file else contextlib.nullcontext() as cache, progress:
        judge = Judge(rubric, policies.chat_model("judge"), model_name=model_name, structured_output=True,
                      max_attempts=args.attempts, fault_tries=args.retries + 1, cache=cache)
        task = progress.add_task("judging", total=len(sanity_set.targets()))
        report = run_sanity(judge, sanity_set, concurrency=args.concurrency,
                            on_judgement=lambda judgement: progress.update(task, advance=1))
    report = report.model_copy(update={"metric_judge": metric_sanity(sanity_set, roster)})
    if report_file:
        report_file.write_text(redact(json.dumps(report.model_dump(mode="json"), indent=2)) + "\n", encoding="utf-8")
    metric = report.metric_judge
    verdict = "passed" if report.passed else f"under {report.threshold:.0%}: label with `mascot pairs --sanity REPORT`"
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


def _unit_interval(text: str) -> float:
    """An argparse type: a number in [0, 1]."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: '{text}'") from None
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"must be in [0, 1], got {text}")
    return value


def _pairs(args: argparse.Namespace) -> int:
    from mascot.training.data.pairs import JudgedCandidate, build_pairs, write_pairs

    source = Path(args.source)
    if not source.is_file():
        raise UsageError(f"--in: no such file {args.source}")
    records = list(read_jsonl(source))
    if records and "block_start" in records[0][1]:
        raise UsageError(f"--in: {source} holds judgements of episode blocks, which share no prefix to compare; "
                         "play sibling blocks with `mascot blocks` and judge those (--rubric group)")
    judged: list[JudgedCandidate] = []
    for number, record in records:
        try:
            judged.append(JudgedCandidate.model_validate(record))
        except ValueError as exc:
            raise UsageError(f"{source}:{number}: not a judged candidate ({str(exc).splitlines()[0]}); "
                             "judge a candidate file with `mascot judge --in CANDIDATES`") from None
    weight, why = _label_weight(args, judged)
    if weight > 0:
        from mascot.training.judging.metric_judge import with_metric_overall

        if not args.roster:
            raise UsageError(f"--roster is needed to mix in the metric judge (metric weight {weight:g}, {why})")
        try:
            judged = with_metric_overall(judged, load_roster(args.roster), weight)
        except ValueError as exc:
            raise UsageError(f"--in: {exc}") from None
    pair_set = build_pairs(judged, min_margin=args.min_margin, test_fraction=args.test_fraction, seed=args.seed)
    train, test = write_pairs(pair_set, args.out)
    r = pair_set.report
    labels = f"{1 - weight:g} x judge + {weight:g} x metric judge" if weight > 0 else "judge only"
    out.print(f"pairs: {r.train_pairs} train ({train}), {r.test_pairs} test ({test}) from {r.contexts} contexts; "
              f"dropped {r.dropped_by_margin} under the margin {r.min_margin}, {r.dropped_identical} identical, "
              f"{r.failed_judgements} failed judgements; labels: {labels} ({why})", markup=False)
    return 0


def _label_weight(args: argparse.Namespace, judged: list[Any]) -> tuple[float, str]:
    """The metric judge's weight in the labels, and why: ``--metric-weight``, else the rule
    of ``--sanity`` (0.5 under 70 % sanity accuracy, else 0), else 0."""
    from mascot.training.judging.judge_sanity import (
        SANITY_THRESHOLD,
        SanityError,
        read_sanity_report,
        sanity_metric_weight,
    )

    if args.metric_weight is not None:
        return args.metric_weight, "--metric-weight"
    if not args.sanity:
        return 0.0, "no --metric-weight or --sanity"
    try:
        report = read_sanity_report(args.sanity)
    except SanityError as exc:
        raise UsageError(f"--sanity: {exc}") from None
    judges = {(c.judgement.get("rubric"), c.judgement.get("judge_model")) for c in judged if c.overall is not None}
    other = sorted(str(pair) for pair in judges - {(report.rubric, report.judge)})
    if other:
        raise UsageError(f"--sanity: the report is of judge {report.judge} with rubric {report.rubric}; the "
                         f"candidates were judged by {', '.join(other)} (pass --metric-weight to choose yourself)")
    relation = "under" if report.accuracy < SANITY_THRESHOLD else "at least"
    return sanity_metric_weight(report), (f"judge sanity accuracy {report.accuracy:.0%} {relation} "
                                          f"{SANITY_THRESHOLD:.0%} in {args.sanity}")


def _train_rm(args: argparse.Namespace) -> int:
    from mascot.training.data.pairs import read_pairs
    from mascot.training.fitting.reward_model import RewardModelConfig, RewardModelError, train_reward_model

    folder = Path(args.pairs)
    if not (folder / "train.jsonl").is_file():
        raise UsageError(f"--pairs: no train.jsonl in {folder} (make it with `mascot pairs`)")
    train = read_pairs(folder / "train.jsonl")
    test = read_pairs(folder / "test.jsonl") if (folder / "test.jsonl").is_file() else []
    config, base = recipe_from_args(RewardModelConfig, args)
    err.print(f"training a reward model on {len(train)} pairs ({len(test)} held out) from {base}", markup=False)
    try:
        report = train_reward_model(train, test, base=base, out=args.out, config=config)
    except RewardModelError as exc:  # torch is imported only here, so the error class too
        raise UsageError(str(exc)) from None
    accuracy = (f"held-out pairwise accuracy {report.accuracy_before:.2f} -> {report.accuracy_after:.2f}"
                if report.accuracy_after is not None else "no held-out pairs")
    out.print(f"train-rm: {report.out}: {accuracy}, {report.steps} steps, loss {report.train_loss:.3f}, "
              f"{report.seconds:.0f} s", markup=False)
    return 0
