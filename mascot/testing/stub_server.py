"""A fast OpenAI-compatible stub chat server that can be slow or misbehave on purpose.

Tests and benchmarks run rollouts against it: it answers late (``latency_s``), fails (HTTP
500, or 429 with ``Retry-After``), stalls past the client's timeout, drops connections, cuts
a reply off halfway (truncated JSON), or leaks the caller's ``Authorization`` header
(``echo_auth``). The Director (or any request with
``response_format``) gets a JSON stage direction naming a speaker its prompt allows; everyone
else gets a short sentence. Stdlib only, HTTP/1.1 keep-alive; ``python -m mascot.testing.stub_server``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import hashlib
import http.client
import ipaddress
import json
import logging
import random
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any

log = logging.getLogger(__name__)

FAULTS = ("500", "429", "timeout", "disconnect", "truncated")
MODEL = "stub"
_VOICES = re.compile(r"Voices who may speak now:\n((?:- [^\n]*\n?)+)")
_VOICE_ID = re.compile(r"^- ([a-z][a-z0-9_]*): ", re.MULTILINE)
_HAND_BACK = '"user" to hand the turn back'

_SENTENCES = (
    "That sounds really hard, and it makes sense that you feel this way.",
    "I wonder whether the evidence actually supports that conclusion.",
    "You have handled difficult things before, and you can learn from this one too.",
    "One small step you could take today is to write down what went wrong.",
    "It is okay to feel disappointed; that shows how much this matters to you.",
    "Is there another way to look at what happened?",
    "What would you tell a friend who was in your place right now?",
    "Let us break this into parts and tackle the easiest one first.",
)
_ACTIONS = ("validate the feeling", "question the assumption", "suggest a next step", "ask")
_TONES = ("warm", "curious", "direct", "encouraging")
_Reply = tuple[int, bytes, dict[str, str]]  # status, body, extra headers
_CUT = "X-Stub-Cut"  # internal: the reply's full length, when it is to be cut off


@dataclass(frozen=True)
class StubConfig:
    """How the stub server misbehaves.

    Attributes:
        latency_s: Seconds every request waits before it is answered.
        fail_rate: Probability in [0, 1] that a request gets one of ``faults``.
        faults: Faults to draw from: "500", "429" (with ``Retry-After: retry_after_s``),
            "timeout" (stall ``stall_s`` first), "disconnect" (close without answering),
            "truncated" (announce the whole reply, send half of it, close).
        stall_s: Seconds a "timeout" fault stalls before answering normally.
        retry_after_s: Seconds a 429 asks the client to wait (``Retry-After``).
        seed: Seed of the random draws of faults.
        echo_auth: Leak the request's Authorization header value into every reply.
    """

    latency_s: float = 0.0
    fail_rate: float = 0.0
    faults: tuple[str, ...] = FAULTS
    stall_s: float = 30.0
    retry_after_s: float = 0.0
    seed: int = 0
    echo_auth: bool = False

    def __post_init__(self) -> None:
        if min(self.latency_s, self.stall_s, self.retry_after_s) < 0 or not 0.0 <= self.fail_rate <= 1.0:
            raise ValueError(f"latency_s={self.latency_s!r}, stall_s={self.stall_s!r} and "
                             f"retry_after_s={self.retry_after_s!r} must be >= 0, "
                             f"fail_rate={self.fail_rate!r} in [0, 1]")
        bad = [f for f in self.faults if f not in FAULTS]
        if bad or not self.faults:
            raise ValueError(f"faults={self.faults!r} has unknown or no faults {bad!r}; "
                             f"valid faults are {', '.join(FAULTS)}")


#: How mascot's rubric judge prompt starts; such requests get rubric scores.
_JUDGE_OPENING = "You are a strict, impartial judge"
#: A moderation request in Llama Guard's format (``mascot.graphs.moderation``): the stub
#: answers ``unsafe`` and the first category when the last person message has one of
#: ``_UNSAFE_WORDS``, else ``safe``.
_MODERATION_OPENING = "Task: Check if there is unsafe content"
_UNSAFE_WORDS = ("end it", "kill", "die", "hurt")
_EXAMPLE_SCORES = re.compile(r'"scores": (\{[^{}]*\})')


def _judgement(body: dict[str, Any], target: str, leak: str) -> str:
    """Rubric scores 1-5 for every criterion the request asks for, drawn from a hash of
    the judged text: the same text always gets the same scores, different texts differ."""
    schema = ((body.get("response_format") or {}).get("json_schema") or {}).get("schema") or {}
    criteria = list(((schema.get("properties") or {}).get("scores") or {}).get("properties") or {})
    if not criteria:
        example = _EXAMPLE_SCORES.search(target)
        criteria = list(json.loads(example.group(1))) if example else []
    digest = hashlib.sha256(target.encode()).digest()
    scores = {criterion: 1 + digest[i % len(digest)] % 5 for i, criterion in enumerate(criteria)}
    return json.dumps({"rationale": "stub judgement" + leak, "scores": scores})


def _moderation(prompt: str) -> str:
    """The stub moderator's answer to a Llama Guard prompt."""
    said = [line[len("User: "):] for line in prompt.splitlines() if line.startswith("User: ")]
    unsafe = bool(said) and any(word in said[-1].lower() for word in _UNSAFE_WORDS)
    return "unsafe\nS1" if unsafe else "safe"


