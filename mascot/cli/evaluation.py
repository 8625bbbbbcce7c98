"""``mascot eval``: the trained policies against the baselines, judged, measured, reported."""

from __future__ import annotations

import argparse
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from mascot.cli.options import (
    CONCURRENCY_HELP,
    ROSTER_HELP,
    UsageError,
    add_judge_flags,
    budgets,
    err,
    judge_policies_from_args,
    mask_secrets_in_logs,
    on_engine,
    out,
    positive,
    roster_scenarios,
    with_budgets,
)
from mascot.rosters import load_profiles, load_roster, load_scenarios


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``eval`` to the command line."""
    evaluate = commands.add_parser("eval", help="compare trained policies with the baselines: tables and plots")
    evaluate.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    evaluate.add_argument("--policies", required=True, metavar="FILE",
                          help="the trained policy file (its 'default' role is the base model of the baselines)")
    evaluate.add_argument("--baselines", metavar="A,B",
                          help="baselines to run (default all: zero_shot,round_robin,random,untrained_director,"
                               "all_speak); '' for none")
    evaluate.add_argument("--ablations", action="store_true", help="also run no_alignment and no_director")
    evaluate.add_argument("--sft", metavar="FILE", help="the warm start's policy file (mascot train-sft): also run "
                                                        "it as the system 'sft', the SFT baseline")
    evaluate.add_argument("--scenarios", metavar="FILE", help="held-out scenarios (default: the roster's)")
    evaluate.add_argument("--profiles", metavar="FILE", help="user profiles (default: the roster's)")
    evaluate.add_argument("--episodes", type=positive, default=8, metavar="N", help="episodes per system")
    add_judge_flags(evaluate, required=True)
    evaluate.add_argument("--max-rounds", type=positive, default=2, metavar="N",
                          help="rounds per episode (one simulated-user message each)")
    evaluate.add_argument("--max-speakers", type=positive, default=3, metavar="N", help="persona turns per round")
    evaluate.add_argument("--max-tokens", type=budgets, metavar="N|ROLE=N,...",
                          help="reply budgets of the evaluated systems: N for every role, or per role "
                               "(director, speakers, user); default: each role's own")
    evaluate.add_argument("--block-turns", type=positive, default=4, metavar="N",
                          help="turns in each block the group rubric judges")
    evaluate.add_argument("--metrics-only", default="", metavar="A,B",
                          help="systems measured by the automatic metrics only, not judged (saves judge calls)")
    evaluate.add_argument("--rubrics", default="persona,group,direction", metavar="A,B",
                          help="rubrics the judge applies (default persona,group,direction; direction is the "
                               "stage-direction compliance metric)")
    evaluate.add_argument("--groupthink", type=int, default=0, metavar="N",
                          help="also play N of the roster's held-out groupthink probes (at most all of them; "
                               "plain and after a "
                               "confederate) through every system and report endorses-only, concern and "
                               "conformity rates (default 0: not measured)")
    evaluate.add_argument("--concurrency", type=positive, default=4, metavar="C", help=CONCURRENCY_HELP)
    evaluate.add_argument("--engine", choices=("local", "vllm"), default="local",
                          help="what runs the local models: local (in-process) or vllm (a vLLM server for the "
                               "policies and one for a local judge, started for this command)")
    evaluate.add_argument("--seed", type=int, default=0,
                          help="seed of the episode plan (every system plays the same scenarios and profiles)")
    evaluate.add_argument("--out", required=True, metavar="DIR",
                          help="folder of the report, results.json/.csv, plots and episodes")
    evaluate.set_defaults(run=_eval)


def reply_budgets(policies: Any, roster: Any) -> dict[str, int]:
    """Each role's reply budget in tokens (the same for every system), for the results."""
    return {role: policies.max_tokens(role) for role in ("director", "user", *roster.persona_ids)}


