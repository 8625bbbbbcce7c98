"""Giving a test process's freed memory back to the system."""

from __future__ import annotations

import ctypes
import gc
from pathlib import Path


def trim_memory() -> None:
    """Collect garbage and return freed heap pages to the system (glibc's ``malloc_trim``): the
    suite runs beside vLLM engines on a 24 GiB machine, and the buffers of a model trained in
    this process otherwise stay in its heap."""
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:  # not glibc: nothing to trim
        pass


def resident_mib() -> int:
    """This process's resident memory in MiB (``VmRSS``)."""
    line = next(line for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmRSS"))
    return int(line.split()[1]) // 1024
