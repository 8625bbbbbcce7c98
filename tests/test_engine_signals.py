"""`mascot serve --engine vllm` stops the engine it started on SIGTERM (what systemd, Docker and
Kubernetes send): every process of the engine is gone after it exits, and its port is free.

SIGHUP and Ctrl-C take the same way out (``stop_on_signals`` turns SIGTERM and SIGHUP into
the ``KeyboardInterrupt`` Ctrl-C raises; ``test_signals`` checks that for all three), so one
engine start per signal would add minutes to CI for the same path: set
``MASCOT_TEST_ALL_SIGNALS=1`` to run all three here."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from mascot.policies.vllm import VllmError, vllm_python

pytestmark = [pytest.mark.vllm, pytest.mark.real_model]

MASCOT = str(Path(sys.executable).parent / "mascot")


def _engine() -> str | None:
    try:
        return vllm_python()
    except VllmError:
        return None


def descendants(pid: int) -> set[int]:
    """Every live process under ``pid`` (read from /proc)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone while we read
            continue
        children.setdefault(int(fields[1]), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def alive(pids: set[int]) -> set[int]:
    """Those of ``pids`` that still run (zombies count as gone)."""
    left = set()
    for pid in pids:
        try:
            state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            left.add(pid)
    return left


SIGNALS = [signal.SIGTERM, signal.SIGHUP, signal.SIGINT] if os.environ.get("MASCOT_TEST_ALL_SIGNALS") else [
    signal.SIGTERM]


@pytest.mark.skipif(_engine() is None, reason="no vLLM environment: run scripts/install --vllm")
@pytest.mark.parametrize("sig", SIGNALS)
def test_serve_leaves_no_engine_process_after_a_signal(sig: signal.Signals, offline_model: Path,
                                                      tmp_path: Path) -> None:
    policies = tmp_path / "policies.yaml"
    policies.write_text(yaml.safe_dump({"version": 1, "defaults": {"kind": "local", "model": str(offline_model)},
                                        "roles": {"default": {}}}))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    log = tmp_path / "serve.log"
    with log.open("w") as stderr:
        # eager: a bare base's start compiles the model for ~50 s on a CPU (vLLM 0.32 recompiles on
        # every start); the processes to stop are the same
        process = subprocess.Popen([MASCOT, "serve", "--engine", "vllm", "--policies", str(policies), "--port",
                                    str(port), "--vllm-args=--enforce-eager"], stdout=subprocess.DEVNULL,
                                   stderr=stderr,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and process.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=5).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(2)
        assert process.poll() is None, log.read_text()[-3000:]
        engine = descendants(process.pid)
        assert len(engine) >= 2  # the API server and its engine core at least
        process.send_signal(sig)
        assert process.wait(timeout=180) == 130, log.read_text()[-3000:]
        deadline = time.monotonic() + 30
        while alive(engine) and time.monotonic() < deadline:
            time.sleep(1)
        assert not alive(engine), f"left running after {sig.name}: {sorted(alive(engine))}"
        with socket.socket() as again:  # the port is free again
            again.bind(("127.0.0.1", port))
        # mascot's own traceback starts a line; vLLM's shutdown may log one of its own, prefixed
        assert not [line for line in log.read_text().splitlines() if line.startswith("Traceback")]
    finally:
        if process.poll() is None:
            process.kill()
        for pid in alive(descendants(process.pid)):
            os.kill(pid, signal.SIGKILL)
