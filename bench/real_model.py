"""The untrained ensemble on a real instruction-tuned model: what it writes, and how fast.

Runs one directed round on each of N scenario openings (default 20) of a roster, with the
offline Qwen2.5-Coder-0.5B-Instruct (`mascot offline-model --out DIR`) as Director and
every persona, on the local backend (bf16 where the CPU has it), 8 episodes at a time,
seeded. Twice: with the Director's structured output (grammar-constrained decoding, the
speaker an ``enum`` of the voices that may speak now) and without (prompted JSON). Prints:

- valid directions (used as the model wrote them), repaired, replaced;
- rounds with at least 2 distinct personas; the Director naming a persona that already
  spoke in the round (replaced); consecutive turns by one persona;
- echoed cues, empty replies, mean reply tokens, redundancy (each persona turn's highest
  similarity to the earlier turns of its round, MiniLM with the `metrics` extra);
- seconds per round (wall time of one episode while 8 run).

Then the generation speed: 8 concurrent seeded calls of 64 new tokens through the
backend's micro-batcher vs one at a time (``max_batch=1``), and batch-1 decode tokens/s
against the memory-bandwidth floor (bytes of weights read per decoding step / measured
copy bandwidth). Raw episodes go to ``--out`` (JSONL, one line per round and condition).

    python bench/real_model.py --model DIR [--scenarios 20] [--concurrency 8] [--out FILE] [--speed-only]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from typing import Any

import torch
from langchain_core.messages import AIMessage, HumanMessage

from mascot.graphs import create_director_graph, openai_messages
from mascot.graphs.embeddings import default_embedder
from mascot.policies import Policies, PolicySpec
from mascot.policies.local import LocalBackend
from mascot.rosters import load_roster, load_scenarios
from mascot.training.measures import redundancy

HAND_BACK = "turn limit of the round reached"


async def play(graph: Any, openings: list[tuple[str, str]], concurrency: int) -> list[dict[str, Any]]:
    """One round per opening, ``concurrency`` at a time; the final states with their wall time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(scenario_id: str, opening: str) -> dict[str, Any]:
        async with gate:
            start = time.perf_counter()
            state = await graph.ainvoke({"messages": [HumanMessage(opening)]},
                                        {"metadata": {"episode_id": scenario_id}})
            return {"scenario": scenario_id, "state": state, "seconds": time.perf_counter() - start}

    return await asyncio.gather(*(one(sid, text) for sid, text in openings))


def measure(rounds: list[dict[str, Any]], embedder: Any) -> dict[str, float]:
    """The quality figures of one condition."""
    asked = valid = repaired = replaced = repeated = consecutive = 0
    distinct_two = echoed = empty = persona_turns = 0
    tokens: list[int] = []
    similarities: list[float] = []
    for item in rounds:
        state = item["state"]
        for direction in state.get("directions", []):
            if direction.get("rationale") == HAND_BACK:
                continue
            asked += 1
            reason = direction.get("fallback")
            if reason is None:
                valid += 1
            elif reason.startswith("repaired"):
                repaired += 1
            else:
                replaced += 1
                repeated += "already spoke this round" in reason
        replies = [m for m in state["messages"] if isinstance(m, AIMessage)]
        names = [m.name for m in replies]
        distinct_two += len(set(names)) >= 2
        consecutive += sum(a == b for a, b in zip(names, names[1:], strict=False))
        for fallback in state.get("fallbacks", []):
            echoed += "echoed" in fallback["reason"]
            empty += "empty reply" in fallback["reason"]
        persona_turns += len(replies) + sum(
            f["node"] != "director" for f in state.get("fallbacks", []))
        tokens += [(m.usage_metadata or {}).get("output_tokens", 0) for m in replies]
        similarities += redundancy([m.text for m in replies], embedder=embedder)[1:]
    n = len(rounds)
    return {
        "rounds": n,
        "directions asked": asked,
        "valid directions %": 100 * valid / max(asked, 1),
        "repaired %": 100 * repaired / max(asked, 1),
        "replaced %": 100 * replaced / max(asked, 1),
        "named a persona already heard %": 100 * repeated / max(asked, 1),
        "rounds with >= 2 personas %": 100 * distinct_two / n,
        "same persona twice in a row": consecutive,
        "persona turns": persona_turns,
        "echoed cues": echoed,
        "empty replies": empty,
        "mean reply tokens": statistics.fmean(tokens) if tokens else 0.0,
        "redundancy (mean)": statistics.fmean(similarities) if similarities else 0.0,
        "seconds per round (median)": statistics.median(r["seconds"] for r in rounds),
    }


