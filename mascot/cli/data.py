"""``mascot candidates``, ``blocks`` and ``pairs``: the training data made from episodes —
sampled replies, sibling blocks of Director decisions, and preference pairs of judged ones."""

from __future__ import annotations

import argparse
import asyncio
import json
from pathlib import Path
from typing import Any

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from mascot.cli.options import (
    CONCURRENCY_HELP,
    ROSTER_HELP,
    UsageError,
    add_policy_flags,
    err,
    mask_secrets_in_logs,
    on_engine,
    out,
    policies_from_args,
    positive,
)
from mascot.rosters import load_roster


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``candidates``, ``blocks`` and ``pairs`` to the command line."""
    candidates = commands.add_parser(
        "candidates", help="sample K replies per persona turn of episodes, for preference pairs"
    )
    candidates.add_argument("--in", dest="source", required=True, metavar="EPISODES",
                            help="episode JSONL (from rollout or import-logs)")
    candidates.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    add_policy_flags(candidates)
    candidates.add_argument("--k", type=positive, default=4, help="replies per context (default 4)")
    candidates.add_argument("--max-contexts", type=positive, metavar="N",
                            help="use only the first N persona turns")
    candidates.add_argument("--concurrency", type=positive, default=8, metavar="C", help=CONCURRENCY_HELP)
    candidates.add_argument("--seed", type=int, help="seed for sampling")
    candidates.add_argument("--out", required=True, metavar="FILE", help="candidate JSONL (appended)")
    candidates.set_defaults(run=_candidates)

    blocks = commands.add_parser(
        "blocks", help="play G sibling blocks at each Director decision point, for the group reward model")
    blocks.add_argument("--in", dest="source", required=True, metavar="EPISODES",
                        help="episode JSONL (from rollout or import-logs)")
    blocks.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    add_policy_flags(blocks)
    blocks.add_argument("--g", type=positive, default=4, metavar="G", help="blocks per decision point (default 4)")
    blocks.add_argument("--block-turns", type=positive, default=3, metavar="N",
                        help="turns played after each decision (default 3)")
    blocks.add_argument("--max-points", type=positive, metavar="N", help="use only the first N decision points")
    blocks.add_argument("--max-speakers-per-round", type=positive, default=3, metavar="N",
                        help="persona turns before the turn returns to the person")
    blocks.add_argument("--concurrency", type=positive, default=8, metavar="C", help=CONCURRENCY_HELP)
    blocks.add_argument("--seed", type=int, help="seed for sampling")
    blocks.add_argument("--out", required=True, metavar="FILE", help="sibling block JSONL (appended)")
    blocks.set_defaults(run=_blocks)

    samples = commands.add_parser(
        "samples", help="warm-start data: K directions per decision point and K replies per persona turn from the "
                        "policy and a teacher, kept only when they pass the checks (mascot train-sft --samples)")
    samples.add_argument("--in", dest="source", required=True, metavar="EPISODES",
                         help="episode JSONL of the train scenarios (from rollout or import-logs)")
    samples.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    add_policy_flags(samples)
    teacher = samples.add_argument_group("teacher (optional, one of)").add_mutually_exclusive_group()
    teacher.add_argument("--teacher-model", metavar="HF_ID_OR_PATH",
                         help="a stronger local model sampled beside the policy, on the same --engine")
    teacher.add_argument("--teacher-policies", metavar="FILE", help="policy file of the teacher")
    samples.add_argument("--k", type=positive, default=4, help="samples per context and source (default 4)")
    samples.add_argument("--max-points", type=positive, metavar="N", help="use only the first N decision points")
    samples.add_argument("--max-contexts", type=positive, metavar="N", help="use only the first N persona turns")
    samples.add_argument("--concurrency", type=positive, default=8, metavar="C", help=CONCURRENCY_HELP)
    samples.add_argument("--play", action="store_true",
                         help="play each passing direction as a one-turn block with the policy's speakers, so "
                              "directions are ranked by what their voice then said (mascot train-sft --samples)")
    samples.add_argument("--seed", type=int, help="seed for sampling")
    samples.add_argument("--out", required=True, metavar="FILE", help="samples JSONL (appended; each with its fault)")
    samples.set_defaults(run=_samples)

    pairs = commands.add_parser("pairs", help="preference pairs from judged candidates, from the groups of a "
                                              "samples file, or from an app's approvals")
    source = pairs.add_mutually_exclusive_group(required=True)
    source.add_argument("--samples", metavar="FILE",
                        help="a samples file (mascot samples): per context the best passing sample by the measured "
                             "outcomes against a faulty one, or the worst passing one --min-margin below it "
                             "(speaker and Director pairs; needs --roster)")
    source.add_argument("--in", dest="source", metavar="JUDGED",
                        help="judged candidates: replies (mascot candidates) or sibling blocks (mascot blocks)")
    source.add_argument("--approvals", metavar="EPISODES",
                        help="episodes of a graph with approve=True: each direction the app edited or rejected "
                             "against the one it played (Director pairs; needs --roster)")
    pairs.add_argument("--min-margin", type=float, metavar="M",
                       help="least difference of the overall scores, in 1-5 judge units (default 0.5); with "
                            "--samples, of the measured scores (default 0.2)")
    pairs.add_argument("--metric-weight", type=_unit_interval, metavar="W",
                       help="label = (1-W) x judge + W x metric judge overall (default 0: judge only)")
    pairs.add_argument("--sanity", metavar="REPORT.json",
                       help="the judge's sanity report (mascot judge --sanity --out): without --metric-weight, "
                            "W = 1 (the metric judge alone) unless the judge is trusted (at least 75%% "
                            "right with p < 0.01 against chance), else 0")
    pairs.add_argument("--roster", metavar="ID_OR_PATH", help="the candidates' roster (needed when W > 0)")
    pairs.add_argument("--test-fraction", type=float, default=0.1, metavar="F",
                       help="share of the contexts held out in test.jsonl (a context's pairs stay together)")
    pairs.add_argument("--seed", type=int, default=0, help="seed of the train/test split")
    pairs.add_argument("--out", required=True, metavar="DIR", help="folder for train.jsonl and test.jsonl")
    pairs.set_defaults(run=_pairs)


def _approval_pairs(args: argparse.Namespace) -> int:
    from mascot.training.data.approval_pairs import approval_pairs
    from mascot.training.data.pairs import write_pairs

    if not args.roster:
        raise UsageError("--approvals needs --roster (the episodes' roster)")
    episodes = _input_episodes(args.approvals, flag="--approvals")
    try:
        pair_set = approval_pairs(episodes, load_roster(args.roster), test_fraction=args.test_fraction, seed=args.seed)
    except ValueError as exc:
        raise UsageError(f"--approvals: {exc}") from None
    train, test = write_pairs(pair_set, args.out)
    r = pair_set.report
    out.print(f"pairs: {r.train_pairs} train ({train}), {r.test_pairs} test ({test}) Director pairs from "
              f"{r.candidates} approval answers at {r.contexts} decision points", markup=False)
    return 0


def _input_episodes(source: str, flag: str = "--in") -> list[Any]:
    """The episodes of ``--in``, or a one-line usage error (missing file, no episodes)."""
    from mascot.training.episodes.episode import read_episodes

    if not Path(source).is_file():
        raise UsageError(f"{flag}: no such file {source}")
    episodes = read_episodes(source)
    if not episodes:
        raise UsageError(f"{flag}: no episodes in {source}")
    return episodes


def _candidates(args: argparse.Namespace) -> int:
    from mascot.training.data.candidates import CandidateReport, candidate_contexts, sample_candidates
    from mascot.training.episodes.episode import TurnPolicy

    roster = load_roster(args.roster)
    episodes = _input_episodes(args.source)
    try:
        contexts = candidate_contexts(episodes, roster)
    except ValueError as exc:
        raise UsageError(f"--in: {exc}") from None
    contexts = contexts[: args.max_contexts] if args.max_contexts else contexts
    if not contexts:
        raise UsageError(f"--in: the episodes in {args.source} have no persona turns with a stage direction")
    policies = on_engine(args, policies_from_args(args, roster))
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
    policies = on_engine(args, policies_from_args(args, roster))
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
    from mascot.training.data.pairs import build_pairs, write_pairs
    from mascot.training.jsonl import read_jsonl
    from mascot.training.judging.judgement import JudgedCandidate

    if args.approvals:
        return _approval_pairs(args)
    if args.samples:
        return _sample_pairs(args)
    args.min_margin = 0.5 if args.min_margin is None else args.min_margin
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


def _sample_pairs(args: argparse.Namespace) -> int:
    """``pairs --samples``: best against worst within each group of a samples file."""
    from mascot.training.data.selection import pool_pairs

    if not args.roster:
        raise UsageError("--samples needs --roster (the persona descriptions the measures compare with)")
    if not Path(args.samples).is_file():
        raise UsageError(f"--samples: no such file {args.samples}")
    made = pool_pairs(args.samples, load_roster(args.roster), seed=args.seed,
                      min_margin=0.2 if args.min_margin is None else args.min_margin)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    for split, rows in made.items():
        (folder / f"{split}.jsonl").write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows),
                                               encoding="utf-8")
    roles = {role: sum((r["persona"] == "director") == (role == "director") for rows in made.values() for r in rows)
             for role in ("director", "speakers")}
    faulty = sum(r["provenance"]["rejected"]["why"].startswith("fault") for rows in made.values() for r in rows)
    out.print(f"pairs: {len(made['train'])} train, {len(made['test'])} test in {folder} from {args.samples} "
              f"(director {roles['director']}, speakers {roles['speakers']}; {faulty} against a faulty sample, "
              f"the rest against the lowest measured one)", markup=False)
    return 0


def _label_weight(args: argparse.Namespace, judged: list[Any]) -> tuple[float, str]:
    """The metric judge's weight in the labels, and why: ``--metric-weight``, else the rule
    of ``--sanity`` (1, the metric judge alone, unless the judge is trusted: at least 75 %
    with p < 0.01; then 0), else 0."""
    from mascot.training.judging.judge_sanity import (
        SANITY_P_VALUE,
        SANITY_THRESHOLD,
        binomial_p,
        read_sanity_report,
        sanity_metric_weight,
        trusted,
    )
    from mascot.training.judging.sanity_set import SanityError

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
    chance = binomial_p(report.right, report.total)
    return sanity_metric_weight(report), (f"judge sanity {report.right}/{report.total} "
                                          f"({report.accuracy:.0%}, p = {chance:.2g}) in {args.sanity}: "
                                          f"{'trusted' if trusted(report.right, report.total) else 'not trusted'}, "
                                          f"the rule is {SANITY_THRESHOLD:.0%} with p < {SANITY_P_VALUE}")


def _samples(args: argparse.Namespace) -> int:
    from mascot.training.data.block_rollout import decision_points
    from mascot.training.data.candidates import candidate_contexts
    from mascot.training.data.warm_start_samples import SampleReport, sample_counts, sample_warm_start

    roster = load_roster(args.roster)
    episodes = _input_episodes(args.source)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)  # a pipeline's iteration folder
    try:
        points = decision_points(episodes, roster)[: args.max_points]
        contexts = candidate_contexts(episodes, roster)[: args.max_contexts]
    except ValueError as exc:
        raise UsageError(f"--in: {exc}") from None
    if not points and not contexts:
        raise UsageError(f"--in: the episodes in {args.source} have no Director decision point or persona turn")
    sets = {"policy": policies_from_args(args, roster)}
    if args.teacher_model or args.teacher_policies:
        teacher = argparse.Namespace(**{**vars(args), "model": args.teacher_model, "policies": args.teacher_policies,
                                        "base_url": None, "api_key_env": None})
        sets["teacher"] = policies_from_args(teacher, roster)
    sources = {}
    for name, policies in sets.items():
        policies = on_engine(args, policies)
        mask_secrets_in_logs(policies)
        sources[name] = {"director": policies.chat_model("director"), **policies.speakers()}
    total = (len(points) + len(contexts)) * args.k * len(sources)
    progress = Progress(TextColumn("samples"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err)
    with progress:
        task = progress.add_task("samples", total=total)

        def show(report: SampleReport) -> None:
            progress.update(task, completed=report.skipped + sum(r["sampled"] for r in report.counts.values()))

        play = {pid: model for pid, model in sources["policy"].items() if pid != "director"} if args.play else None
        asyncio.run(sample_warm_start(points, contexts, roster, sources, k=args.k, out=args.out,
                                      concurrency=args.concurrency, play=play, on_progress=show))
    for key, row in sorted(sample_counts(args.out).items()):
        faults = ", ".join(f"{name} {n}" for name, n in sorted(row.items(), key=lambda item: -item[1])
                           if name not in ("sampled", "passed")) or "none"
        out.print(f"samples: {key}: {row['passed']} of {row['sampled']} passed (left out: {faults})", markup=False)
    out.print(f"samples: {args.out} ({len(points)} decision points, {len(contexts)} persona turns x {args.k}; "
              f"mascot train-sft --samples {args.out})", markup=False)
    return 0
