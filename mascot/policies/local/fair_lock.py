"""A first-come, first-served lock: the model's lock, taken per batch and per stream token.

``threading.Lock`` hands itself to whichever thread asks first once it is free, and the
thread that just released it usually asks again before a waiter has even woken up. A
stream takes the model's lock once per token, so under a plain lock a fast reader could
keep a waiting batch out for the whole reply. Here waiters are served in the order they
asked: a batch that queued during a stream's step runs before the stream's next step.
"""

from __future__ import annotations

import threading
from collections import deque
from types import TracebackType


class FairLock:
    """A non-reentrant lock that waiters get in the order they called ``acquire``."""

    def __init__(self) -> None:
        self._changed = threading.Condition(threading.Lock())  # guards _held and _waiting
        self._waiting: deque[object] = deque()
        self._held = False

    def acquire(self) -> None:
        """Wait for every earlier caller to have held and released the lock, then take it."""
        ticket = object()
        with self._changed:
            self._waiting.append(ticket)
            try:
                while self._held or self._waiting[0] is not ticket:
                    self._changed.wait()
            except BaseException:  # interrupted while waiting: step out of the line
                self._waiting.remove(ticket)
                self._changed.notify_all()
                raise
            self._waiting.popleft()
            self._held = True

    def release(self) -> None:
        """Let the longest waiter take the lock.

        Raises:
            RuntimeError: if the lock is not held.
        """
        with self._changed:
            if not self._held:
                raise RuntimeError("release of a FairLock that is not held")
            self._held = False
            self._changed.notify_all()

    def locked(self) -> bool:
        """Whether some thread holds the lock."""
        return self._held

    def __enter__(self) -> FairLock:
        self.acquire()
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None,
                 trace: TracebackType | None) -> None:
        self.release()
