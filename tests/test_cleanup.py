"""A command stops the engine it started however it ends: its own error, SIGTERM, SIGHUP or
Ctrl-C (``args.cleanup``), and no process of the engine is left.

The engine here is a stand-in for vLLM's API server (``$MASCOT_VLLM_PYTHON`` names it): it
answers ``/v1/models`` as vLLM does, starts a worker process of its own as vLLM's engine
core does, and answers every completion with 404 (an unknown model), which ``mascot chat``
reports as one error line. The real engine's signals are in ``test_engine_signals``.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest
from test_engine_signals import alive

ENGINE = textwrap.dedent('''
    import json, subprocess, sys
    from http.server import BaseHTTPRequestHandler, HTTPServer

    port = int(sys.argv[sys.argv.index("--port") + 1])
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # the "engine core"
    with open(sys.argv[-1], "w") as pids:
        pids.write(f"{worker.pid}\\n")

    class Handler(BaseHTTPRequestHandler):
        def _answer(self, code, body):
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            self._answer(200, {"object": "list", "data": [{"id": "tiny", "object": "model"}]})

        def do_POST(self):
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self._answer(404, {"error": {"message": "no such model", "type": "NotFoundError", "code": 404}})

        def log_message(self, *args):
            pass

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()
''')


def test_a_failing_command_stops_the_engine_it_started(tiny_model: Path, tmp_path: Path) -> None:
    pids = tmp_path / "engine.pids"
    (tmp_path / "engine.py").write_text(ENGINE, encoding="utf-8")
    python = tmp_path / "python"  # called as vLLM's interpreter: python -m vllm... --port N ...
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "engine.py"}" "$@" "{pids}"\n',
                      encoding="utf-8")
    python.chmod(0o755)
    env = {**os.environ, "MASCOT_VLLM_PYTHON": str(python), "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [sys.executable, "-m", "mascot", "chat", "--roster", "emotional_support", "--model", str(tiny_model),
         "--engine", "vllm", "--max-tokens", "8", "--message", "hello"],
        capture_output=True, text=True, timeout=240, env=env)
    assert result.returncode == 2, result.stderr[-3000:]
    assert "mascot: error: the model server answered 404" in result.stderr and "Traceback" not in result.stderr
    worker = int(pids.read_text().split()[0])  # the engine ran, and started its worker
    deadline = time.monotonic() + 10
    while alive({worker}) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive({worker}), "the engine's worker outlived the command"
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "engine.py")], capture_output=True, text=True).stdout.split()
    assert not left, f"engine processes left: {left}"


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_serve_stops_its_engine_on_every_signal(sig: signal.Signals, tiny_model: Path, tmp_path: Path) -> None:
    pids = tmp_path / "engine.pids"
    (tmp_path / "engine.py").write_text(ENGINE, encoding="utf-8")
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "{tmp_path / "engine.py"}" "$@" "{pids}"\n',
                      encoding="utf-8")
    python.chmod(0o755)
    policies = tmp_path / "policies.yaml"
    policies.write_text(f"version: 1\nroles:\n  default: {{kind: local, model: {tiny_model}}}\n", encoding="utf-8")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    env = {**os.environ, "MASCOT_VLLM_PYTHON": str(python), "HF_HUB_OFFLINE": "1"}
    process = subprocess.Popen([sys.executable, "-m", "mascot", "serve", "--policies", str(policies), "--engine",
                                "vllm", "--port", str(port)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, env=env)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.5)
    assert process.poll() is None, process.communicate()[1][-2000:]
    worker = int(pids.read_text().split()[0])
    process.send_signal(sig)
    _, err = process.communicate(timeout=60)
    assert "Traceback" not in err, err[-2000:]
    time.sleep(0.5)
    assert not alive({worker}), f"the engine's worker outlived {sig.name}"
    left = subprocess.run(["pgrep", "-f", str(tmp_path / "engine.py")], capture_output=True, text=True).stdout.split()
    assert not left, f"engine processes left after {sig.name}: {left}"