def _allowed_speakers(body: dict[str, Any], system: str) -> list[str]:
    """The speakers a direction may name: the ``enum`` of a JSON-schema request (as a
    server with structured outputs enforces it), else the voices the prompt offers."""
    response_format = body.get("response_format") or {}
    schema = (response_format.get("json_schema") or {}).get("schema") or {}
    enum = ((schema.get("properties") or {}).get("speaker") or {}).get("enum")
    if isinstance(enum, list) and enum:
        return [str(item) for item in enum]
    found = _VOICES.search(system)
    ids = _VOICE_ID.findall(found.group(1)) if found else []
    return ids + (["user"] if _HAND_BACK in system else [])


class _Stub:
    """One server's state: the config, the fault draws and the counters."""

    def __init__(self, config: StubConfig) -> None:
        self.config = config
        self.rng = random.Random(config.seed)
        self.replies = 0
        self.counts: dict[str, Any] = {"requests": 0, "ok": 0, "errors": 0,
                                       "faults": {f: 0 for f in config.faults}}

    def reply_text(self, body: dict[str, Any], auth: str) -> str:
        """The canned reply to a chat request, with the leaked key when ``echo_auth``."""
        n, self.replies = self.replies, self.replies + 1
        leak = f" {auth}" if self.config.echo_auth else ""
        messages = body.get("messages") or []
        system = [_text(m.get("content")) for m in messages if m.get("role") == "system"]
        if system and system[0].startswith(_JUDGE_OPENING):
            return _judgement(body, _text(messages[-1].get("content")), leak)
        last = _text(messages[-1].get("content")) if messages else ""
        if last.startswith(_MODERATION_OPENING):
            return _moderation(last)
        if "response_format" in body or (system and system[0].startswith("You are the Director")):
            ids = _allowed_speakers(body, "\n".join(system))
            speaker = ids[n % len(ids)] if ids else "user"
            action = _ACTIONS[n % len(_ACTIONS)] + leak
            return json.dumps({"speaker": speaker, "action": action, "tone": _TONES[n % 4]})
        return _SENTENCES[n % len(_SENTENCES)] + leak

    async def respond(self, method: str, path: str, headers: dict[str, str],
                      raw: bytes) -> _Reply | None:
        """Answer one request: (status, body, extra headers), or None to drop the connection."""
        if method == "GET" and path == "/stats":
            return 200, json.dumps(self.counts).encode(), {}
        self.counts["requests"] += 1
        if self.config.latency_s:
            await asyncio.sleep(self.config.latency_s)
        fault = None
        if self.config.fail_rate and self.rng.random() < self.config.fail_rate:
            fault = self.rng.choice(self.config.faults)
            self.counts["faults"][fault] += 1
        if fault == "disconnect":
            return None
        if fault == "500":
            return _error(500, "stub server error (injected)", "server_error")
        if fault == "429":
            return _error(429, "rate limited (injected)", "rate_limit",
                          **{"Retry-After": f"{self.config.retry_after_s:g}"})
        if fault == "timeout":
            await asyncio.sleep(self.config.stall_s)
        if method == "GET" and path == "/v1/models":
            model = {"id": MODEL, "object": "model", "created": 0, "owned_by": "mascot"}
            result = 200, json.dumps({"object": "list", "data": [model]}).encode(), {}
        elif method == "POST" and path == "/v1/chat/completions":
            result = self.chat(raw, headers.get("authorization", ""))
        else:
            result = _error(404, f"no route {method} {path}", "not_found")
        if fault is None:
            self.counts["ok" if result[0] == 200 else "errors"] += 1
        if fault == "truncated":
            status, data, extra = result
            return status, data, {**extra, _CUT: str(len(data))}
        return result

    def chat(self, raw: bytes, auth: str) -> _Reply:
        """A chat completion, whole or as server-sent events."""
        try:
            body = json.loads(raw)
            messages = body["messages"]
            prompt_tokens = sum(len(_text(m.get("content")).split()) for m in messages)
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            return _error(400, f"bad chat request: {exc!r}", "invalid_request_error")
        content = self.reply_text(body, auth)
        words = content.split()
        usage = {"prompt_tokens": prompt_tokens, "completion_tokens": len(words),
                 "total_tokens": prompt_tokens + len(words)}
        head = {"id": f"chatcmpl-stub{self.replies}", "created": int(time.time()),
                "model": body.get("model", MODEL)}
        if not body.get("stream"):
            choice = {"index": 0, "message": {"role": "assistant", "content": content},
                      "finish_reason": "stop"}
            reply = {**head, "object": "chat.completion", "choices": [choice], "usage": usage}
            return 200, json.dumps(reply).encode(), {}
        head["object"] = "chat.completion.chunk"
        deltas = [{"role": "assistant", "content": ""}]
        deltas += [{"content": w if i == 0 else " " + w} for i, w in enumerate(words)]
        chunks = [{**head, "choices": [{"index": 0, "delta": d, "finish_reason": None}]}
                  for d in deltas]
        chunks.append({**head, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        if (body.get("stream_options") or {}).get("include_usage"):
            chunks.append({**head, "choices": [], "usage": usage})
        events = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks) + "data: [DONE]\n\n"
        return 200, events.encode(), {"Content-Type": "text/event-stream"}

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Serve requests on one keep-alive connection until the client closes it."""
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except asyncio.IncompleteReadError:
                    return  # the client closed the connection between requests
                lines = head.decode("latin-1").split("\r\n")
                method, target, version = lines[0].split(" ", 2)
                headers = {k.strip().lower(): v.strip() for k, _, v in
                           (line.partition(":") for line in lines[1:] if line)}
                if "transfer-encoding" in headers:
                    raise ValueError("chunked request bodies are not supported")
                raw = await reader.readexactly(int(headers.get("content-length", 0)))
                result = await self.respond(method, target.split("?", 1)[0], headers, raw)
                if result is None:
                    return
                status, data, extra = result
                cut = _CUT in extra
                if cut:  # announce the whole body, send half of it, hang up
                    data = data[:len(data) // 2]
                    extra = {k: v for k, v in extra.items() if k != _CUT}
                    extra["Content-Length"] = result[2][_CUT]
                close = cut or headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
                extra = {"Content-Type": "application/json", "Content-Length": str(len(data)),
                         "Connection": "close" if close else "keep-alive", **extra}
                lines = [f"HTTP/1.1 {status} {HTTPStatus(status).phrase}"]
                lines += [f"{k}: {v}" for k, v in extra.items()]
                writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
                await writer.drain()
                if close:
                    return
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            log.debug("stub server lost a connection: %r", exc)
        except (ValueError, asyncio.LimitOverrunError) as exc:
            log.warning("stub server dropped a malformed request: %r", exc)
        finally:
            writer.close()


def _text(content: Any) -> str:
    """The text of a message content: a string or a list of OpenAI content parts."""
    if isinstance(content, list):
        return " ".join(p.get("text", "") for p in content if isinstance(p, dict))
    return content or ""


def _error(status: int, message: str, kind: str, **headers: str) -> _Reply:
    error = {"message": message, "type": kind, "param": None, "code": kind}
    return status, json.dumps({"error": error}).encode(), headers


def _url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}/v1" if ":" in host else f"http://{host}:{port}/v1"


def is_loopback(host: str) -> bool:
    """Whether ``host`` is a loopback address (127.x, ::1) or ``localhost``."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


async def serve(config: StubConfig, host: str = "127.0.0.1", port: int = 0,
                ready: Callable[[int], None] | None = None) -> None:
    """Serve the stub until cancelled.

    Args:
        config: How the server misbehaves.
        host: Address to listen on.
        port: Port to listen on; 0 picks a free one.
        ready: Called with the bound port once the server listens.
    """
    stub = _Stub(config)
    tasks: set[asyncio.Task[None]] = set()

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        tasks.add(task)
        try:
            await stub.handle(reader, writer)
        except asyncio.CancelledError:  # Python 3.11's start_server logs a cancelled handler
            log.debug("stub server shut a connection down")
        finally:
            tasks.discard(task)

    server = await asyncio.start_server(connection, host, port, backlog=1024)
    bound = server.sockets[0].getsockname()[1]
    log.info("stub server listening on %s:%d with %s", host, bound, config)
    if ready is not None:
        ready(bound)
    try:
        await asyncio.Future()  # until cancelled
    finally:
        server.close()
        for task in list(tasks):  # stalled handlers would otherwise outlive the server
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class StubServer:
    """A stub server running in a daemon thread with its own event loop."""

    def __init__(self, config: StubConfig, host: str, port: int) -> None:
        self.host, self.port = host, 0
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._error: OSError | None = None
        self._thread = threading.Thread(target=self._run, args=(config, port), daemon=True,
                                        name="mascot-stub-server")
        self._thread.start()
        self._started.wait()
        if self._error is not None:
            raise self._error

    def _run(self, config: StubConfig, port: int) -> None:
        def ready(bound: int) -> None:
            self.port = bound
            self._started.set()

        self._task = self._loop.create_task(serve(config, self.host, port, ready))
        try:
            self._loop.run_until_complete(self._task)
        except asyncio.CancelledError:
            log.debug("stub server on port %d stopped", self.port)
        except OSError as exc:  # re-raised by __init__ in the caller's thread
            self._error = exc
        finally:
            self._started.set()
            self._loop.close()

    @property
    def url(self) -> str:
        """Base URL for OpenAI clients, e.g. ``http://127.0.0.1:PORT/v1``."""
        return _url(self.host, self.port)

    def stats(self) -> dict[str, Any]:
        """Counters: ``requests``, ``ok``, ``errors`` (4xx) and ``faults`` by kind."""
        conn = http.client.HTTPConnection(self.host, self.port, timeout=10)
        try:
            conn.request("GET", "/stats")
            return json.loads(conn.getresponse().read())
        finally:
            conn.close()

    def close(self) -> None:
        """Stop the server and wait for its thread (idempotent)."""
        if self._task is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self._task.cancel)
        self._thread.join(timeout=10)

    def __enter__(self) -> StubServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start_stub_server(config: StubConfig | None = None, *, host: str = "127.0.0.1",
                      port: int = 0) -> StubServer:
    """Start a stub server in a background thread; returns once it listens.

    Args:
        config: How the server misbehaves; the default answers at once and never fails.
        host: Loopback address to listen on.
        port: Port to listen on; 0 picks a free one.

    Returns:
        The running server (a context manager; ``close()`` stops it).

    Raises:
        ValueError: If ``host`` is not a loopback address.
    """
    if not is_loopback(host):
        raise ValueError(f"host={host!r} is not loopback; use 127.x, ::1 or localhost")
    return StubServer(config or StubConfig(), host, port)