def _eval(args: argparse.Namespace) -> int:
    from mascot.policies import Policies
    from mascot.training.evaluation.comparison import ABLATIONS, BASELINE_SYSTEMS, EvalPlan, evaluate
    from mascot.training.evaluation.report import summarize, write_report
    from mascot.training.judging.judge import Judge
    from mascot.training.judging.judgement import JudgementCache
    from mascot.training.judging.rubric import load_rubric
    from mascot.training.retry import model_retry_policy

    roster = load_roster(args.roster)
    if args.groupthink < 0:
        raise UsageError(f"--groupthink: expected a number of probes >= 0, got {args.groupthink}")
    if args.groupthink:
        _probe_sets(args.roster)
    if not Path(args.policies).is_file():
        raise UsageError(f"--policies: no such file {args.policies}")
    trained = Policies.from_file(args.policies, roster, seed=args.seed)
    trained = on_engine(args, with_budgets(trained, args.max_tokens))
    baselines = BASELINE_SYSTEMS if args.baselines is None else [s for s in args.baselines.split(",") if s]
    systems = ["trained", *(["sft"] if args.sft else []), *baselines, *(ABLATIONS if args.ablations else ())]
    sft = None
    if args.sft:
        if not Path(args.sft).is_file():
            raise UsageError(f"--sft: no such file {args.sft}")
        sft = on_engine(args, with_budgets(Policies.from_file(args.sft, roster, seed=args.seed), args.max_tokens))
        mask_secrets_in_logs(sft)
    scenarios = load_scenarios(args.scenarios) if args.scenarios else roster_scenarios(args.roster, "eval")
    profiles = load_profiles(args.profiles) if args.profiles else list(roster.user_profiles)
    judge_policies = on_engine(args, judge_policies_from_args(args, roster))
    mask_secrets_in_logs(trained)
    mask_secrets_in_logs(judge_policies)
    folder = Path(args.out)
    folder.mkdir(parents=True, exist_ok=True)
    record = judge_policies.record("judge")
    judge_name = record["model"] + (f"+{record['adapter']}" if record["adapter"] else "")
    plan = EvalPlan(scenarios=scenarios, profiles=profiles, episodes=args.episodes, seed=args.seed,
                    max_rounds=args.max_rounds, max_speakers=args.max_speakers, concurrency=args.concurrency,
                    block_turns=args.block_turns)
    rubrics = [r for r in args.rubrics.split(",") if r]
    unknown = sorted(set(rubrics) - {"persona", "group", "direction"})
    if unknown or not rubrics:
        raise UsageError(f"--rubrics: unknown {', '.join(unknown) or '(none given)'}; valid: persona, group, direction")
    with JudgementCache(folder / "judgements.cache.jsonl") as cache:
        judges = {rubric: Judge(load_rubric(rubric), judge_policies.chat_model("judge"), model_name=judge_name,
                                structured_output=True, cache=cache)
                  for rubric in rubrics}
        groupthink: dict[str, Any] = {}
        after = _groupthink(args, roster, trained, systems, plan, sft, judge_policies, judge_name, groupthink) \
            if args.groupthink else None
        try:
            scores = evaluate(roster, trained, systems=systems, plan=plan, judges=judges, out=folder,
                              unjudged=[name for name in args.metrics_only.split(",") if name], sft=sft,
                              retry=model_retry_policy(3), on_stage=lambda line: err.print(line, markup=False),
                              after=after)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    summary = summarize(scores, seed=args.seed)
    if groupthink:
        summary["groupthink"] = groupthink
    base = trained.spec("default").model
    summary["setup"] = {"roster": roster.id, "policies": str(args.policies), "base_model": base,
                        "judge": judge_name, "episodes_per_system": args.episodes, "seed": args.seed,
                        "systems": systems, "max_rounds": args.max_rounds, "max_speakers": args.max_speakers,
                        "reply_budgets": reply_budgets(trained, roster)}
    header = (f"Roster `{roster.id}`; trained policies `{args.policies}`; base model of every system "
              f"`{base}`; judge `{judge_name}`; {args.episodes} episodes per system (the same scenarios, "
              f"people and seed {args.seed} for all); mean ± sd over episodes, n = episodes behind each cell.")
    from mascot.training.episodes.episode import read_episodes
    from mascot.training.evaluation.episode_view import episodes_html
    from mascot.training.jsonl import read_jsonl

    page = folder / "conversations.html"
    page.write_text(episodes_html(
        {name: read_episodes(folder / "episodes" / f"{name}.jsonl") for name in systems}, roster,
        title=f"Evaluation conversations ({roster.id})",
        judgements={name: [r for _, r in read_jsonl(folder / "judgements" / f"{name}.jsonl")]
                    for name in systems if (folder / "judgements" / f"{name}.jsonl").is_file()}),
        encoding="utf-8")
    header += " Read the conversations: [conversations.html](conversations.html)."
    if roster.safety:
        header += " " + _safety_line(roster, summary)
    files = write_report(summary, folder, header=header)
    out.print(f"eval: {len(systems)} systems, report {folder / 'report.md'} ({len(files)} files)", markup=False)
    return 0


def _probe_sets(source: str) -> None:
    """Fail early, in one line, when ``--groupthink`` cannot be measured for the roster."""
    from mascot.rosters.probes import ProbeSetError
    from mascot.training.evaluation.groupthink_eval import check_probe_set

    try:
        check_probe_set(source)
    except ProbeSetError as exc:
        raise UsageError(f"--groupthink: {exc}") from None


