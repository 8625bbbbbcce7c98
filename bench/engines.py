"""The two engines side by side on the offline model: the local backend (`mascot serve`) and vLLM.

In one run, for each engine: the server's start time (to `/v1/models` answering);
tokens/s of fixed-length completions at concurrency 1, 8 and 32 through the OpenAI client;
batch-1 decode against the memory-bandwidth floor (weights read once per token at the
bandwidth measured here); and a `mascot rollout --engine ...` end to end (the server's
start included) with the redundancy between the voices of each round and the rounds in
which two voices gave the same reply; and a `mascot judge --engine ...` of the persona
rubric over the same reply targets (the rollouts' replies, both engines' rollouts
together, up to `--targets`), end to end with the server's start, with the share of
targets both engines scored alike (the judge samples at temperature 0). Prints a table of
ratios and writes JSON; `--only` reruns some parts and keeps the others' results.

    python bench/engines.py --model ~/.cache/mascot/qwen2.5-coder-0.5b-instruct \
        [--tokens 128] [--concurrency 1 8 32] [--episodes 48] [--targets 120] \
        [--only throughput rollout judge] [--out bench/results/engines.json]

vLLM comes from `scripts/install --vllm`. Completions are fixed-length on vLLM
(`ignore_eos` + `min_tokens`); the local server has no such field, so its tokens/s counts
the completion tokens it reports.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import shutil
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

from mascot.graphs.embeddings import default_embedder
from mascot.policies.serving import ServedPolicies
from mascot.policies.vllm import VllmServer
from mascot.rosters import load_roster
from mascot.training.episodes.episode import read_episodes
from mascot.training.measures import redundancy

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
        return {"error": _cause(done), "seconds": seconds}
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


def _cause(done: subprocess.CompletedProcess) -> str:
    """A failed stage's reason: its error or summary line, not its progress bar."""
    lines = [line for line in done.stderr.splitlines() if line.strip() and "━" not in line]
    named = [line for line in lines if "error" in line.lower() or "failed" in line]
    return (named or lines or [f"rc {done.returncode}"])[-1][:300]


def judge_targets(work: Path, results: Path, limit: int) -> Path:
    """Both engines' rollout episodes (those of this run, else the committed ones), cut to
    the episodes whose replies make up to ``limit`` persona targets."""
    roster = load_roster("emotional_support")
    chosen: list[str] = []
    count = 0
    for engine in ("local", "vllm"):
        source = work / f"rollout-{engine}.jsonl"
        source = source if source.is_file() else results.parent / f"engines-rollout-{engine}.jsonl"
        for line in source.read_text(encoding="utf-8").splitlines() if source.is_file() else []:
            replies = sum(m.get("name") in roster.persona_ids for m in json.loads(line)["messages"])
            if count >= limit:
                break
            chosen.append(line)
            count += replies
    path = work / "judge-targets.jsonl"
    path.write_text("".join(line + "\n" for line in chosen), encoding="utf-8")
    return path


