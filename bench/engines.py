"""The two engines side by side on the offline model: the local backend (`mascot serve`) and vLLM.

In one run, for each engine: the server's start time (to `/v1/models` answering);
tokens/s of fixed-length completions at concurrency 1, 8 and 32 through the OpenAI client;
batch-1 decode against the memory-bandwidth floor (weights read once per token at the
bandwidth measured here); and a `mascot rollout --engine ...` end to end (the server's
start included) with the redundancy between the voices of each round and the rounds in
which two voices gave the same reply. Prints a table of ratios and writes JSON.

    python bench/engines.py --model ~/.cache/mascot/qwen2.5-coder-0.5b-instruct \
        [--tokens 128] [--concurrency 1 8 32] [--episodes 48] [--out bench/results/engines.json]

vLLM comes from `scripts/install --vllm`. Completions are fixed-length on vLLM
(`ignore_eos` + `min_tokens`); the local server has no such field, so its tokens/s counts
the completion tokens it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx
import openai
import torch

from mascot.policies.serving import ServedPolicies
from mascot.policies.vllm_engine import VllmServer
from mascot.rosters import load_roster
from mascot.training.episodes.episode import read_episodes
from mascot.training.evaluation.metrics import default_embedder, redundancy

MASCOT = str(Path(sys.executable).parent / "mascot")
PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def bandwidth_gb_s(size_mb: int = 512, repeats: int = 5) -> float:
    """Memory bandwidth of a large tensor copy (read + write), GB/s."""
    source = torch.empty(size_mb << 20, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)
    start = time.perf_counter()
    for _ in range(repeats):
        target.copy_(source)
    return 2 * repeats * source.numel() / (time.perf_counter() - start) / 1e9


async def throughput(url: str, model: str, concurrency: int, tokens: int, *, fixed: bool) -> dict[str, float]:
    """``concurrency`` completions at once (3 one after another at concurrency 1): tokens/s."""
    client = openai.AsyncOpenAI(base_url=url, api_key="EMPTY", max_retries=0, timeout=900)
    extra = {"ignore_eos": True, "min_tokens": tokens} if fixed else {}
    count = 3 if concurrency == 1 else concurrency
    gate = asyncio.Semaphore(concurrency)

    async def one(i: int) -> int:
        async with gate:
            reply = await client.chat.completions.create(
                model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=tokens, temperature=0.7,
                seed=i, extra_body=extra)
            return reply.usage.completion_tokens if reply.usage else 0

    await one(-1)  # warm
    start = time.perf_counter()
    produced = sum(await asyncio.gather(*(one(i) for i in range(count))))
    seconds = time.perf_counter() - start
    await client.close()
    return {"tokens": produced, "seconds": round(seconds, 2), "tokens_per_s": round(produced / seconds, 2)}


def local_server(policy: Path) -> tuple[subprocess.Popen, str, float]:
    port = free_port()
    started = time.monotonic()
    process = subprocess.Popen([MASCOT, "serve", "--policies", str(policy), "--port", str(port)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}/v1"
    while process.poll() is None:
        try:
            if httpx.get(f"{url}/models", timeout=5).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(1)
    return process, url, time.monotonic() - started


def rollout(engine: str, model: str, episodes: int, work: Path) -> dict[str, Any]:
    out = work / f"rollout-{engine}.jsonl"
    started = time.monotonic()
    done = subprocess.run([MASCOT, "rollout", "--roster", "emotional_support", "--model", model, "--engine", engine,
                           "--episodes", str(episodes), "--max-rounds", "1", "--concurrency", "8", "--seed", "0",
                           "--out", str(out)], capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        return {"error": done.stderr.strip().splitlines()[-1:] or [f"rc {done.returncode}"], "seconds": seconds}
    roster = load_roster("emotional_support")
    embedder = default_embedder()
    values, same, rounds = [], 0, 0
    for episode in read_episodes(out):
        voices = [m.content for m in episode.messages if m.name in roster.persona_ids]
        if len(voices) >= 2:
            rounds += 1
            same += len(set(voices)) < len(voices)
            values.extend(redundancy(voices, embedder=embedder)[1:])
    return {"episodes": episodes, "seconds": round(seconds, 1), "rounds_with_several_voices": rounds,
            "rounds_with_a_repeated_reply": same,
            "redundancy_between_voices": round(sum(values) / len(values), 3) if values else None}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the offline model folder (mascot offline-model)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--out", default="bench/results/engines.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = str(Path(args.model).expanduser().resolve())
    work = Path(tempfile.mkdtemp(prefix="mascot-engines-"))
    policy = work / "policies.yaml"
    policy.write_text(f"version: 1\nroles:\n  default: {{kind: local, model: {model}}}\n")
    weights = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
    bandwidth = bandwidth_gb_s()
    results: dict[str, Any] = {"model": Path(model).name, "tokens": args.tokens, "bandwidth_gb_s": round(bandwidth, 1),
                               "weights_gb": round(weights / 1e9, 2),
                               "decode_floor_tokens_per_s": round(bandwidth * 1e9 / weights, 1), "engines": {}}
    name = Path(model).name
    for engine in ("local", "vllm"):
        print(f"{engine}: starting the server", flush=True)
        if engine == "local":
            process, url, start = local_server(policy)
            stop = process.terminate
        else:
            server = VllmServer(ServedPolicies.from_file(policy)).start()
            url, start, stop = server.url, server.started_in or 0.0, server.stop
        entry: dict[str, Any] = {"start_s": round(start, 1), "concurrency": {}}
        try:
            for c in args.concurrency:
                entry["concurrency"][str(c)] = asyncio.run(throughput(url, name, c, args.tokens,
                                                                      fixed=engine == "vllm"))
                print(f"  {engine} concurrency {c}: {entry['concurrency'][str(c)]}", flush=True)
        finally:
            stop()
        one = entry["concurrency"].get("1", {}).get("tokens_per_s")
        entry["decode_vs_floor"] = round(one / results["decode_floor_tokens_per_s"], 3) if one else None
        print(f"{engine}: rollout of {args.episodes} episodes", flush=True)
        entry["rollout"] = rollout(engine, model, args.episodes, work)
        print(f"  {entry['rollout']}", flush=True)
        results["engines"][engine] = entry
    local, vllm = results["engines"]["local"], results["engines"]["vllm"]
    results["ratios_vllm_over_local"] = {
        **{f"tokens_per_s_c{c}": round(vllm["concurrency"][str(c)]["tokens_per_s"]
                                       / local["concurrency"][str(c)]["tokens_per_s"], 2) for c in args.concurrency},
        "rollout_speedup": round(local["rollout"]["seconds"] / vllm["rollout"]["seconds"], 2)
        if "error" not in local["rollout"] and "error" not in vllm["rollout"] else None,
    }
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    print("\n| | local | vLLM | vLLM / local |\n|---|---|---|---|")
    for c in args.concurrency:
        lo, vl = local["concurrency"][str(c)]["tokens_per_s"], vllm["concurrency"][str(c)]["tokens_per_s"]
        print(f"| tokens/s, concurrency {c} | {lo} | {vl} | {vl / lo:.2f} |")
    print(f"| batch-1 decode / floor ({results['decode_floor_tokens_per_s']} tok/s) | {local['decode_vs_floor']} | "
          f"{vllm['decode_vs_floor']} | |")
    print(f"| server start, s | {local['start_s']} | {vllm['start_s']} | |")
    for key in ("seconds", "redundancy_between_voices", "rounds_with_a_repeated_reply"):
        print(f"| rollout of {args.episodes}: {key} | {local['rollout'].get(key)} | {vllm['rollout'].get(key)} | |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
