"""The HTTP layer's cost: the local server vs the in-process backend, side by side.

N requests with mixed adapters (base and the four persona adapters of the tiny model, built
on the spot) are sent C at a time to `mascot serve`'s app over 127.0.0.1 with the async
OpenAI client, and the same requests to the same `LocalBackend` in process; prints
requests/s of each and the overhead ratio of the HTTP layer.

    python bench/serve_throughput.py [--requests 200] [--concurrency 1 8 32] [--max-tokens 8]
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import tempfile
import threading
import time
from functools import partial
from pathlib import Path

import openai
import uvicorn

from mascot.policies.local import LocalBackend
from mascot.policies.local.server import create_app
from mascot.testing.tiny_model import build_tiny_model

PROMPTS = ["I failed my exam again.", "My manager ignores my ideas.", "I cannot sleep before big days.",
           "We missed the launch date.", "My friend stopped answering my messages."]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


async def over_http(url: str, models: list[str], requests: int, concurrency: int, max_tokens: int) -> float:
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0)
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        async with gate:
            await client.chat.completions.create(
                model=models[i % len(models)], messages=[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}],
                max_tokens=max_tokens, temperature=0.7)

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    await client.close()
    return requests / (time.perf_counter() - start)


async def in_process(backend: LocalBackend, models: list[str], requests: int, concurrency: int,
                     max_tokens: int) -> float:
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> None:
        model = models[i % len(models)]
        async with gate:
            await asyncio.get_running_loop().run_in_executor(backend.callers, partial(
                backend.generate, [[{"role": "user", "content": PROMPTS[i % len(PROMPTS)]}]],
                adapters=[None if model == "base" else model], max_new_tokens=max_tokens, temperature=0.7))

    start = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(requests)))
    return requests / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--max-tokens", type=int, default=8)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        model = build_tiny_model(Path(scratch) / "tiny", with_adapters=True)
        adapters = {p.name: p for p in sorted((model / "adapters").iterdir()) if p.is_dir()}
        backend = LocalBackend.load(str(model), adapters=adapters, device="cpu")
        port = free_port()
        server = uvicorn.Server(uvicorn.Config(create_app(backend, served_name="base"), host="127.0.0.1", port=port,
                                               log_level="warning"))
        threading.Thread(target=server.run, daemon=True).start()
        while not server.started:
            time.sleep(0.05)
        models = ["base", *adapters]
        print(f"{args.requests} requests, {args.max_tokens} new tokens each, adapters mixed: {', '.join(models)}")
        print("| concurrency | in-process req/s | HTTP req/s | HTTP / in-process |")
        print("|---:|---:|---:|---:|")
        for concurrency in args.concurrency:
            direct = asyncio.run(in_process(backend, models, args.requests, concurrency, args.max_tokens))
            http = asyncio.run(over_http(f"http://127.0.0.1:{port}/v1", models, args.requests, concurrency,
                                         args.max_tokens))
            print(f"| {concurrency} | {direct:.1f} | {http:.1f} | {http / direct:.2f} |")
        server.should_exit = True


if __name__ == "__main__":
    main()