def main(argv: list[str] | None = None) -> None:
    """Run the stub server from the command line until SIGTERM or SIGINT."""
    parser = argparse.ArgumentParser(prog="python -m mascot.testing.stub_server", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--latency", type=float, default=0.0, help="seconds per request")
    parser.add_argument("--fail-rate", type=float, default=0.0, help="probability of a fault")
    parser.add_argument("--faults", default=",".join(FAULTS), help="comma-separated faults")
    parser.add_argument("--stall", type=float, default=30.0, help="seconds a timeout stalls")
    parser.add_argument("--retry-after", type=float, default=0.0, help="Retry-After of a 429, seconds")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--echo-auth", action="store_true", help="leak Authorization header")
    args = parser.parse_args(argv)
    if not is_loopback(args.host):
        print(f"stub_server: error: refusing non-loopback --host {args.host!r} "
              "(use 127.x, ::1 or localhost)", file=sys.stderr)
        sys.exit(2)
    try:
        config = StubConfig(args.latency, args.fail_rate, tuple(args.faults.split(",")),
                            args.stall, args.retry_after, args.seed, args.echo_auth)
    except ValueError as exc:
        parser.error(str(exc))

    def ready(port: int) -> None:
        print(f"stub server at {_url(args.host, port)}", flush=True)

    async def run() -> None:
        task = asyncio.create_task(serve(config, args.host, args.port, ready))
        for sig in (signal.SIGTERM, signal.SIGINT):
            asyncio.get_running_loop().add_signal_handler(sig, task.cancel)
        with contextlib.suppress(asyncio.CancelledError):  # cancelled is how it stops
            await task

    asyncio.run(run())


if __name__ == "__main__":
    main()
