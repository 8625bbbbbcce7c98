"""Micro-batching of concurrent calls: callers queue, and one of them runs a batch for all.

A call that finds the model idle runs at once; calls that arrive while a batch runs wait
in a queue, and the next batch takes the oldest of them together with every queued call
that fits, up to ``max_batch`` rows. Under load (the previous batch had several rows) a
batch first waits up to ``batch_window_s`` for as many rows to queue, since the callers
just served are usually about to ask again. There is no scheduler thread: the caller of
the oldest queued call (the leader) runs the batch in its own thread and then passes the
lead on.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

P = TypeVar("P")


@dataclass(eq=False)
class Job(Generic[P]):
    """One call, queued until a batch serves it.

    Attributes:
        payload: What the batch function needs to serve it.
        rows: Rows it adds to a batch.
        outcome: Its result, or the exception its caller raises; ``None`` while queued.
    """

    payload: P
    rows: int
    outcome: Any = None


class MicroBatcher(Generic[P]):
    """Queues concurrent calls and serves them in batches, one batch at a time.

    Args:
        run: Serves a batch: takes its jobs (oldest first) and returns one outcome per
            job, a result or an exception for that job's caller alone; if it raises, every
            caller of the batch gets that exception.
        lock: Held while a batch runs (the model's lock, which other users of the model
            take too: adapter changes and each step of a stream).
        max_batch: Most rows in one batch; 1 serves calls one at a time.
        batch_window_s: Longest wait for more calls to join a batch under load.

    Raises:
        ValueError: if ``max_batch`` < 1 or ``batch_window_s`` < 0.
    """

    def __init__(
        self,
        run: Callable[[list[Job[P]]], list[Any]],
        lock: AbstractContextManager[Any],
        *,
        max_batch: int = 8,
        batch_window_s: float = 0.005,
    ) -> None:
        if max_batch < 1:
            raise ValueError(f"max_batch must be at least 1 (1 turns batching off), got {max_batch}")
        if batch_window_s < 0:
            raise ValueError(f"batch_window_s must be 0 or more seconds, got {batch_window_s}")
        self.run = run
        self.lock = lock
        self.max_batch = max_batch
        self.batch_window_s = batch_window_s
        self._queue_changed = threading.Condition()  # guards the queue, the leader, outcomes
        self._queue: list[Job[P]] = []
        self._leader: Job[P] | None = None  # the queued job whose caller runs the next batch
        self._last_rows = 1

    def submit(self, payload: P, rows: int) -> Any:
        """Queue a call and wait for its batch.

        Args:
            payload: Passed to ``run`` inside its ``Job``.
            rows: Rows the call adds to a batch.

        Returns:
            The call's outcome from ``run``.

        Raises:
            BaseException: the exception ``run`` gave this call (or raised for its batch).
        """
        job = Job(payload=payload, rows=rows)
        with self._queue_changed:
            self._queue.append(job)
            if self._leader is None:  # the model is idle: start at once
                self._leader = job
            self._queue_changed.notify_all()
            try:
                while job.outcome is None and self._leader is not job:
                    self._queue_changed.wait()
            except BaseException:  # interrupted while queued: leave, passing the lead on
                self._withdraw(job)
                raise
        if job.outcome is None:
            self._lead(job)
        if isinstance(job.outcome, BaseException):
            raise job.outcome
        return job.outcome

    def _lead(self, head: Job[P]) -> None:
        """Run the batch of ``head``, the oldest queued job, then pass the lead on."""
        try:
            with self.lock:
                self._serve(self._take_batch(head))
        finally:
            with self._queue_changed:
                self._withdraw(head)

    def _withdraw(self, job: Job[P]) -> None:
        """Take ``job`` out of the queue if it is still there and, if it held the lead, pass
        the lead to the oldest queued job (call with ``_queue_changed`` held)."""
        if job in self._queue:
            self._queue.remove(job)
        if self._leader is job:
            self._leader = self._queue[0] if self._queue else None
        self._queue_changed.notify_all()

    def _take_batch(self, head: Job[P]) -> list[Job[P]]:
        """``head`` and the queued jobs that fit with it, oldest first; under load, first
        waits up to ``batch_window_s`` for as many rows as the previous batch had."""
        with self._queue_changed:
            deadline = time.monotonic() + self.batch_window_s
            target = min(self.max_batch, self._last_rows)
            while True:
                batch = self._mates(head)
                rows = sum(job.rows for job in batch)
                left = deadline - time.monotonic()
                if rows >= target or left <= 0:
                    break
                self._queue_changed.wait(left)
            for job in batch:
                self._queue.remove(job)
            self._last_rows = rows
        return batch

    def _mates(self, head: Job[P]) -> list[Job[P]]:
        """``head`` and, oldest first, the queued jobs that fit beside it."""
        batch, rows = [head], head.rows
        for job in self._queue:
            if job is not head and rows + job.rows <= self.max_batch:
                batch.append(job)
                rows += job.rows
        return batch

    def _serve(self, batch: list[Job[P]]) -> None:
        """Run ``batch`` and hand each caller its outcome."""
        # what the callers get if a KeyboardInterrupt stops the batch: none may hang
        outcomes: list[Any] = [RuntimeError("the batch was interrupted")] * len(batch)
        try:
            outcomes = self.run(batch)
        except Exception as exc:  # raised again in the thread of every caller in the batch
            outcomes = [exc] * len(batch)
        finally:
            with self._queue_changed:
                for job, outcome in zip(batch, outcomes, strict=False):
                    job.outcome = outcome
                self._queue_changed.notify_all()
