"""Streamed replies of the local backend and server: real token counts in the usage chunk,
a stream that lets batches run between its tokens (the model's first-come-first-served
lock), and a stream whose adapter goes away."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from pathlib import Path

import openai
import pytest
from http_app import serve_app

from mascot.policies.local import LocalBackend
from mascot.policies.local.fair_lock import FairLock
from mascot.policies.local.server import create_app

CONVERSATION = [{"role": "user", "content": "Tell me about your week in detail."}]




@pytest.fixture(scope="module")
def backend(tiny_model: Path) -> LocalBackend:
    return LocalBackend.load(str(tiny_model), adapters={"anchor": tiny_model / "adapters" / "anchor"})


@pytest.fixture(scope="module")
def server(backend: LocalBackend) -> Iterator[str]:
    with serve_app(create_app(backend, served_name="tiny")) as url:
        yield url


@pytest.mark.parametrize("request_fields", [
    {"model": "tiny", "temperature": 1.0, "seed": 3},
    {"model": "anchor", "temperature": 0.8, "top_k": 20, "seed": 11},
    {"model": "tiny", "temperature": 0},
    {"model": "tiny", "temperature": 1.0, "seed": 5, "stop": ["e"]},
], ids=["seeded", "adapter", "greedy", "stop"])
def test_streamed_usage_is_what_the_whole_reply_reports(server: str, request_fields: dict) -> None:
    client = openai.OpenAI(base_url=server, api_key="unused", max_retries=0)
    top_k = request_fields.pop("top_k", None)
    body = {"messages": [{"role": "user", "content": "Tell me about your week."}], "max_tokens": 16,
            "extra_body": {"top_k": top_k} if top_k else None, **request_fields}
    whole = client.chat.completions.create(**body)
    chunks = list(client.chat.completions.create(**body, stream=True, stream_options={"include_usage": True}))
    usage = chunks[-1].usage
    assert usage is not None and not chunks[-1].choices
    assert usage.prompt_tokens == whole.usage.prompt_tokens > 0
    assert usage.completion_tokens == whole.usage.completion_tokens <= 16
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finish == [whole.choices[0].finish_reason]


def test_a_stream_counts_its_tokens_as_generate_does(backend: LocalBackend) -> None:
    for settings in ({"temperature": 1.0, "seed": 2}, {"temperature": 0}):
        whole = backend.generate([CONVERSATION], max_new_tokens=12, **settings)[0]
        stream = backend.stream(CONVERSATION, max_new_tokens=12, **settings)
        assert stream.prompt_tokens == whole.prompt_tokens and stream.completion_tokens == 0
        assert "".join(stream) == whole.text
        assert stream.completion_tokens == whole.completion_tokens <= 12


def test_a_batch_runs_while_a_slow_reader_streams(backend: LocalBackend) -> None:
    steps = 40
    assert backend.generate([CONVERSATION], temperature=0, max_new_tokens=steps)[0].completion_tokens == steps
    # every forward pass (a stream's token or a batch's) takes 20 ms, so the stream's
    # decoding takes about 0.8 s after its first piece
    slow = backend.model.get_input_embeddings().register_forward_pre_hook(lambda module, args: time.sleep(0.02))
    finished: dict[str, float] = {}
    try:
        stream = backend.stream(CONVERSATION, temperature=0, max_new_tokens=steps)
        first = next(iter(stream))

        def read_slowly() -> None:
            time.sleep(0.3)  # a slow reader: one piece, then nothing for a while
            rest = "".join(stream)
            finished["stream"] = time.monotonic()
            finished["text"] = first + rest  # type: ignore[assignment]

        reader = threading.Thread(target=read_slowly)
        reader.start()
        time.sleep(0.05)
        reply = backend.generate([[{"role": "user", "content": "hi"}]], temperature=0, max_new_tokens=3)[0]
        finished["generate"] = time.monotonic()
        reader.join(timeout=60)
    finally:
        slow.remove()
    assert reply.completion_tokens == 3
    assert finished["generate"] < finished["stream"]
    assert finished["text"] == backend.generate([CONVERSATION], temperature=0, max_new_tokens=steps)[0].text


def test_batches_get_turns_while_a_fast_reader_streams(backend: LocalBackend) -> None:
    steps = 40
    slow = backend.model.get_input_embeddings().register_forward_pre_hook(lambda module, args: time.sleep(0.01))
    finished: dict[str, float] = {}
    try:
        stream = backend.stream(CONVERSATION, temperature=0, max_new_tokens=steps)
        next(iter(stream))

        def read_all() -> None:  # a reader that asks for the next piece at once
            for _ in stream:
                pass
            finished["stream"] = time.monotonic()

        reader = threading.Thread(target=read_all)
        reader.start()
        time.sleep(0.05)
        backend.generate([[{"role": "user", "content": "hi"}]], temperature=0, max_new_tokens=3)
        finished["generate"] = time.monotonic()
        reader.join(timeout=60)
    finally:
        slow.remove()
    assert finished["generate"] < finished["stream"]


def test_the_model_lock_serves_waiters_in_order() -> None:
    lock = FairLock()
    order: list[object] = []
    lock.acquire()

    def take(i: int) -> None:
        with lock:
            order.append(i)

    threads = []
    for i in range(3):
        threads.append(threading.Thread(target=take, args=(i,)))
        threads[-1].start()
        while len(lock._waiting) < i + 1:  # each one waiting before the next asks
            time.sleep(0.001)
    lock.release()
    with lock:  # asked again at once, as a stream asks for its next token: behind the waiters
        order.append("again")
    for thread in threads:
        thread.join(timeout=10)
    assert order == [0, 1, 2, "again"]
    with pytest.raises(RuntimeError, match="not held"):
        lock.release()


def test_a_stream_stops_when_its_adapter_is_unloaded_or_reloaded(tiny_model: Path) -> None:
    adapters = tiny_model / "adapters"
    backend = LocalBackend.load(str(tiny_model),
                                adapters={"anchor": adapters / "anchor", "beacon": adapters / "beacon"})
    stream = backend.stream(CONVERSATION, adapter="anchor", temperature=0, max_new_tokens=30)
    next(stream)
    backend.unload_adapter("anchor")
    with pytest.raises(ValueError, match="unknown adapter anchor"):
        "".join(stream)
    backend.load_adapter("anchor", adapters / "catalyst")
    stream = backend.stream(CONVERSATION, adapter="anchor", temperature=0, max_new_tokens=30)
    next(stream)
    backend.unload_adapter("anchor")
    backend.load_adapter("anchor", adapters / "anchor")  # a reply must not switch weights halfway
    with pytest.raises(ValueError, match="adapter anchor was reloaded while a reply streamed"):
        "".join(stream)
    whole = backend.generate([CONVERSATION], adapters=["beacon"], temperature=0, max_new_tokens=30)[0]
    assert "".join(backend.stream(CONVERSATION, adapter="beacon", temperature=0, max_new_tokens=30)) == whole.text
