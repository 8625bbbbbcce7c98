"""Several ``mascot rollout`` processes on one plan, for servers faster than one CPU core.

One process spends a few milliseconds of CPU per model call in the client stack
(LangGraph, LangChain, the OpenAI SDK, HTTP), so against a fast server at high
concurrency a rollout is bound by one core. ``run_workers`` starts ``n`` processes that
each take every n-th planned episode and append to the same files (each record is one
``write`` on a file opened for appending, so lines never mix), follows their progress by
reading what they append, and settles the files once all have ended.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from mascot.cli.child import mascot_command
from mascot.training.episodes.rollout import PlannedEpisode, RolloutStatus, settle_rollout
from mascot.training.jsonl import repair_tail

_POLL_S = 0.25
#: Exit code of a worker whose shard ended with episodes missing (recorded as failures);
#: any other non-zero code means the worker itself failed.
EPISODES_MISSING = 3


@dataclass
class _Tail:
    """Whole lines appended to a file since it was first looked at."""

    path: Path
    offset: int = field(init=False)
    buffer: bytes = b""

    def __post_init__(self) -> None:
        self.offset = self.path.stat().st_size if self.path.exists() else 0

    def new_lines(self) -> list[bytes]:
        if not self.path.exists():
            return []
        with self.path.open("rb") as handle:
            handle.seek(self.offset)
            data = handle.read()
        self.offset += len(data)
        *lines, self.buffer = (self.buffer + data).split(b"\n")
        return lines


@dataclass
class WorkerFailure:
    """A worker process that stopped with an error (exit code 2 or a crash)."""

    shard: int
    returncode: int
    message: str


def run_workers(
    argv: Sequence[str],
    *,
    workers: int,
    concurrency: int,
    plan: Sequence[PlannedEpisode],
    status: RolloutStatus,
    trace: Path | None,
    on_progress: Callable[[RolloutStatus], None],
) -> list[WorkerFailure]:
    """Run a rollout as ``workers`` processes of ``mascot rollout ... --shard k/n``.

    Args:
        argv: The command line of the whole rollout (``mascot`` arguments).
        workers: Number of processes.
        concurrency: Episodes at once over all processes (split between them).
        plan: The rollout plan (to count progress).
        status: Status with ``planned``, ``skipped`` and the two paths; updated in place.
        trace: The trace file, if any (repaired before the workers append to it).
        on_progress: Called with ``status`` as episodes end.

    Returns:
        The workers that failed; empty when every worker ran to its end.
    """
    for path in (status.out, status.failures, trace):
        if path is not None:
            repair_tail(path)
    planned = {p.id for p in plan}
    episodes, failures = _Tail(status.out), _Tail(status.failures)
    logs = [tempfile.TemporaryFile() for _ in range(workers)]
    processes = []
    for shard, log in enumerate(logs):
        share = concurrency // workers + (shard < concurrency % workers)
        command = mascot_command([*argv, "--workers", "1", "--concurrency", str(max(1, share)),
                                  "--shard", f"{shard}/{workers}"])
        processes.append(subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log))
    previous = signal.signal(signal.SIGTERM, _interrupt)
    try:
        while True:
            running = any(p.poll() is None for p in processes)
            status.completed += sum(1 for line in episodes.new_lines() if _id(line, "id") in planned)
            status.failed += sum(1 for line in failures.new_lines() if _id(line, "episode_id") in planned)
            status.elapsed_s = time.perf_counter() - status.started
            on_progress(status)
            if not running:
                break
            time.sleep(_POLL_S)
    except BaseException:
        for process in processes:
            process.terminate()
        for process in processes:
            process.wait()
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
    settle_rollout(status.out, status.failures, plan)
    failed = []
    for shard, (process, log) in enumerate(zip(processes, logs, strict=True)):
        if process.returncode not in (0, EPISODES_MISSING):
            log.seek(0)
            lines = log.read().decode("utf-8", "replace").strip().splitlines()
            failed.append(WorkerFailure(shard, process.returncode, lines[-1] if lines else "no output"))
        log.close()
    return failed


def end_with_parent() -> None:
    """In a worker: exit as soon as the parent process is gone (killed, even by SIGKILL),
    so that no orphan keeps appending while a rerun starts."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(_POLL_S)
        os._exit(1)  # a torn last line, if any, is repaired by the next run

    threading.Thread(target=watch, daemon=True, name="parent-watch").start()


def _interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt  # the run loop stops the workers before it lets go


def _id(line: bytes, key: str) -> str | None:
    try:
        record = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None  # a line another reader will report; progress only counts whole records
    return record.get(key) if isinstance(record, dict) else None