def _groupthink(args: argparse.Namespace, roster: Any, trained: Any, systems: list[str], plan: Any, sft: Any,
                judge_policies: Any, judge_name: str, into: dict[str, Any]) -> Callable[[], Awaitable[None]]:
    """The held-out probes through every system, one round each (``groupthink_eval``), as
    work for the evaluation's event loop; the results go into ``into``."""
    from dataclasses import replace

    from mascot.training.evaluation.comparison import system_graphs
    from mascot.training.evaluation.groupthink_eval import aevaluate_groupthink, probe_graphs
    from mascot.training.retry import model_retry_policy

    builders = system_graphs(roster, trained, systems=systems, plan=replace(plan, max_rounds=1),
                             retry=model_retry_policy(3), sft=sft)
    graphs = probe_graphs({name: builder for name, (_, builder, _) in builders.items()})

    async def run() -> None:
        into.update(await aevaluate_groupthink(
            roster, graphs, judge=judge_policies.chat_model("judge"), judge_name=judge_name, probes=args.groupthink,
            out=args.out, concurrency=args.concurrency, on_stage=lambda line: err.print(line, markup=False),
            probe_set=args.roster))

    return run


def add_show_command(commands: argparse._SubParsersAction) -> None:
    """Add ``show`` to the command line."""
    show = commands.add_parser("show", help="print episodes for reading, or write them as one HTML page")
    show.add_argument("episodes", metavar="EPISODES", help="episode JSONL (rollout, import-logs, eval)")
    show.add_argument("--roster", metavar="ID_OR_PATH", help="the roster (default: the episodes' roster id)")
    show.add_argument("--html", metavar="OUT.html", help="write one self-contained page instead of printing")
    show.add_argument("--judgements", metavar="FILE", help="judgement records to show beside each reply")
    show.add_argument("--limit", type=positive, metavar="N", help="show only the first N episodes")
    show.set_defaults(run=_show)


def _show(args: argparse.Namespace) -> int:
    from mascot.training.episodes.episode import read_episodes
    from mascot.training.evaluation.episode_view import episodes_html, print_episodes
    from mascot.training.jsonl import read_jsonl

    if not Path(args.episodes).is_file():
        raise UsageError(f"no such file {args.episodes}")
    episodes = read_episodes(args.episodes)[: args.limit]
    if not episodes:
        raise UsageError(f"no episodes in {args.episodes}")
    roster = load_roster(args.roster or episodes[0].roster)
    if args.html is None:
        print_episodes(episodes, roster, out)
        return 0
    if args.judgements and not Path(args.judgements).is_file():
        raise UsageError(f"--judgements: no such file {args.judgements}")
    judgements = [r for _, r in read_jsonl(args.judgements)] if args.judgements else []
    page = Path(args.html)
    if not page.parent.is_dir():
        raise UsageError(f"--html: directory of {args.html} does not exist")
    page.write_text(episodes_html({Path(args.episodes).stem: episodes}, roster, title=Path(args.episodes).name,
                                  judgements={Path(args.episodes).stem: judgements}), encoding="utf-8")
    out.print(f"show: {len(episodes)} episodes in {page}", markup=False)
    return 0


def _safety_line(roster: Any, summary: dict[str, Any]) -> str:
    """The crisis detector's figures on the roster's labelled set, for the report and results."""
    from mascot.graphs.safety_detector import SafetyDetector
    from mascot.training.evaluation.safety import (
        SafetySetError,
        conversation_report,
        detector_report,
        load_conversation_set,
        load_safety_set,
    )

    try:
        messages = load_safety_set(roster)
    except SafetySetError as exc:
        return f"Safety: the detector was not measured ({exc})."
    detector = SafetyDetector.for_roster(roster)
    report = detector_report(detector, messages)
    summary["setup"]["safety_detector"] = {k: v for k, v in vars(report).items() if k not in ("missed", "false_alarms")}
    summary["setup"]["safety_detector"]["encoder"] = detector.embedder.name
    line = f"Safety: the crisis detector ({detector.embedder.name}) on the roster's labelled set: {report.line()}"
    try:
        talks = conversation_report(detector, load_conversation_set(roster))
    except SafetySetError:
        talks = None
    if talks is not None:
        summary["setup"]["safety_conversations"] = {k: v for k, v in vars(talks).items()
                                                    if k not in ("missed", "false_alarms")}
        line += f"; its labelled {talks.line()}"
    return line + ("; the safety table reads every system's rounds with it (only the director graph's systems are "
                   "guarded).")
