"""A bare base's vLLM start on a CPU, compiled or eager, side by side in one run.

A server with LoRA modules runs eager already (vLLM turns compilation off with LoRA); a bare
base is compiled by torch.compile at start. For each setting, in this order: a compiled
start with an empty compile cache (``VLLM_CACHE_ROOT`` a fresh folder), a second compiled
start on the cache the first one wrote, and an eager start (``--enforce-eager``), each with
the seconds to ``/v1/models`` answering, whether vLLM's log says it loaded compiled code
from the cache, and tokens/s of fixed-length completions at concurrency 1 and 8 (the same
measure as ``bench/engines.py``). Prints a table and writes JSON.

    python bench/vllm_start.py --model ~/.cache/mascot/qwen2.5-coder-0.5b-instruct \
        [--tokens 64] [--out bench/results/vllm_start.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from engines import throughput

from mascot.policies.serving import ServedPolicies
from mascot.policies.vllm import VllmServer

#: (name, extra server arguments), in the order they run: the cache starts empty
SETTINGS = (("compiled, empty cache", []), ("compiled, second start", []), ("eager", ["--enforce-eager"]))
#: What vLLM 0.32 logs when it reuses, fails to reuse, or writes compiled code.
LOADED, FAILED, SAVED = "Directly load AOT compilation", "due to a load failure", "saved AOT compiled function"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", required=True, help="the offline model folder (mascot offline-model)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--out", default="bench/results/vllm_start.json")
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    model = str(Path(args.model).expanduser().resolve())
    work = Path(tempfile.mkdtemp(prefix="mascot-vllm-start-"))
    policy = work / "policies.yaml"
    policy.write_text(f"version: 1\nroles:\n  default: {{kind: local, model: {model}}}\n")
    os.environ["VLLM_CACHE_ROOT"] = str(work / "vllm-cache")  # the compile cache, empty at first
    results: dict[str, Any] = {"model": Path(model).name, "tokens": args.tokens, "settings": {}}
    for name, extra in SETTINGS:
        print(f"{name}: starting", flush=True)
        log = work / f"{name.replace(' ', '-').replace(',', '')}.log"
        server = VllmServer(ServedPolicies.from_file(policy), extra=extra, log=log).start()
        try:
            entry: dict[str, Any] = {"start_s": round(server.started_in or 0.0, 1), "concurrency": {}}
            for concurrency in (1, 8):
                entry["concurrency"][str(concurrency)] = asyncio.run(
                    throughput(server.url, server.served_name, concurrency, args.tokens, fixed=True))
        finally:
            server.stop()
        text = log.read_text(encoding="utf-8", errors="replace")
        entry["cache_loaded"] = LOADED in text
        entry["cache_saved"] = SAVED in text
        failure = next((line for line in text.splitlines() if FAILED in line), None)
        entry["cache_load_failure"] = failure.split("reason: ", 1)[-1] if failure else None
        results["settings"][name] = entry
        print(f"  {entry}", flush=True)
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    first = results["settings"]["compiled, empty cache"]
    print(f"\n{'setting':<24} {'start s':>8} {'tok/s c=1':>10} {'tok/s c=8':>10} {'cache':>8}")
    for name, entry in results["settings"].items():
        cache = "loaded" if entry["cache_loaded"] else "saved" if entry["cache_saved"] else "-"
        print(f"{name:<24} {entry['start_s']:>8} {entry['concurrency']['1']['tokens_per_s']:>10} "
              f"{entry['concurrency']['8']['tokens_per_s']:>10} {cache:>8}")
    eager = results["settings"]["eager"]
    print(f"eager / compiled (empty cache): start {eager['start_s'] / first['start_s']:.2f}x, decode c=8 "
          f"{eager['concurrency']['8']['tokens_per_s'] / first['concurrency']['8']['tokens_per_s']:.2f}x")


if __name__ == "__main__":
    main()
