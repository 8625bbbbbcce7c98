"""Rollouts: many directed conversations with a simulated user, at once, resumable.

``collect_episodes`` runs a conversation graph over scenarios x user profiles with
bounded concurrency (the graph's async API) and appends each finished episode to a JSONL
file. Episode ids are stable (roster, seed, scenario, profile, repeat), so a rerun of the
same plan skips what the file already holds: a run killed at any moment and started
again ends with each planned episode exactly once. Episodes that fail after the graph's
own retries are written to a failures file and tried again by the next run.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import random
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import openai
from langchain_core.callbacks import BaseCallbackHandler
from langgraph.graph import StateGraph
from langgraph.graph.state import CompiledStateGraph

from mascot.rosters import Scenario, UserProfile
from mascot.training.episodes.episode import (
    Episode,
    EpisodeSource,
    TurnPolicy,
    episode_from_state,
    read_episodes,
)
from mascot.training.jsonl import (
    JsonlAppender,
    JsonlError,
    check_writable,
    exclusive,
    read_jsonl,
    rewrite_jsonl,
)
from mascot.training.retry import fatal_error, transient_error

logger = logging.getLogger(__name__)

#: Graph steps allowed per episode (LangGraph's recursion limit).
_RECURSION_LIMIT = 1000


class RolloutError(RuntimeError):
    """A rollout stopped because every further episode would fail the same way."""


@dataclass(frozen=True)
class PlannedEpisode:
    """One episode of a rollout plan: which scenario, which person, which repeat."""

    id: str
    index: int
    scenario: Scenario
    profile: UserProfile
    repeat: int


@dataclass
class RolloutStatus:
    """Progress of a rollout; the final one is its report.

    Attributes:
        planned: Episodes in the plan.
        skipped: Planned episodes the output file held before this run.
        completed: Episodes finished and written by this run.
        failed: Episodes that failed in this run (see the failures file).
        elapsed_s: Seconds since the run started.
        out: The episode file.
        failures: The failures file.
    """

    planned: int
    skipped: int
    out: Path
    failures: Path
    completed: int = 0
    failed: int = 0
    started: float = field(default_factory=time.perf_counter, repr=False)
    elapsed_s: float = 0.0

    @property
    def done(self) -> int:
        """Planned episodes now in the file."""
        return self.skipped + self.completed

    @property
    def episodes_per_s(self) -> float:
        """Throughput of this run."""
        return self.completed / self.elapsed_s if self.elapsed_s > 0 else 0.0


def episode_id(roster: str, seed: int, scenario: str, profile: str, repeat: int) -> str:
    """The stable id of a planned episode."""
    key = f"{roster}|{seed}|{scenario}|{profile}|{repeat}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def plan_episodes(
    roster: str,
    scenarios: Sequence[Scenario],
    profiles: Sequence[UserProfile],
    *,
    episodes: int | None = None,
    seed: int = 0,
) -> list[PlannedEpisode]:
    """Plan a rollout over scenarios x profiles.

    The pairs are shuffled with ``seed`` (so a short run still covers many scenarios
    and people) and repeated when more episodes than pairs are asked for.

    Args:
        roster: Roster id (part of every episode id).
        scenarios: Opening scenarios.
        profiles: User profiles for the simulator.
        episodes: Number of episodes; default one per pair.
        seed: Shuffles the plan; part of every episode id.

    Returns:
        The plan, in order.

    Raises:
        ValueError: on no scenarios, no profiles, or ``episodes`` < 1.
    """
    if not scenarios or not profiles:
        raise ValueError("a rollout needs at least one scenario and one user profile")
    pairs = [(s, p) for s in scenarios for p in profiles]
    random.Random(seed).shuffle(pairs)
    count = len(pairs) if episodes is None else episodes
    if count < 1:
        raise ValueError(f"episodes must be >= 1, got {count}")
    plan = []
    for index in range(count):
        scenario, profile = pairs[index % len(pairs)]
        repeat = index // len(pairs)
        plan.append(
            PlannedEpisode(
                id=episode_id(roster, seed, scenario.id, profile.id, repeat),
                index=index,
                scenario=scenario,
                profile=profile,
                repeat=repeat,
            )
        )
    return plan


def failures_path(out: str | Path) -> Path:
    """Where the failures of a rollout into ``out`` are recorded (``NAME.failures.jsonl``)."""
    out = Path(out)
    return out.with_name(f"{out.name.removesuffix('.jsonl')}.failures.jsonl")


async def collect_episodes(
    graph: StateGraph | CompiledStateGraph,
    scenarios: Sequence[Scenario],
    profiles: Sequence[UserProfile],
    *,
    roster: str,
    out: str | Path,
    episodes: int | None = None,
    concurrency: int = 8,
    seed: int = 0,
    failures: str | Path | None = None,
    policies: Mapping[str, TurnPolicy] | None = None,
    callbacks: Sequence[BaseCallbackHandler] = (),
    redact: Callable[[str], str] | None = None,
    on_progress: Callable[[RolloutStatus], None] | None = None,
    shard: tuple[int, int] | None = None,
) -> RolloutStatus:
    """Run a conversation graph over scenarios x profiles and append episodes to ``out``.

    Args:
        graph: A director or baseline graph built with a simulated ``user`` model
            (a ``StateGraph`` is compiled without a checkpointer). Build it with
            ``retry_policy=model_retry_policy()`` to retry server faults.
        scenarios: Opening scenarios.
        profiles: User profiles the simulator plays.
        roster: Roster id recorded in every episode.
        out: Episode file (JSONL), appended to; episodes it holds are skipped.
        episodes: Number of episodes (default: one per scenario x profile pair).
        concurrency: Episodes running at once.
        seed: Seed of the plan (and part of every episode id).
        failures: Failures file (default ``NAME.failures.jsonl`` beside ``out``).
        policies: Role -> policy, recorded in the episodes.
        callbacks: LangChain callback handlers for every run (e.g. ``JsonlTracer``).
        redact: Applied to every line written (masks secrets).
        on_progress: Called with the status after each episode ends.
        shard: ``(k, n)``: run only the planned episodes whose index is ``k`` modulo
            ``n``, as one of ``n`` processes appending to the same files. The files are
            then neither repaired first nor settled after: the process that starts the
            shards calls ``repair_tail`` before and ``settle_rollout`` after them.

    Returns:
        The final status: counts, throughput and the two file paths.

    Raises:
        ValueError: on bad arguments or an output path that cannot be written.
        RolloutError: when the server refuses in a way every episode would hit
            (authentication, unknown model); what was finished stays in ``out``.
    """
    if concurrency < 1:
        raise ValueError(f"concurrency must be >= 1, got {concurrency}")
    if shard is not None and not 0 <= shard[0] < shard[1]:
        raise ValueError(f"shard must be (k, n) with 0 <= k < n, got {shard}")
    out = check_writable(out)
    failures = check_writable(failures or failures_path(out))
    compiled = graph.compile() if isinstance(graph, StateGraph) else graph
    # One run per file: a second one would rewrite the file under the first.
    with exclusive(out) if shard is None else nullcontext():
        plan = plan_episodes(roster, scenarios, profiles, episodes=episodes, seed=seed)
        planned_ids = {p.id for p in plan}
        done = {e.id for e in read_episodes(out)} & planned_ids
        failed_before = _failure_counts(failures)
        todo = [p for p in plan if p.id not in done and (shard is None or p.index % shard[1] == shard[0])]
        status = RolloutStatus(planned=len(plan), skipped=len(done), out=out, failures=failures)
        retrying = sum(1 for p in todo if p.id in failed_before)
        logger.info(
            "rollout: %d planned, %d already in %s, %d to run (%d failed before)",
            len(plan), len(done), out, len(todo), retrying,
        )
        limit = asyncio.Semaphore(concurrency)
        stop: list[BaseException] = []
        policies = dict(policies or {})

        async def run(planned: PlannedEpisode) -> None:
            async with limit:
                if stop:
                    return
                try:
                    episode = await _run_episode(
                        compiled, planned, roster=roster, seed=seed, policies=policies, callbacks=callbacks
                    )
                except Exception as exc:  # recorded in the failures file, retried next run
                    if fatal_error(exc):
                        stop.append(exc)
                    failed_before[planned.id] = failed_before.get(planned.id, 0) + 1
                    failure_log.write(_failure(planned, exc, failed_before[planned.id]))
                    status.failed += 1
                    logger.warning("episode %s failed: %s", planned.id, _one_line(exc))
                else:
                    episode_log.write(episode.record())
                    status.completed += 1
                status.elapsed_s = time.perf_counter() - status.started
                if on_progress is not None:
                    on_progress(status)

        alone = shard is None
        with JsonlAppender(out, redact=redact, repair=alone) as episode_log, JsonlAppender(
            failures, redact=redact, repair=alone
        ) as failure_log:
            if on_progress is not None:
                on_progress(status)
            await asyncio.gather(*(run(p) for p in todo))
        status.elapsed_s = time.perf_counter() - status.started
        if alone:
            settle_rollout(out, failures, plan)
        if stop:
            raise RolloutError(
                f"stopped: the model server refused ({_one_line(stop[0])}); "
                f"{status.done} of {status.planned} episodes are in {out}"
            )
        return status


async def _run_episode(
    graph: CompiledStateGraph,
    planned: PlannedEpisode,
    *,
    roster: str,
    seed: int,
    policies: Mapping[str, TurnPolicy],
    callbacks: Sequence[BaseCallbackHandler],
) -> Episode:
    config: dict[str, Any] = {
        "configurable": {"thread_id": planned.id},
        "metadata": {
            "episode_id": planned.id,
            "roster": roster,
            "scenario_id": planned.scenario.id,
            "profile_id": planned.profile.id,
        },
        "run_name": "mascot rollout",
        "tags": ["mascot", "rollout"],
        "callbacks": list(callbacks),
        "recursion_limit": _RECURSION_LIMIT,
    }
    start = time.perf_counter()
    state = await graph.ainvoke(
        {
            "messages": [],
            "scenario": planned.scenario.model_dump(),
            "user_profile": planned.profile.model_dump(),
        },
        config,
    )
    return episode_from_state(
        state,
        id=planned.id,
        roster=roster,
        source=EpisodeSource(kind="rollout", seed=seed, repeat=planned.repeat),
        policies=policies,
        duration_s=round(time.perf_counter() - start, 3),
    )


def _failure(planned: PlannedEpisode, error: BaseException, attempts: int) -> dict[str, Any]:
    return {
        "episode_id": planned.id,
        "scenario_id": planned.scenario.id,
        "profile_id": planned.profile.id,
        "repeat": planned.repeat,
        "error": type(error).__name__,
        "reason": _one_line(error),
        "transient": transient_error(error),
        "failed_runs": attempts,
        "time": datetime.now(UTC).isoformat(timespec="seconds"),
    }


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())
    if isinstance(error, openai.APIStatusError):
        text = f"HTTP {error.status_code}: {text}"
    return f"{type(error).__name__}: {text[:300]}" if text else type(error).__name__


def _failure_counts(path: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for _, record in read_jsonl(path):
        if isinstance(record.get("episode_id"), str):
            counts[record["episode_id"]] = int(record.get("failed_runs", 1))
    return counts


def settle_rollout(out: Path, failures: Path, plan: Sequence[PlannedEpisode]) -> None:
    """Tidy a rollout's files once no process writes to them any more.

    The failures file keeps one record (the latest) per planned episode that is still
    missing, and is removed when none is; a complete rollout is rewritten in plan order.
    """
    done = {record.get("id") for _, record in read_jsonl(out)}
    _settle_failures(failures, done)
    if all(p.id in done for p in plan):
        _order_like_plan(out, plan)


def _settle_failures(path: Path, done: set[str]) -> None:
    """Keep one record per episode that is still missing (the latest); drop the rest."""
    latest: dict[str, dict[str, Any]] = {}
    lines = 0
    for _, record in read_jsonl(path):
        lines += 1
        if not isinstance(record.get("episode_id"), str):
            raise JsonlError(f"{path} is not a failures file (a record has no 'episode_id')")
        if record["episode_id"] not in done:
            latest[record["episode_id"]] = record
    if lines != len(latest):
        rewrite_jsonl(path, latest.values())
    if not latest and path.exists():
        path.unlink()


def _order_like_plan(path: Path, plan: Sequence[PlannedEpisode]) -> None:
    """Rewrite a complete rollout in plan order, so the file does not depend on which
    episode happened to finish first (records of other plans keep their place after)."""
    position = {p.id: p.index for p in plan}
    records = [record for _, record in read_jsonl(path)]
    ours = [r for r in records if r.get("id") in position]
    ordered = sorted(ours, key=lambda r: position[r["id"]])
    if ours != ordered:
        rewrite_jsonl(path, ordered + [r for r in records if r.get("id") not in position])
