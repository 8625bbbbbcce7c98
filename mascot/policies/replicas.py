"""Several servers behind one role: requests spread over them, a failing one skipped.

A policy spec may name several ``base_url`` values (replicas of the same models, e.g. one
vLLM per GPU or per machine). The role's OpenAI client then sends through a
``ReplicaTransport``: each request goes to the replica with the fewest requests in flight
(ties in turn), and a replica that refuses the connection, drops it or answers 502/503 is
set aside for ``COOL_DOWN_S`` while the same request is sent to the next one, so an episode
is not lost while another replica can answer. Only when every replica failed does the
request fail (and the client's own retries take over).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence

import httpx

logger = logging.getLogger(__name__)

#: Seconds a replica that failed is passed over (while another is up).
COOL_DOWN_S = 30.0
#: Failures that send the request to the next replica: the server is not there, or not now.
_RETRY_ELSEWHERE = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError)
_UNAVAILABLE = (502, 503)


class _Replicas:
    """The shared choice: requests in flight per replica, and when each failed last."""

    def __init__(self, urls: Sequence[str]) -> None:
        if len(urls) < 2:
            raise ValueError(f"replicas need at least two URLs, got {len(urls)}")
        self.urls = [url.rstrip("/") for url in urls]
        self.in_flight = [0] * len(self.urls)
        self.failed_at = [float("-inf")] * len(self.urls)
        self.turn = 0
        self.lock = threading.Lock()

    def order(self) -> list[int]:
        """Replicas to try, best first: up before cooling down, then fewest in flight, then in turn."""
        with self.lock:
            now = time.monotonic()
            self.turn += 1
            count = len(self.urls)
            return sorted(range(count), key=lambda i: (now - self.failed_at[i] < COOL_DOWN_S, self.in_flight[i],
                                                        (i - self.turn) % count))

    def suffix(self, request: httpx.Request) -> str:
        """The part of a request's URL after the replica's base (the client sends to the first)."""
        url = str(request.url)
        if url.startswith(self.urls[0]):
            return url[len(self.urls[0]):]
        path, base = request.url.raw_path.decode(), httpx.URL(self.urls[0]).path.rstrip("/")
        return path.removeprefix(base)

    def target(self, request: httpx.Request, index: int, suffix: str) -> httpx.Request:
        """``request`` sent to replica ``index``."""
        request.url = httpx.URL(self.urls[index] + suffix)
        request.headers["host"] = request.url.netloc.decode()
        return request

    def begin(self, index: int) -> None:
        with self.lock:
            self.in_flight[index] += 1

    def end(self, index: int, *, failed: bool) -> None:
        with self.lock:
            self.in_flight[index] -= 1
            if failed:
                self.failed_at[index] = time.monotonic()

    def failed(self, index: int, exc: Exception, *, last: bool) -> None:
        """Replica ``index`` could not be reached: set it aside; raise ``exc`` if it was the last."""
        self.end(index, failed=True)
        if last:
            raise exc
        logger.warning("replica %s failed (%s); trying the next", self.urls[index], exc)

    def answered(self, index: int, response: httpx.Response, *, last: bool) -> bool:
        """Replica ``index`` answered; whether to try the next one instead (502/503, not the last)."""
        unavailable = response.status_code in _UNAVAILABLE
        self.end(index, failed=unavailable)
        if unavailable and not last:
            logger.warning("replica %s answered %d; trying the next", self.urls[index], response.status_code)
            return True
        return False


class ReplicaTransport(httpx.BaseTransport):
    """A sync transport over several replicas (see the module)."""

    def __init__(self, urls: Sequence[str], transport: httpx.BaseTransport | None = None) -> None:
        self.replicas = _Replicas(urls)
        self.transport = transport or httpx.HTTPTransport()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        order, suffix = self.replicas.order(), self.replicas.suffix(request)
        for attempt, index in enumerate(order):
            last = attempt == len(order) - 1
            self.replicas.begin(index)
            try:
                response = self.transport.handle_request(self.replicas.target(request, index, suffix))
            except _RETRY_ELSEWHERE as exc:
                self.replicas.failed(index, exc, last=last)
                continue
            if not self.replicas.answered(index, response, last=last):
                return response
            response.close()
        raise AssertionError("unreachable: the last replica returns or raises")

    def close(self) -> None:
        self.transport.close()


class AsyncReplicaTransport(httpx.AsyncBaseTransport):
    """An async transport over several replicas (see the module)."""

    def __init__(self, urls: Sequence[str], transport: httpx.AsyncBaseTransport | None = None) -> None:
        self.replicas = _Replicas(urls)
        self.transport = transport or httpx.AsyncHTTPTransport()

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        order, suffix = self.replicas.order(), self.replicas.suffix(request)
        for attempt, index in enumerate(order):
            last = attempt == len(order) - 1
            self.replicas.begin(index)
            try:
                response = await self.transport.handle_async_request(self.replicas.target(request, index, suffix))
            except _RETRY_ELSEWHERE as exc:
                self.replicas.failed(index, exc, last=last)
                continue
            if not self.replicas.answered(index, response, last=last):
                return response
            await response.aclose()
        raise AssertionError("unreachable: the last replica returns or raises")

    async def aclose(self) -> None:
        await self.transport.aclose()
