"""Rollout throughput against a model server with a fixed latency, by concurrency.

Starts the stub OpenAI-compatible server (``python -m mascot.testing.stub_server``) in its own
process, answering every request after ``--latency`` seconds, and runs ``mascot rollout``
against it at each concurrency, in one process and with ``--workers`` processes: the real
path (the compiled director graph, ``ChatOpenAI`` over HTTP with structured output for the
Director, JSONL appends). The ideal rate at concurrency ``c`` is
``c / (model calls per episode x latency)``: what a rollout would reach if the server's
latency were the only cost. Also measured side by side: the bare OpenAI client at the same
concurrency, the ceiling of one process's client stack on this machine.

Every configuration runs ``--repeats`` times (interleaved: 1 process, workers, bare client,
then again); the table shows the median episodes/s, its min-max spread over the repeats, and
the median as a share of the ideal.

    .venv/bin/python bench/rollout_concurrency.py [--latency 0.1] [--concurrency 1 8 32 64] [--repeats 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
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
        [sys.executable, "-m", "mascot.testing.stub_server", "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    return server, server.stdout.readline().strip().rsplit(" ", 1)[-1]


def requests_served(url: str) -> int:
    """Requests the stub server has answered so far."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats") as response:
        return int(json.load(response)["requests"])


def rollout(url: str, concurrency: int, episodes: int, rounds: int, workers: int, out: Path) -> tuple[float, float]:
    """One ``mascot rollout`` into a new file ``out``; returns (episodes/s as it reports, calls per episode)."""
    before = requests_served(url)
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


def spread(rates: list[float], ideal: float) -> str:
    """A rate column: median, min-max over the repeats, median as a share of the ideal."""
    median = statistics.median(rates)
    return f"{median:>6.2f} [{min(rates):.2f}-{max(rates):.2f}] ({median / ideal:>4.0%})"


def main() -> None:
    """Print the throughput table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1, help="server latency in seconds")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=2, help="person turns per episode")
    parser.add_argument("--waves", type=int, default=4, help="episodes per run = waves x concurrency")
    parser.add_argument("--workers", type=int, default=2, help="processes of the second column")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each configuration")
    args = parser.parse_args()
    if args.repeats < 1:
        parser.error(f"--repeats must be >= 1, got {args.repeats}")
    server, url = start_server(args.latency)
    try:
        with tempfile.TemporaryDirectory() as folder:
            print(f"stub server latency {args.latency * 1000:.0f} ms, {args.rounds} rounds per episode, "
                  f"{os.cpu_count()} cores, {args.repeats} repeats; ep/s as `mascot rollout` reports it: "
                  f"median [min-max] (median as % of ideal)")
            width = 25
            print(f"{'concurrency':>11} {'calls/ep':>8} {'ideal ep/s':>10} {'1 process':>{width}} "
                  f"{f'{args.workers} workers':>{width}} {'bare client':>{width}}")
            for concurrency in args.concurrency:
                episodes = max(4, args.waves * concurrency)
                rates: dict[str, list[float]] = {"one": [], "many": [], "bare": []}
                calls: list[float] = []
                for repeat in range(args.repeats):
                    # a new output file per run: the same file would resume, finding every episode done
                    for key, workers in (("one", 1), ("many", args.workers)):
                        out = Path(folder) / f"c{concurrency}-w{workers}-r{repeat}.jsonl"
                        rate, per_episode = rollout(url, concurrency, episodes, args.rounds, workers, out)
                        rates[key].append(rate)
                        calls.append(per_episode)
                    rates["bare"].append(asyncio.run(bare_client(url, concurrency)))
                per_episode = statistics.median(calls)
                ideal = concurrency / (per_episode * args.latency)
                rates["bare"] = [rate / per_episode for rate in rates["bare"]]  # as episodes/s
                print(f"{concurrency:>11} {per_episode:>8.1f} {ideal:>10.2f} "
                      + " ".join(f"{spread(rates[key], ideal):>{width}}" for key in ("one", "many", "bare")))
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