def judge(engine: str, model: str, targets: Path, work: Path) -> dict[str, Any]:
    out = work / f"judge-{engine}.jsonl"
    started = time.monotonic()
    done = subprocess.run([MASCOT, "judge", "--in", str(targets), "--rubric", "persona", "--roster",
                           "emotional_support", "--model", model, "--engine", engine, "--concurrency", "8",
                           "--seed", "0", "--out", str(out), "--cache", str(work / f"judge-{engine}.cache.jsonl")],
                          capture_output=True, text=True, check=False)
    seconds = time.monotonic() - started
    if done.returncode != 0:
        return {"error": _cause(done), "seconds": seconds}
    verdicts = [json.loads(line) for line in out.read_text(encoding="utf-8").splitlines()]
    ok = [v for v in verdicts if v["status"] == "ok"]
    return {"targets": len(verdicts), "ok": len(ok), "seconds": round(seconds, 1),
            "seconds_per_target": round(seconds / max(len(verdicts), 1), 2),
            "mean_overall": round(sum(v["overall"] for v in ok) / len(ok), 1) if ok else None,
            "scores": {f"{v['episode_id']}/{v['turn']}": v["overall"] for v in verdicts}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the offline model folder (mascot offline-model)")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32])
    parser.add_argument("--episodes", type=int, default=48)
    parser.add_argument("--targets", type=int, default=120, help="persona targets the judge stage judges")
    parser.add_argument("--only", nargs="+", choices=("throughput", "rollout", "judge"),
                        default=["throughput", "rollout", "judge"], help="parts to run (the others are kept)")
    parser.add_argument("--out", default="bench/results/engines.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = str(Path(args.model).expanduser().resolve())
    work = Path(tempfile.mkdtemp(prefix="mascot-engines-"))
    policy = work / "policies.yaml"
    policy.write_text(f"version: 1\nroles:\n  default: {{kind: local, model: {model}}}\n")
    weights = sum(p.stat().st_size for p in Path(model).glob("*.safetensors"))
    kept = json.loads(Path(args.out).read_text()) if Path(args.out).is_file() and len(args.only) < 3 else {}
    results: dict[str, Any] = {**kept, "model": Path(model).name, "weights_gb": round(weights / 1e9, 2)}
    if "throughput" in args.only:  # the floor belongs with the decode speed measured beside it
        bandwidth = bandwidth_gb_s()
        results.update({"bandwidth_gb_s": round(bandwidth, 1),
                        "decode_floor_tokens_per_s": round(bandwidth * 1e9 / weights, 1)})
    results.setdefault("engines", {})
    name = Path(model).name
    for engine in ("local", "vllm"):
        entry: dict[str, Any] = results["engines"].setdefault(engine, {})
        if "throughput" in args.only:
            results["tokens"] = args.tokens
            print(f"{engine}: starting the server", flush=True)
            if engine == "local":
                process, url, start = local_server(policy)
                stop = process.terminate
            else:
                server = VllmServer(ServedPolicies.from_file(policy)).start()
                url, start, stop = server.url, server.started_in or 0.0, server.stop
            entry.update({"start_s": round(start, 1), "concurrency": {}})
            try:
                for c in args.concurrency:
                    entry["concurrency"][str(c)] = asyncio.run(throughput(url, name, c, args.tokens,
                                                                          fixed=engine == "vllm"))
                    print(f"  {engine} concurrency {c}: {entry['concurrency'][str(c)]}", flush=True)
            finally:
                stop()
            one = entry["concurrency"].get("1", {}).get("tokens_per_s")
            entry["decode_vs_floor"] = round(one / results["decode_floor_tokens_per_s"], 3) if one else None
        if "rollout" in args.only:
            print(f"{engine}: rollout of {args.episodes} episodes", flush=True)
            entry["rollout"] = rollout(engine, model, args.episodes, work)
            print(f"  {entry['rollout']}", flush=True)
    if "judge" in args.only:
        targets = judge_targets(work, Path(args.out), args.targets)
        for engine in ("local", "vllm"):
            print(f"{engine}: judge of up to {args.targets} persona targets", flush=True)
            results["engines"][engine]["judge"] = judge(engine, model, targets, work)
            print(f"  {({k: v for k, v in results['engines'][engine]['judge'].items() if k != 'scores'})}",
                  flush=True)
    local, vllm = results["engines"]["local"], results["engines"]["vllm"]
    both = [key for key in local.get("judge", {}).get("scores", {}) if key in vllm.get("judge", {}).get("scores", {})]
    results["ratios_vllm_over_local"] = {
        **{f"tokens_per_s_c{c}": round(vllm["concurrency"][str(c)]["tokens_per_s"]
                                       / local["concurrency"][str(c)]["tokens_per_s"], 2) for c in args.concurrency},
        **{f"{stage}_speedup": round(local[stage]["seconds"] / vllm[stage]["seconds"], 2)
           for stage in ("rollout", "judge") if stage in local and stage in vllm
           and "error" not in local[stage] and "error" not in vllm[stage]},
    }
    if both:
        results["judge_same_score_share"] = round(
            sum(local["judge"]["scores"][k] == vllm["judge"]["scores"][k] for k in both) / len(both), 3)
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for raw in [*work.glob("rollout-*.jsonl"), *work.glob("judge-local.jsonl"), *work.glob("judge-vllm.jsonl")]:
        shutil.copy(raw, Path(args.out).parent / f"engines-{raw.name}")  # the raw outputs behind the numbers
    print("\n| | local | vLLM | vLLM / local |\n|---|---|---|---|")
    for c in args.concurrency:
        lo, vl = local["concurrency"][str(c)]["tokens_per_s"], vllm["concurrency"][str(c)]["tokens_per_s"]
        print(f"| tokens/s, concurrency {c} | {lo} | {vl} | {vl / lo:.2f} |")
    print(f"| batch-1 decode / floor ({results['decode_floor_tokens_per_s']} tok/s) | {local['decode_vs_floor']} | "
          f"{vllm['decode_vs_floor']} | |")
    print(f"| server start, s | {local['start_s']} | {vllm['start_s']} | |")
    for key in ("seconds", "redundancy_between_voices", "rounds_with_a_repeated_reply"):
        print(f"| rollout of {local['rollout'].get('episodes')}: {key} | {local['rollout'].get(key)} | "
              f"{vllm['rollout'].get(key)} | |")
    for key in ("seconds", "seconds_per_target", "mean_overall"):
        print(f"| judge of {local.get('judge', {}).get('targets')}: {key} | {local.get('judge', {}).get(key)} | "
              f"{vllm.get('judge', {}).get(key)} | |")
    print(f"| judge: same score on both engines | {results.get('judge_same_score_share')} | | |")
    print(f"\nwritten to {args.out}")


if __name__ == "__main__":
    main()
