"""The local backend's dtype: bf16 where the hardware computes it natively, else fp32."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from mascot.policies.local import LocalBackend, precision
from mascot.policies.local.precision import DTYPES, cpu_has_native_bf16, default_dtype, resolve_dtype

FLAGS = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw {extra}\nbugs\t\t: spectre_v1\n"


def cpuinfo(tmp_path: Path, extra: str) -> Path:
    path = tmp_path / f"cpuinfo-{extra or 'plain'}"
    path.write_text(FLAGS.format(extra=extra))
    return path


def test_native_bf16_is_read_from_the_cpu_flags(tmp_path: Path) -> None:
    assert cpu_has_native_bf16(cpuinfo(tmp_path, "avx512_bf16"))
    assert cpu_has_native_bf16(cpuinfo(tmp_path, "amx_tile amx_bf16"))
    assert not cpu_has_native_bf16(cpuinfo(tmp_path, ""))  # AVX-512 alone only emulates bf16
    assert not cpu_has_native_bf16(tmp_path / "missing")


def test_the_default_follows_the_hardware(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(precision, "_CPUINFO", cpuinfo(tmp_path, "avx512_bf16"))
    assert default_dtype("cpu") is torch.bfloat16
    monkeypatch.setattr(precision, "_CPUINFO", cpuinfo(tmp_path, ""))
    assert default_dtype("cpu") is torch.float32
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert default_dtype("cuda:0") is torch.bfloat16
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert default_dtype("cuda") is torch.float32


def test_explicit_names_override_and_bad_ones_list_the_valid(tiny_model: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    assert resolve_dtype("float16", "cpu") is torch.float16 and resolve_dtype("auto", "cpu") == "auto"
    assert resolve_dtype(None, "cpu") is default_dtype("cpu")
    with pytest.raises(ValueError, match="unknown dtype 'bf16'; valid: auto, bfloat16, float16, float32"):
        LocalBackend.load(str(tiny_model), dtype="bf16")
    with caplog.at_level(logging.INFO, logger="mascot.policies.local.model_loading"):
        backend = LocalBackend.load(str(tiny_model), dtype="float32")
    assert backend.model.dtype is torch.float32 and "in float32" in caplog.text
    assert LocalBackend.load(str(tiny_model)).model.dtype is default_dtype("cpu")
    assert LocalBackend.load(str(tiny_model), dtype="bfloat16").generate(
        [[{"role": "user", "content": "hi"}]], max_new_tokens=3)[0].completion_tokens == 3
    assert DTYPES == ("auto", "bfloat16", "float16", "float32")
