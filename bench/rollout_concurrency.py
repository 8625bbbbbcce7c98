"""Rollout throughput against a model server with a fixed latency, by concurrency.

Starts the stub OpenAI-compatible server (``python -m mascot.stub_server``) in its own
process, answering every request after ``--latency`` seconds, and runs
``collect_episodes`` at each concurrency with the real client path (``ChatOpenAI`` over
HTTP, the compiled director graph, JSONL appends). The ideal rate at concurrency ``c``
is ``c / (model calls per episode x latency)``: what a rollout would reach if the only
cost were the server's latency. Prints episodes/s and the ratio to ideal side by side.

    .venv/bin/python bench/rollout_concurrency.py [--latency 0.1] [--concurrency 1 8 32 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mascot.graphs import create_director_graph
from mascot.policies import Policies, PolicySpec
from mascot.rosters import load_roster, load_scenarios
from mascot.training.retry import model_retry_policy
from mascot.training.rollout import collect_episodes


def start_server(latency: float) -> tuple[subprocess.Popen[str], str]:
    """Start the stub server in a subprocess; return it and its base URL."""
    server = subprocess.Popen(
        [sys.executable, "-m", "mascot.stub_server", "--latency", str(latency)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert server.stdout is not None
    line = server.stdout.readline().strip()
    return server, line.rsplit(" ", 1)[-1]


def requests_served(url: str) -> int:
    """Requests the stub server has answered so far."""
    with urllib.request.urlopen(url.removesuffix("/v1") + "/stats") as response:
        return int(json.load(response)["requests"])


async def run(url: str, concurrency: int, episodes: int, rounds: int, folder: Path) -> tuple[float, float]:
    """One rollout; returns (episodes per second, model calls per episode)."""
    roster = load_roster("emotional_support")
    spec = PolicySpec(kind="openai", model="stub", base_url=url, max_tokens=64, timeout=30)
    policies = Policies.single(spec, roster, seed=0)
    graph = create_director_graph(
        roster,
        director=policies.chat_model("director"),
        speakers=policies.speakers(),
        user=policies.chat_model("user"),
        max_rounds=rounds,
        structured_output=True,
        retry_policy=model_retry_policy(),
    )
    before = requests_served(url)
    start = time.perf_counter()
    status = await collect_episodes(
        graph,
        load_scenarios(roster.id),
        roster.user_profiles,
        roster=roster.id,
        out=folder / f"c{concurrency}.jsonl",
        episodes=episodes,
        concurrency=concurrency,
    )
    elapsed = time.perf_counter() - start
    assert status.completed == episodes, status
    return episodes / elapsed, (requests_served(url) - before) / episodes


async def table(url: str, args: argparse.Namespace, folder: Path) -> None:
    """Run every concurrency in one event loop (the HTTP client's pool belongs to it)."""
    print(f"stub server latency {args.latency * 1000:.0f} ms, {args.rounds} rounds per episode")
    print(f"{'concurrency':>11} {'episodes':>8} {'calls/ep':>8} {'ep/s':>8} {'ideal ep/s':>10} {'of ideal':>8}")
    for concurrency in args.concurrency:
        episodes = max(4, args.waves * concurrency)
        rate, calls = await run(url, concurrency, episodes, args.rounds, folder)
        ideal = concurrency / (calls * args.latency)
        print(f"{concurrency:>11} {episodes:>8} {calls:>8.1f} {rate:>8.2f} {ideal:>10.2f} {rate / ideal:>8.0%}")


def main() -> None:
    """Print the throughput table."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency", type=float, default=0.1, help="server latency in seconds")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64])
    parser.add_argument("--rounds", type=int, default=2, help="person turns per episode")
    parser.add_argument("--waves", type=int, default=3, help="episodes per run = waves x concurrency")
    args = parser.parse_args()
    logging.basicConfig(level=logging.ERROR)
    server, url = start_server(args.latency)
    try:
        with tempfile.TemporaryDirectory() as folder:
            asyncio.run(table(url, args, Path(folder)))
    finally:
        server.terminate()
        server.wait(timeout=10)


if __name__ == "__main__":
    main()
