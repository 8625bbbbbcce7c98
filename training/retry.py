"""Model-server faults: which errors are worth retrying, and the graph's retry policy."""

from __future__ import annotations

import asyncio

import httpx
import openai
from langgraph.types import RetryPolicy

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
