"""The memory allocator of processes that train or serve: freed pages are kept, not returned.

On the small VMs mascot trains on, a training step frees and re-allocates gigabytes of
activations and gradients. glibc's ``malloc`` hands large blocks back to the system
(``munmap``, heap trims) and faults them in again on the next step, which costs more than the
arithmetic (``bench/step_cost.py`` measures it side by side). jemalloc is preloaded instead,
set by what the process does (``MODES``):

- ``train``: a trainer that only runs forward and backward passes (SFT, DPO, reward models):
  its steps repeat the same allocations, so no freed page is ever given back;
- ``generate``: a GRPO trainer. One that samples in its own process fragments the heap with
  the growing KV caches of generation: a heap that never gives memory back grew past 23 GiB
  in three Director steps of the 0.5B model. One whose directions are sampled on a vLLM
  server still grew to 18 GiB in seven steps (prompts of every length, a warm-started
  adapter) and was killed on a 24 GiB machine. Freed pages are given back after 10 s by
  jemalloc's background thread;
- ``serve``: a vLLM server, jemalloc with its own defaults (as vLLM's CPU docs recommend).

The setting has to be in a process's environment when it starts (``LD_PRELOAD``), so a
training command started by hand re-runs itself with it once (``with_allocator``) and vLLM
servers start with it (``allocator_env``). Where jemalloc is not installed (``apt-get install
libjemalloc2``), glibc's own thresholds are raised for the trainers instead, and one log line
says so.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

logger = logging.getLogger(__name__)

#: jemalloc's settings (``MALLOC_CONF``) per mode; ``None``: its defaults.
MODES: dict[str, str | None] = {
    "train": "thp:always,metadata_thp:auto,dirty_decay_ms:-1,muzzy_decay_ms:-1",
    "generate": "background_thread:true,thp:always,metadata_thp:auto,dirty_decay_ms:10000,muzzy_decay_ms:10000",
    "serve": None,
}
#: glibc's settings where jemalloc is missing: no block is mmap'ed on its own or trimmed
#: back (values in bytes; glibc caps the mmap threshold at 32 MiB on 64-bit, 1 GiB trim).
GLIBC_ENV = {"MALLOC_MMAP_THRESHOLD_": str(32 << 20), "MALLOC_TRIM_THRESHOLD_": str(1 << 30),
             "MALLOC_TOP_PAD_": str(256 << 20)}
#: Set to ``system`` to leave the allocator alone (e.g. to measure it, or under a profiler).
ALLOCATOR_ENV = "MASCOT_ALLOCATOR"
#: Where Debian, Ubuntu, Fedora and conda put the library.
_JEMALLOC_PATHS = ("/usr/lib/x86_64-linux-gnu/libjemalloc.so.2", "/usr/lib/aarch64-linux-gnu/libjemalloc.so.2",
                   "/usr/lib64/libjemalloc.so.2", "/usr/lib/libjemalloc.so.2", "/usr/local/lib/libjemalloc.so.2")
_warned: list[bool] = []


def jemalloc_library() -> str | None:
    """The path of ``libjemalloc.so.2`` on this machine (or in this environment), else ``None``."""
    candidates = [*_JEMALLOC_PATHS, str(Path(sys.prefix) / "lib" / "libjemalloc.so.2")]
    return next((p for p in candidates if Path(p).is_file()), None)


def allocator_env(env: Mapping[str, str] | None = None, *, choice: str | None = None,
                  mode: str = "train") -> dict[str, str]:
    """``env`` (default this process's) with the allocator setting for a process that trains or serves.

    Args:
        env: The environment to extend; it is copied, not changed.
        choice: ``jemalloc``, ``glibc`` (raised thresholds) or ``system`` (unchanged); default
            ``MASCOT_ALLOCATOR`` from ``env``, else jemalloc where installed, else glibc.
        mode: What the process does, one of ``MODES`` (``serve``: glibc stays as it is).

    Returns:
        The new environment: ``LD_PRELOAD`` and ``MALLOC_CONF`` for jemalloc, glibc's
        ``MALLOC_*_`` thresholds otherwise. Values already set in ``env`` are kept.

    Raises:
        ValueError: on an unknown ``choice`` or ``mode``, or ``jemalloc`` asked for where it is missing.
    """
    if mode not in MODES:
        raise ValueError(f"allocator mode {mode!r}: use {', '.join(MODES)}")
    out = dict(os.environ if env is None else env)
    choice = choice or out.get(ALLOCATOR_ENV) or ""
    if choice not in ("", "jemalloc", "glibc", "system"):
        raise ValueError(f"{ALLOCATOR_ENV}={choice}: use jemalloc, glibc or system")
    if choice == "system":
        out[ALLOCATOR_ENV] = "system"
        return out
    library = jemalloc_library() if choice in ("", "jemalloc") else None
    if choice == "jemalloc" and library is None:
        raise ValueError(f"{ALLOCATOR_ENV}=jemalloc: libjemalloc.so.2 is not installed (apt-get install libjemalloc2)")
    if library is not None:
        preload = [p for p in out.get("LD_PRELOAD", "").split(":") if p]
        if not any("jemalloc" in p for p in preload):
            out["LD_PRELOAD"] = ":".join([library, *preload])
        if MODES[mode]:
            out.setdefault("MALLOC_CONF", MODES[mode])
        out[ALLOCATOR_ENV] = "jemalloc"
        return out
    if mode == "serve":
        return out
    if not _warned and choice == "":
        _warned.append(True)
        logger.info("jemalloc is not installed (apt-get install libjemalloc2): training and serving keep freed "
                    "memory with glibc's thresholds instead, which is slower")
    for name, value in GLIBC_ENV.items():
        out.setdefault(name, value)
    out[ALLOCATOR_ENV] = "glibc"
    return out


def active_allocator() -> str:
    """The allocator setting this process started with: ``jemalloc``, ``glibc`` or ``system``."""
    if any("jemalloc" in p for p in os.environ.get("LD_PRELOAD", "").split(":")):
        return "jemalloc"
    if os.environ.get(ALLOCATOR_ENV) == "system":
        return "system"
    return "glibc" if all(os.environ.get(name) for name in GLIBC_ENV) else "system"


def with_allocator(argv: Sequence[str] | None = None, *, mode: str = "train") -> None:
    """Run this process again (its command line, or ``argv`` after the interpreter) with the
    allocator setting, unless it has it.

    For commands that train or serve: the setting only takes effect at a process's start. Returns
    when the process already runs with it (or ``MASCOT_ALLOCATOR`` is set, e.g. to
    ``system``); otherwise it does not return (``os.execve``).

    Args:
        argv: The arguments after the interpreter; default this process's own.
        mode: What the process does (``MODES``).

    Raises:
        ValueError: on a bad ``MASCOT_ALLOCATOR`` or ``mode`` (see ``allocator_env``).
    """
    if os.environ.get(ALLOCATOR_ENV):
        return
    env = allocator_env(mode=mode)
    logger.debug("restarting with the %s allocator setting", env[ALLOCATOR_ENV])
    sys.stdout.flush()
    sys.stderr.flush()
    command = [sys.executable, *argv] if argv is not None else [sys.executable, *sys.orig_argv[1:]]
    os.execve(sys.executable, command, env)
