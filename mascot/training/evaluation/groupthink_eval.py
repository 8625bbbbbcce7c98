"""Groupthink in ``mascot eval``: the roster's held-out probes through every evaluated system.

Each system of the evaluation (``comparison.system_graphs``: the trained policies, the
baselines, the ablations) plays the first ``probes`` held-out probes (``split: test``) of the
roster's probe set, one round each, plain and after the scripted confederate
(``probe_rounds``). The evaluation's judge scores the replies if it passes the judges' gate
on the roster's held-out labelled replies, else the rule fallback does (fitted on the ``dev``
probes' labelled replies); the report says which and why.

Rounds go to ``OUT/groupthink/rounds.jsonl`` as they are played (a rerun plays only the
missing ones); the scores, the scorer checks and every verdict go to
``OUT/groupthink/groupthink.json``. Rates carry 95 % bootstrap intervals resampled by whole
probe (the probe is the scenario of a groupthink round).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph

from mascot.rosters import Roster
from mascot.rosters.probes import ProbeSetError, load_labelled_replies, load_probes
from mascot.training.evaluation.groupthink import (
    JudgeScorer,
    RuleScorer,
    acheck_scorer,
    check_scorer,
    choose_scorer,
)
from mascot.training.evaluation.groupthink_rates import ProbeRound, ascore_rounds, groupthink_scores
from mascot.training.evaluation.probe_rounds import VARIANTS, aplay_probe
from mascot.training.jsonl import JsonlAppender, read_jsonl


def probe_graphs(builders: dict[str, Any]) -> dict[str, CompiledStateGraph]:
    """Each system's graph builder compiled with an in-memory checkpointer (a probe round
    writes the confederate into its thread)."""
    return {name: builder.compile(checkpointer=InMemorySaver()) for name, builder in builders.items()}


def evaluate_groupthink(roster: Roster, graphs: dict[str, CompiledStateGraph], **kwargs: Any) -> dict[str, Any]:
    """``aevaluate_groupthink`` in an event loop of its own (every model client must be new to it)."""
    return asyncio.run(aevaluate_groupthink(roster, graphs, **kwargs))


async def aevaluate_groupthink(
    roster: Roster,
    graphs: dict[str, CompiledStateGraph],
    *,
    judge: BaseChatModel,
    judge_name: str,
    probes: int,
    out: str | Path,
    concurrency: int = 4,
    on_stage: Callable[[str], None] = lambda line: None,
    probe_set: str | Path | None = None,
) -> dict[str, Any]:
    """Play, score and aggregate the held-out probes through ``graphs`` (see the module
    docstring), in the running event loop: the judge's and the graphs' clients live in one
    loop, so run it in the loop that used them before (``evaluate(..., after=...)``).

    Args:
        roster: The evaluated roster; its probe set and labelled replies are read beside it.
        graphs: System name -> graph compiled with a checkpointer, one round per run
            (``max_rounds=1``).
        judge: The evaluation's judge model; ``judge_name`` how the report names it.
        probes: How many held-out probes to play (at most the set's).
        out: The evaluation folder.
        concurrency: Rounds (and judge calls) at a time.
        on_stage: Called with a line at each stage (progress).
        probe_set: Where the roster was loaded from (its id, YAML file or folder): the probe
            set and labelled replies are read beside it (default: the shipped roster's).

    Returns:
        ``{"probes", "judge_check", "rules_check", "scorer", "reason", "scores"}`` (``scores``
        from ``groupthink_scores``).

    Raises:
        ProbeSetError: if the roster has no probe set or labelled replies, or none held out.
    """
    every, labelled = check_probe_set(probe_set or roster)
    held = [p for p in every if p.split == "test"]
    if probes > len(held):
        on_stage(f"groupthink: the probe set holds {len(held)} held-out probes; all are played")
    held = held[:probes]
    folder = Path(out) / "groupthink"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "rounds.jsonl"
    done = {(r["system"], r["probe"], r["variant"]): ProbeRound.from_record(r) for _, r in read_jsonl(path)}
    todo = [(s, p, v) for s in graphs for p in held for v in VARIANTS if (s, p.id, v) not in done]
    on_stage(f"groupthink: {len(held)} held-out probes x {len(graphs)} systems x {len(VARIANTS)} variants "
             f"({len(todo)} rounds to play)")

    gate = asyncio.Semaphore(concurrency)
    with JsonlAppender(path) as sink:
        async def one(system: str, probe: Any, variant: str) -> None:
            async with gate:
                played = await aplay_probe(graphs[system], system, roster, probe, variant)
            sink.write(played.record())
            done[(system, probe.id, variant)] = played

        await asyncio.gather(*(one(s, p, v) for s, p, v in todo))
    on_stage("groupthink: checking the judge and the rule fallback on the held-out labelled replies")
    judge_scorer = JudgeScorer(judge, name=f"judge {judge_name}", concurrency=concurrency)
    judge_check = await acheck_scorer(judge_scorer, labelled, every)
    rules = RuleScorer.fit(labelled, every)
    rules_check = check_scorer(rules, labelled, every)
    chosen, reason = choose_scorer(judge_check, rules_check)
    on_stage(f"groupthink: {reason}")
    rounds = [done[(s, p.id, v)] for s in graphs for p in held for v in VARIANTS]
    for r in rounds:
        r.verdicts = []  # scored afresh by the scorer chosen now
    await ascore_rounds(rounds, {p.id: p for p in every}, judge_scorer if chosen == "judge" else rules)
    scores = groupthink_scores(rounds, held, scorer=judge_scorer.name if chosen == "judge" else rules.name,
                               reason=reason)
    results = {"probes": [p.id for p in held], "judge_check": judge_check.model_dump(),
               "rules_check": rules_check.model_dump(), "scorer": chosen, "reason": reason, "scores": scores}
    (folder / "groupthink.json").write_text(
        json.dumps({**results, "rounds": [r.record() for r in rounds]}, indent=1) + "\n", encoding="utf-8")
    return results


def check_probe_set(source: Roster | str | Path) -> tuple[list[Any], list[Any]]:
    """The roster's probes and labelled replies, checked for what ``evaluate_groupthink``
    needs: held-out probes, and labelled replies to ``dev`` probes (to fit the rule
    fallback) and to held-out ones (to check the scorers).

    Raises:
        ProbeSetError: one line, naming what is missing.
    """
    probes, labelled = load_probes(source), load_labelled_replies(source)
    splits = {p.id: p.split for p in probes}
    if "test" not in splits.values():
        raise ProbeSetError("the probe set has no held-out (split: test) probe to play")
    for split, use in (("dev", "fit the rule fallback's thresholds"), ("test", "check the scorers")):
        if not any(splits.get(r.probe) == split for r in labelled):
            raise ProbeSetError(f"no labelled reply answers a {split} probe: nothing to {use} on")
    return probes, labelled


def checks_line(results: dict[str, Any]) -> str:
    """One line: each scorer's accuracy and p-value per measure on the held-out labelled replies."""
    parts = []
    for key in ("judge_check", "rules_check"):
        check = results[key]
        measures = ", ".join(f"{m} {c['accuracy']:.0%} (p={c['p_value']:.2g})" for m, c in check["measures"].items())
        parts.append(f"{check['scorer']} on {check['replies']} labelled replies: {measures}"
                     f"{'' if check['trusted'] else ' (not trusted)'}")
    return "; ".join(parts)
