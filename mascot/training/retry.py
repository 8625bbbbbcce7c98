"""Model-server faults: which errors are worth retrying, the graph's retry policy, and
retrying one call (with backoff that honours ``Retry-After``)."""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import httpx
import openai
from langgraph.types import RetryPolicy

logger = logging.getLogger(__name__)
T = TypeVar("T")

#: HTTP statuses a server may answer differently a moment later.
_TRANSIENT_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
#: Statuses that make every later request fail the same way (bad key, unknown model).
_FATAL_STATUS = frozenset({401, 403, 404})


def transient_error(error: BaseException) -> bool:
    """Whether ``error`` is a model-server fault that a retry may get past.

    Timeouts, refused or dropped connections, 429 and 5xx answers are transient; a bad
    request, a bad key or a bug is not.
    """
    if isinstance(error, openai.APIStatusError):
        return error.status_code in _TRANSIENT_STATUS or error.status_code >= 500
    return isinstance(
        error,
        (
            openai.APIConnectionError,  # includes openai.APITimeoutError
            httpx.TransportError,
            ConnectionError,
            TimeoutError,
            asyncio.TimeoutError,
        ),
    )


def fatal_error(error: BaseException) -> bool:
    """Whether ``error`` will fail every other request too (authentication, unknown model)."""
    return isinstance(error, openai.APIStatusError) and error.status_code in _FATAL_STATUS


def model_retry_policy(
    attempts: int = 5, *, initial_interval: float = 0.5, max_interval: float = 8.0
) -> RetryPolicy:
    """A LangGraph retry policy for nodes that call model servers.

    Transient faults (``transient_error``) are retried with exponential backoff
    (doubling from ``initial_interval`` up to ``max_interval`` seconds) and random
    jitter; anything else fails at once.

    Args:
        attempts: Tries per model call, the first included.
        initial_interval: Seconds before the first retry.
        max_interval: Longest wait between tries.

    Returns:
        The policy, for ``create_director_graph(retry_policy=...)``.

    Raises:
        ValueError: if ``attempts`` < 1 or an interval is negative.
    """
    if attempts < 1:
        raise ValueError(f"attempts must be >= 1, got {attempts}")
    if initial_interval < 0 or max_interval < initial_interval:
        raise ValueError(
            f"need 0 <= initial_interval <= max_interval, got {initial_interval} and {max_interval}"
        )
    return RetryPolicy(
        initial_interval=initial_interval,
        backoff_factor=2.0,
        max_interval=max_interval,
        max_attempts=attempts,
        jitter=True,
        retry_on=transient_error,
    )



def retry_wait(error: BaseException, attempt: int, *, initial_interval: float = 0.5,
               max_interval: float = 8.0) -> float:
    """Seconds to wait before retry number ``attempt`` (1-based) after ``error``.

    Exponential backoff with full jitter, but never less than a server's ``Retry-After``
    (seconds, at most 60) when the error carries one.
    """
    wait = random.uniform(0, min(max_interval, initial_interval * 2 ** (attempt - 1)))
    response = getattr(error, "response", None)
    header = response.headers.get("retry-after") if isinstance(response, httpx.Response) else None
    try:
        asked = float(header) if header is not None else 0.0
    except ValueError:
        asked = 0.0  # an HTTP date: fall back to backoff
    return max(wait, min(asked, 60.0))


async def aretry_transient(call: Callable[[], Awaitable[T]], attempts: int, *, initial_interval: float = 0.5,
                           max_interval: float = 8.0) -> T:
    """Await ``call()``, calling it again on a transient fault, ``attempts`` tries in all.

    Raises:
        Exception: the last fault when every try failed, or any other error at once.
    """
    for attempt in range(1, attempts + 1):
        try:
            return await call()
        except Exception as exc:
            if attempt == attempts or not transient_error(exc):
                raise
            wait = retry_wait(exc, attempt, initial_interval=initial_interval, max_interval=max_interval)
            logger.info("transient fault (%s), try %d/%d again in %.2fs", type(exc).__name__, attempt + 1,
                        attempts, wait)
            await asyncio.sleep(wait)
    raise AssertionError("unreachable")


def retry_transient(call: Callable[[], T], attempts: int, *, initial_interval: float = 0.5,
                    max_interval: float = 8.0) -> T:
    """``call()``, called again on a transient fault; see ``aretry_transient``."""
    for attempt in range(1, attempts + 1):
        try:
            return call()
        except Exception as exc:
            if attempt == attempts or not transient_error(exc):
                raise
            time.sleep(retry_wait(exc, attempt, initial_interval=initial_interval, max_interval=max_interval))
    raise AssertionError("unreachable")
