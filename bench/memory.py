"""Memory of one base model with K persona adapters vs K separate model copies.

Each measurement runs in a fresh Python process, so nothing an earlier one loaded is
shared or cached in it. The process imports torch, transformers and peft, notes its
proportional set size (PSS: resident memory with each physical page counted once, which
plain RSS does not do for the memory-mapped checkpoint), loads one layout, generates 4
tokens per persona (so inference buffers count too), and reports how much its PSS grew,
and its peak RSS. Layouts, each served by `LocalBackend`:

- base: the base model alone (for reference);
- shared: one `LocalBackend` with the base model and K LoRA adapters, picked per row;
- copies: K `LocalBackend`s, each its own base model with one adapter merged into it
  (what K separately deployed persona models hold).

Models, built on the spot with random weights and saved in fp32: the tiny test model
(adapters r=8 on q/k/v/o) and a model of Qwen3-0.6B's shape (28 layers, hidden 1024,
16/8 heads, its 151,936-token vocabulary, tied embeddings; adapters r=16 on q/k/v/o).
They are loaded in bf16, so every copy owns its converted weights (as `LocalBackend.load`
does when it converts a bf16 checkpoint to fp32 on a CPU) and K=4 copies of the Qwen3-0.6B
shape stay near 5 GB; fp32 would double every figure but not the ratios. Linux only.

    python bench/memory.py [--adapters 4] [--repeats 2] [--models tiny qwen3-0.6b]
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

from mascot.policies.local import LocalBackend, quiet_loading
from mascot.testing.tiny_model import build_tiny_model, build_tokenizer

LAYOUTS = ("base", "shared", "copies")
QWEN3_06B = {"hidden_size": 1024, "intermediate_size": 3072, "num_hidden_layers": 28, "num_attention_heads": 16,
             "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151_936, "tie_word_embeddings": True}
CONVERSATION = [{"role": "user", "content": "I failed my exam again."}]


def build_qwen3_shape(out: Path, *, adapters: int) -> Path:
    """A random-weight model of Qwen3-0.6B's shape with the offline tokenizer and K adapters."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen3Config

    tokenizer = build_tokenizer()
    tokenizer.save_pretrained(out)
    special = {"bos_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"),
               "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
               "pad_token_id": tokenizer.convert_tokens_to_ids("<|pad|>")}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen3Config(**QWEN3_06B, **special))
    model.generation_config = GenerationConfig(eos_token_id=special["eos_token_id"],
                                               pad_token_id=special["pad_token_id"])
    config = LoraConfig(r=16, lora_alpha=32, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                        init_lora_weights=False, task_type="CAUSAL_LM")
    with quiet_loading():
        model.save_pretrained(out)
        peft_model = get_peft_model(model, config, adapter_name="persona0")
        for k in range(1, adapters):
            peft_model.add_adapter(f"persona{k}", config)
        peft_model.save_pretrained(out / "adapters")
    return out


def load(model: Path, adapters: dict[str, Path], *, merge: bool) -> LocalBackend:
    """What ``LocalBackend.load`` does, in bf16; with ``merge`` the adapter is folded into
    the weights."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    with quiet_loading():
        base = AutoModelForCausalLM.from_pretrained(model, dtype=torch.bfloat16)
        if adapters:
            (first, path), *rest = adapters.items()
            base = PeftModel.from_pretrained(base, str(path), adapter_name=first)
            for name, more in rest:
                base.load_adapter(str(more), adapter_name=name)
        if merge:
            base = base.merge_and_unload()
    base.eval()
    versions = {} if merge else dict.fromkeys(adapters)
    return LocalBackend(base, tokenizer, name=str(model), adapter_versions=versions)


def child(spec: dict) -> None:
    """Load one layout and print its memory figures as JSON (runs in a fresh process)."""
    import peft  # noqa: F401  (imported before the baseline, like the model code below)
    import psutil
    from transformers.models.qwen3 import modeling_qwen3  # noqa: F401

    process = psutil.Process()
    before = process.memory_full_info().pss
    model = Path(spec["model"])
    adapters = {p.name: p for p in sorted((model / "adapters").iterdir()) if p.is_dir()}
    adapters = dict(list(adapters.items())[: spec["adapters"]])
    if spec["layout"] == "base":
        backends = [load(model, {}, merge=False)]
    elif spec["layout"] == "shared":
        backends = [load(model, adapters, merge=False)]
    else:
        backends = [load(model, {name: path}, merge=True) for name, path in adapters.items()]
    for backend in backends:
        names = list(backend.adapter_versions) or [None]
        backend.generate([CONVERSATION] * len(names), adapters=names, max_new_tokens=4, temperature=0)
    print(json.dumps({"pss_mb": (process.memory_full_info().pss - before) / 2**20, "imports_mb": before / 2**20,
                      "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**10}))


def measure(model: Path, layout: str, *, adapters: int) -> dict[str, float]:
    """Memory figures of one layout, from a fresh process."""
    spec = {"model": str(model), "layout": layout, "adapters": adapters}
    done = subprocess.run([sys.executable, __file__, "--child", json.dumps(spec)], capture_output=True, text=True,
                          check=False)
    if done.returncode:
        raise RuntimeError(f"{layout} on {model.name} failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def cell(values: list[float]) -> str:
    return f"{statistics.median(values):.0f}" + (f" ({min(values):.0f}-{max(values):.0f})" if len(values) > 1 else "")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapters", type=int, default=4, help="K persona adapters")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--models", nargs="+", choices=["tiny", "qwen3-0.6b"], default=["tiny", "qwen3-0.6b"])
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(json.loads(args.child))
        return
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.models:
            if name == "tiny":
                model = build_tiny_model(Path(scratch) / name, with_adapters=True)
            else:
                model = build_qwen3_shape(Path(scratch) / name, adapters=args.adapters)
            results = {layout: [measure(model, layout, adapters=args.adapters) for _ in range(args.repeats)]
                       for layout in LAYOUTS}
            shared = statistics.median(r["pss_mb"] for r in results["shared"])
            imports = statistics.median(r["imports_mb"] for runs in results.values() for r in runs)
            print(f"\n{name} in bf16, K={args.adapters} adapters, {args.repeats} fresh processes each, "
                  f"median (min-max); growth above the {imports:.0f} MB of a process that imported torch, "
                  "transformers and peft")
            print("| layout | memory growth MB (PSS) | peak RSS MB | growth / shared |")
            print("|---|---:|---:|---:|")
            for layout, runs in results.items():
                pss = [r["pss_mb"] for r in runs]
                print(f"| {layout} | {cell(pss)} | {cell([r['peak_mb'] for r in runs])} | "
                      f"{statistics.median(pss) / shared:.2f} |", flush=True)


if __name__ == "__main__":
    main()
