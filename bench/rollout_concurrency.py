"""Rollout throughput against a model server with a fixed latency, by concurrency.

Starts the stub OpenAI-compatible server (``python -m mascot.stub_server``) in its own
process, answering every request after ``--latency`` seconds, and runs ``mascot rollout``
against it at each concurrency, in one process and with ``--workers`` processes: the real
path (the compiled director graph, ``ChatOpenAI`` over HTTP with structured output for the
Director, JSONL appends). The ideal rate at concurrency ``c`` is
``c / (model calls per episode x latency)``: what a rollout would reach if the server's
latency were the only cost. Also measured side by side: the bare OpenAI client at the same
concurrency, the ceiling of one process's client stack on this machine.

    .venv/bin/python bench/rollout_concurrency.py [--latency 0.1] [--concurrency 1 8 32 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from openai import AsyncOpenAI

MASCOT = str(Path(sys.executable).parent / "mascot")


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    """Start the stub server in a subprocess; return it and its base URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "mascot.stub_server", "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    return server, server.stdout.readline().strip().rsplit(" ", 1)[-1]


def requests_served(url: str) -> int:
    """Requests the stub server has answered so far."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats") as response:
        return int(json.load(response)["requests"])


def rollout(url: str, concurrency: int, episodes: int, rounds: int, workers: int, folder: Path) -> tuple[float, float]:
    """One ``mascot rollout``; returns (episodes per second as it reports, calls per episode)."""
    before = requests_served(url)
    out = folder / f"c{concurrency}-w{workers}.jsonl"
    result = subprocess.run(
        [MASCOT, "rollout", "--roster", "emotional_support", "--base-url", url, "--model", "stub",
         "--max-tokens", "64", "--episodes", str(episodes), "--concurrency", str(concurrency),
         "--workers", str(workers), "--max-rounds", str(rounds), "--out", str(out)],
        capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}, check=False,
    )
    match = re.search(rf"{episodes}/{episodes} episodes .* ([\d.]+) episodes/s", result.stdout)
    if match is None:
        raise SystemExit(f"rollout failed: {result.stdout}{result.stderr[-2000:]}")
    return float(match.group(1)), (requests_served(url) - before) / episodes


async def bare_client(url: str, concurrency: int, seconds: float = 5.0) -> float:
    """Requests per second of the bare async OpenAI client at ``concurrency``."""
    client = AsyncOpenAI(base_url=url, api_key="EMPTY")
    messages = [{"role": "system", "content": "You are a voice. " * 40},
                {"role": "user", "content": "Conversation so far: " + "words " * 150}]
    done = 0
    stop = time.perf_counter() + seconds

    async def loop() -> None:
        nonlocal done
        while time.perf_counter() < stop:
            await client.chat.completions.create(model="stub", messages=messages, max_completion_tokens=64)
            done += 1

    start = time.perf_counter()
    await asyncio.gather(*(loop() for _ in range(concurrency)))
    rate = done / (time.perf_counter() - start)
    await client.close()
    return rate


def main() -> None:
    """Print the throughput table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1, help="server latency in seconds")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=2, help="person turns per episode")
    parser.add_argument("--waves", type=int, default=4, help="episodes per run = waves x concurrency")
    parser.add_argument("--workers", type=int, default=2, help="processes of the second column")
    args = parser.parse_args()
    server, url = start_server(args.latency)
    try:
        with tempfile.TemporaryDirectory() as folder:
            print(f"stub server latency {args.latency * 1000:.0f} ms, {args.rounds} rounds per episode, "
                  f"{os.cpu_count()} cores; ep/s as `mascot rollout` reports it (% of ideal)")
            print(f"{'concurrency':>11} {'calls/ep':>8} {'ideal ep/s':>10} {'1 process':>16} "
                  f"{f'{args.workers} workers':>16} {'bare client':>16}")
            for concurrency in args.concurrency:
                episodes = max(4, args.waves * concurrency)
                one, calls = rollout(url, concurrency, episodes, args.rounds, 1, Path(folder))
                many, _ = rollout(url, concurrency, episodes, args.rounds, args.workers, Path(folder))
                ideal = concurrency / (calls * args.latency)
                bare = asyncio.run(bare_client(url, concurrency)) / calls  # as episodes/s
                print(f"{concurrency:>11} {calls:>8.1f} {ideal:>10.2f} "
                      + " ".join(f"{rate:>8.2f} ({rate / ideal:>4.0%})" for rate in (one, many, bare)))
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