def generation_speed(backend: LocalBackend, concurrency: int, new_tokens: int) -> dict[str, float]:
    """Tokens/s of ``concurrency`` seeded calls at once: micro-batched vs one at a time."""
    conversations = [[{"role": "user", "content": f"Write a short note to a friend about day {i} of a trip."}]
                     for i in range(concurrency)]

    def run(max_batch: int) -> float:
        backend.max_batch = max_batch
        counts: list[int] = []

        def call(i: int) -> None:
            reply = backend.generate([conversations[i]], max_new_tokens=new_tokens, temperature=0.7,
                                     seed=1000 + i)[0]
            counts.append(reply.completion_tokens)

        threads = [threading.Thread(target=call, args=(i,)) for i in range(concurrency)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        return sum(counts) / (time.perf_counter() - start)

    run(concurrency)  # warm-up
    batched, sequential = run(concurrency), run(1)
    backend.max_batch = 8
    return {"batched tokens/s": batched, "one at a time tokens/s": sequential, "ratio": batched / sequential}


def bandwidth_floor(backend: LocalBackend, new_tokens: int) -> dict[str, float]:
    """Batch-1 decode tokens/s and the floor set by reading every weight once per step."""
    model = backend.model
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    source = torch.empty(256 * 2**20, dtype=torch.uint8)
    target = torch.empty_like(source)
    target.copy_(source)
    copies = []
    for _ in range(5):
        start = time.perf_counter()
        target.copy_(source)
        copies.append(time.perf_counter() - start)
    bandwidth = source.numel() / min(copies)  # bytes read per second (each copy also writes as much)
    conversation = [{"role": "user", "content": "Count slowly from one to one hundred in words."}]

    def timed(tokens: int) -> tuple[float, int]:
        start = time.perf_counter()
        reply = backend.generate([conversation], max_new_tokens=tokens, temperature=0.0)[0]
        return time.perf_counter() - start, reply.completion_tokens

    timed(4)
    one, _ = min(timed(1) for _ in range(3))
    many, made = min(timed(new_tokens) for _ in range(3))
    decode = (made - 1) / (many - one)  # the prompt's prefill is in both
    floor = bandwidth / weight_bytes
    return {"weights GB": weight_bytes / 1e9, "copy bandwidth GB/s": bandwidth / 1e9,
            "floor tokens/s": floor, "decode tokens/s (batch 1)": decode, "of floor %": 100 * decode / floor}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="the offline model folder (mascot offline-model --out DIR)")
    parser.add_argument("--roster", default="emotional_support")
    parser.add_argument("--scenarios", type=int, default=20)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", default="bench-real-model.jsonl", help="raw rounds (JSONL)")
    parser.add_argument("--speed-only", action="store_true", help="skip the rounds; measure generation speed only")
    args = parser.parse_args(argv)
    roster = load_roster(args.roster)
    openings = [(s.id, s.opening) for s in load_scenarios(roster.id)[: args.scenarios]]
    policies = Policies.single(PolicySpec(model=args.model), roster, seed=args.seed)
    director, speakers = policies.chat_model("director"), policies.speakers()
    backend = director.backend  # every role shares this one LocalBackend
    print(f"{args.model}: {sum(p.numel() for p in backend.model.parameters()) / 1e6:.0f}M parameters, "
          f"{next(backend.model.parameters()).dtype}, {torch.get_num_threads()} threads; "
          f"{len(openings)} openings of {roster.id}, one round each, {args.concurrency} at a time", flush=True)
    if not args.speed_only:
        rounds_table(args, roster, openings, director, speakers)
    speed = generation_speed(backend, args.concurrency, args.new_tokens)
    floor = bandwidth_floor(backend, args.new_tokens)
    print(f"\n{args.concurrency} concurrent seeded calls, {args.new_tokens} new tokens each:")
    for key, value in {**speed, **floor}.items():
        print(f"  {key:28} {value:10.2f}")
    return 0


def rounds_table(args: argparse.Namespace, roster: Any, openings: list[tuple[str, str]], director: Any,
                 speakers: Any) -> None:
    """Play the rounds in both conditions, write them raw and print the quality table."""
    embedder = default_embedder()
    results: dict[str, dict[str, float]] = {}
    with open(args.out, "w", encoding="utf-8") as raw:
        for label, structured in (("constrained", True), ("prompted JSON", False)):
            graph = create_director_graph(roster, director=director, speakers=speakers, max_rounds=1,
                                          structured_output=structured).compile()
            start = time.perf_counter()
            rounds = asyncio.run(play(graph, openings, args.concurrency))
            print(f"{label}: {len(rounds)} rounds in {time.perf_counter() - start:.0f} s", flush=True)
            results[label] = measure(rounds, embedder)
            for item in rounds:
                state = item["state"]
                raw.write(json.dumps({"condition": label, "scenario": item["scenario"], "seconds": item["seconds"],
                                      "messages": openai_messages(state["messages"]),
                                      "directions": state.get("directions", []),
                                      "fallbacks": state.get("fallbacks", [])}, ensure_ascii=False) + "\n")
    print(f"\n| {'measure':38} | {'constrained':>12} | {'prompted JSON':>13} |")
    print(f"|{'-' * 40}|{'-' * 14}:|{'-' * 15}:|")
    for key in results["constrained"]:
        a, b = results["constrained"][key], results["prompted JSON"][key]
        print(f"| {key:38} | {a:12.2f} | {b:13.2f} |" if isinstance(a, float) else f"| {key:38} | {a:12} | {b:13} |")
    print(f"\nraw rounds: {args.out}")


if __name__ == "__main__":
    sys.exit(main())
