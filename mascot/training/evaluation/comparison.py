"""Evaluation against baselines: the same plan through every system, judged and measured.

Every system runs the same scenarios x user profiles x repeats with the same seed, so the
same plan item has the same episode id in every system and differences are paired. The
baselines and ablations use the *same base model* as the trained system (the bare base of
the policy file's ``default`` role), so only training and direction differ:

- ``trained``: the trained Director and speakers of the policy file.
- ``zero_shot``: one generic assistant (no personas).
- ``round_robin``, ``random``, ``all_speak``: the untrained personas in fixed, random, or
  everyone-speaks order.
- ``untrained_director``: the director graph with the untrained base for every role.
- ``sft``: the director graph on the SFT warm start's policy file (``mascot train-sft``),
  the paper's SFT baseline.
- Ablations ``no_alignment`` (untrained speakers, trained Director) and ``no_director``
  (trained speakers, random order).

Episodes go to ``OUT/episodes/<system>.jsonl`` and judgements to
``OUT/judgements/<system>.jsonl`` (both resumable: a rerun only does what is missing).
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.types import RetryPolicy

from mascot.graphs import create_baseline_graph, create_director_graph
from mascot.graphs.baselines import ASSISTANT
from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.safety_detector import SafetyDetector
from mascot.policies import Policies
from mascot.rosters import Roster, Scenario, UserProfile
from mascot.training.episodes.episode import Episode, TurnPolicy, read_episodes
from mascot.training.episodes.rollout import collect_episodes
from mascot.training.evaluation.guards import guard_metrics
from mascot.training.evaluation.metrics import episode_metrics, round_redundancy
from mascot.training.evaluation.report import SystemScores
from mascot.training.evaluation.routing import RoutingError, load_routing_set, routing_results
from mascot.training.evaluation.safety import safety_metrics
from mascot.training.jsonl import JsonlAppender, read_jsonl
from mascot.training.judging.judge import Judge
from mascot.training.judging.rubric import Rubric
from mascot.training.judging.targets import block_targets, reply_targets

logger = logging.getLogger(__name__)

#: Baseline systems (the paper's comparisons).
BASELINE_SYSTEMS = ("zero_shot", "round_robin", "random", "untrained_director", "all_speak")
#: The rubric whose single criterion is reported as a metric (stage-direction compliance).
COMPLIANCE = "direction"
#: Ablations of the trained system.
ABLATIONS = ("no_alignment", "no_director")
#: The SFT warm start's system (the paper's SFT baseline).
SFT_SYSTEM = "sft"


@dataclass(frozen=True)
class EvalPlan:
    """What every system runs: scenarios x profiles, ``episodes`` of them, ``seed``,
    ``max_rounds`` rounds of up to ``max_speakers`` voices."""

    scenarios: Sequence[Scenario]
    profiles: Sequence[UserProfile]
    episodes: int
    seed: int = 0
    max_rounds: int = 2
    max_speakers: int = 3
    concurrency: int = 4
    block_turns: int = 4


def system_graphs(
    roster: Roster, trained: Policies, *, systems: Sequence[str], plan: EvalPlan, retry: RetryPolicy | None = None,
    sft: Policies | None = None,
) -> dict[str, tuple[str, Any, dict[str, TurnPolicy]]]:
    """The graph of each system (``trained``, baselines, ablations by name).

    Args:
        sft: The warm start's policies, which the ``sft`` system runs.

    Returns:
        Name -> (kind, compiled-ready graph builder, the policy record of each role).

    Raises:
        ValueError: on an unknown system name (the message lists the valid ones), or
            ``sft`` without its policies.
    """
    valid = ("trained", SFT_SYSTEM, *BASELINE_SYSTEMS, *ABLATIONS)
    unknown = [s for s in systems if s not in valid]
    if unknown:
        raise ValueError(f"unknown system(s) {', '.join(unknown)}; valid: {', '.join(valid)}")
    if SFT_SYSTEM in systems and sft is None:
        raise ValueError("the sft system needs the warm start's policy file (mascot train-sft)")
    base = trained.without_adapters()
    user = trained.chat_model("user")
    common = {"user": user, "max_rounds": plan.max_rounds, "max_speakers_per_round": plan.max_speakers,
              "retry_policy": retry}

    def director(director_policy: Policies, speakers: dict[str, BaseChatModel]) -> Any:
        return create_director_graph(roster, director=director_policy.chat_model("director"), speakers=speakers,
                                     structured_output=True, **common)

    builders: dict[str, Callable[[], Any]] = {
        "trained": lambda: director(trained, trained.speakers()),
        "zero_shot": lambda: create_baseline_graph("single", roster, speakers=base.chat_model("default"),
                                                   seed=plan.seed, **common),
        "round_robin": lambda: create_baseline_graph("round_robin", roster, speakers=base.speakers(),
                                                     seed=plan.seed, **common),
        "random": lambda: create_baseline_graph("random", roster, speakers=base.speakers(), seed=plan.seed, **common),
        "all_speak": lambda: create_baseline_graph("all", roster, speakers=base.speakers(), seed=plan.seed, **common),
        "untrained_director": lambda: director(base, base.speakers()),
        SFT_SYSTEM: lambda: director(sft, sft.speakers()),
        "no_alignment": lambda: director(trained, base.speakers()),
        "no_director": lambda: create_baseline_graph("random", roster, speakers=trained.speakers(), seed=plan.seed,
                                                     **common),
    }
    roles = ("director", "user", *roster.persona_ids)
    graphs = {}
    for name in systems:
        kind = "trained" if name == "trained" else "ablation" if name in ABLATIONS else "baseline"
        source = {"trained": trained, "no_alignment": trained, "no_director": trained, SFT_SYSTEM: sft}.get(name, base)
        records = {role: TurnPolicy(**source.record(role)) for role in roles}
        if name == "no_alignment":
            records.update({p: TurnPolicy(**base.record(p)) for p in roster.persona_ids})
        graphs[name] = (kind, builders[name](), records)
    return graphs


async def run_system(name: str, graph: Any, records: dict[str, TurnPolicy], *, roster: Roster, plan: EvalPlan,
                     out: Path) -> list[Episode]:
    """Roll the plan out through one system (resumable) and read its episodes back."""
    path = out / "episodes" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    await collect_episodes(graph, plan.scenarios, plan.profiles, roster=roster.id, out=path,
                           episodes=plan.episodes, concurrency=plan.concurrency, seed=plan.seed, policies=records)
    return read_episodes(path)


async def judge_system(name: str, episodes: Sequence[Episode], *, roster: Roster, judges: dict[str, Judge],
                       plan: EvalPlan, out: Path) -> list[dict[str, Any]]:
    """Judge a system's episodes with each rubric (reply targets for ``persona``, blocks
    for ``group``); judgements already in ``OUT/judgements/<name>.jsonl`` are not asked again.

    Returns:
        Every judgement record of the system.
    """
    path = out / "judgements" / f"{name}.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    done = {_key(r) for _, r in read_jsonl(path) if r.get("status") == "ok"}
    judged_roster = _with_assistant(roster)
    with JsonlAppender(path) as sink:
        for rubric_id, judge in judges.items():
            targets = [t for e in episodes for t in (
                reply_targets(e, judged_roster) if judge.rubric.target == "reply"
                else block_targets(e, judged_roster, block_turns=plan.block_turns))]
            if rubric_id == COMPLIANCE:  # only replies that followed a direction
                targets = [t for t in targets if t.direction]
            todo = [t for t in targets if (rubric_id, *_target_key(t)) not in done]
            await judge.ajudge_many(todo, concurrency=plan.concurrency,
                                    on_judgement=lambda j: sink.write(j.record()))
    return [r for _, r in read_jsonl(path)]


def system_scores(name: str, kind: str, episodes: Sequence[Episode], judgements: Sequence[dict[str, Any]], *,
                  roster: Roster, rubrics: dict[str, Rubric], embedder: Embedder | None = None) -> SystemScores:
    """Per-episode values of every table column: judge criteria on 0-100 (mean over the
    episode's judged replies or blocks), ``overall``, and the automatic metrics."""
    scores = SystemScores(name=name, kind=kind,
                          clusters={e.id: e.scenario.id if e.scenario else e.id for e in episodes})
    judged: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for j in judgements:
        if j.get("status") == "ok":
            judged.setdefault((j.get("rubric"), j.get("episode_id")), []).append(j)
    for rubric_id, rubric in rubrics.items():
        table: dict[str, dict[str, float]] = {c.id: {} for c in rubric.criteria}
        table["overall"] = {}
        for episode in episodes:
            mine = judged.get((rubric_id, episode.id), [])
            if not mine:
                continue
            for criterion in rubric.criteria:
                values = [(j["scores"][criterion.id] - 1) / 4 * 100 for j in mine if criterion.id in j["scores"]]
                if values:
                    table[criterion.id][episode.id] = sum(values) / len(values)
            table["overall"][episode.id] = sum(j["overall"] for j in mine) / len(mine)
        if rubric_id == COMPLIANCE:  # one number per episode: beside the automatic metrics
            scores.tables.setdefault("metrics", {})["direction_compliance"] = table["overall"]
        else:
            scores.tables[rubric_id] = table
    embedder = embedder or default_embedder()
    measured = _with_assistant(roster)
    metrics: dict[str, dict[str, float]] = scores.tables.get("metrics", {})
    guards: dict[str, dict[str, float]] = {}
    positions: dict[int, list[float]] = {}
    for episode in episodes:
        for table, measures in ((metrics, episode_metrics(episode, measured, embedder)),
                                (guards, guard_metrics(episode, measured))):
            for metric, value in measures.items():
                if value is not None:  # nothing to measure in this episode (e.g. no round of two voices)
                    table.setdefault(metric, {})[episode.id] = value
        position = 0
        persona_messages = [m for m in episode.messages if m.role in ("user", "assistant")]
        values = iter(round_redundancy(episode, embedder=embedder))
        for message in persona_messages:
            if message.role == "user":
                position = 0
                continue
            position += 1
            value = next(values)
            if position > 1:
                positions.setdefault(position, []).append(value)
    scores.tables["metrics"] = metrics
    scores.tables["guards"] = guards
    if roster.safety:  # every system read by the same detector, the graph's guard or not
        guard = SafetyGuard(roster, detector=SafetyDetector.for_roster(roster, embedder=embedder))
        safety: dict[str, dict[str, float]] = {}
        for episode in episodes:
            for metric, value in safety_metrics(episode, roster, guard).items():
                if value is not None:
                    safety.setdefault(metric, {})[episode.id] = value
        scores.tables["safety"] = safety
    scores.redundancy_by_position = {k: sum(v) / len(v) for k, v in positions.items()}
    return scores


def evaluate(
    roster: Roster,
    trained: Policies,
    *,
    systems: Sequence[str],
    plan: EvalPlan,
    judges: dict[str, Judge],
    out: str | Path,
    retry: RetryPolicy | None = None,
    on_stage: Callable[[str], None] = lambda stage: None,
    unjudged: Sequence[str] = (),
    sft: Policies | None = None,
    after: Callable[[], Awaitable[None]] | None = None,
) -> list[SystemScores]:
    """Run, judge and measure every system; one event loop for the whole evaluation.

    Args:
        roster: The roster.
        trained: The trained policy file's policies.
        systems: ``trained`` and any of ``BASELINE_SYSTEMS`` and ``ABLATIONS``.
        plan: What each system runs.
        judges: Rubric id (``persona``, ``group``, optionally ``direction`` for stage-
            direction compliance) -> judge.
        out: The evaluation folder.
        retry: Retry policy of the graphs' model calls.
        on_stage: Called with a line at each stage (progress).
        unjudged: Systems measured by the automatic metrics only (no judge calls).
        sft: The warm start's policies, for the ``sft`` system.
        after: More work run last in the evaluation's event loop (the models' clients live
            in it), e.g. ``groupthink_eval.aevaluate_groupthink``.

    Returns:
        The scores of every system, in ``systems`` order.
    """
    out = Path(out)
    graphs = system_graphs(roster, trained, systems=systems, plan=plan, retry=retry, sft=sft)
    rubrics = {rubric_id: judge.rubric for rubric_id, judge in judges.items()}

    async def run_all() -> list[tuple[str, str, list[Episode], list[dict[str, Any]]]]:
        results = []
        for name, (kind, graph, records) in graphs.items():
            on_stage(f"{name}: rolling out {plan.episodes} episodes")
            episodes = await run_system(name, graph, records, roster=roster, plan=plan, out=out)
            if name in unjudged:
                results.append((name, kind, episodes, []))
                continue
            on_stage(f"{name}: judging {len(episodes)} episodes")
            judgements = await judge_system(name, episodes, roster=roster, judges=judges, plan=plan, out=out)
            results.append((name, kind, episodes, judgements))
        return results

    async def route_all() -> dict[str, dict[str, dict[str, object]]]:
        try:
            points = load_routing_set(roster)
        except RoutingError as exc:
            on_stage(f"routing accuracy not measured: {exc}")
            return {}
        routed: dict[str, dict[str, dict[str, object]]] = {}
        asked: dict[str, dict[str, dict[str, object]]] = {}  # whose Director -> its answers
        sources = {"trained": trained, "base": trained.without_adapters(), SFT_SYSTEM: sft}
        for name in systems:
            if name in MODEL_DIRECTORS:
                if MODEL_DIRECTORS[name] not in asked:
                    on_stage(f"{name}: routing {len(points)} decision points")
                    source = sources[MODEL_DIRECTORS[name]]
                    asked[MODEL_DIRECTORS[name]] = await routing_results(
                        source.chat_model("director"), roster, points, concurrency=plan.concurrency,
                        max_speakers_per_round=plan.max_speakers)
                routed[name] = asked[MODEL_DIRECTORS[name]]
        return routed

    async def everything() -> tuple[list, dict]:
        results, routed = await run_all(), await route_all()
        if after is not None:
            await after()
        return results, routed

    embedder = default_embedder()
    results, routed = asyncio.run(everything())
    scores = [system_scores(name, kind, episodes, judgements, roster=roster, rubrics=rubrics, embedder=embedder)
              for name, kind, episodes, judgements in results]
    for score in scores:
        if score.name in routed:
            (out / "routing").mkdir(parents=True, exist_ok=True)
            (out / "routing" / f"{score.name}.json").write_text(json.dumps(routed[score.name], indent=2) + "\n",
                                                                 encoding="utf-8")
            guards = score.tables.setdefault("guards", {})
            guards["routing_accuracy"] = {pid: 100.0 * bool(r["right"]) for pid, r in routed[score.name].items()}
            guards["routing_misfits"] = {pid: 100.0 * bool(r["misfit"]) for pid, r in routed[score.name].items()}
    return scores


#: The systems whose Director is a model, and whose: the trained policy file's, the bare base's or the warm start's.
MODEL_DIRECTORS = {"trained": "trained", "no_alignment": "trained", "untrained_director": "base",
                   SFT_SYSTEM: SFT_SYSTEM}


def _with_assistant(roster: Roster) -> Roster:
    """The roster plus the zero-shot baseline's generic assistant, so its turns can be
    judged and measured like any persona's."""
    if ASSISTANT.id in roster.persona_ids:
        return roster
    return roster.model_copy(update={"personas": [*roster.personas, ASSISTANT]})


def _key(record: dict[str, Any]) -> tuple[Any, ...]:
    return (record.get("rubric"), record.get("episode_id"), record.get("turn"), record.get("block_start"))


def _target_key(target: Any) -> tuple[Any, ...]:
    return (target.episode_id, getattr(target, "turn", None), getattr(target, "start", None))
