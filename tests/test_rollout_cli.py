"""`mascot rollout` end to end: secrets, tracing, workers, bad input (faults and crashes: tests/reliability)."""

from __future__ import annotations

import http.server
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from mascot.testing.stub_server import StubConfig, start_stub_server

MASCOT = str(Path(sys.executable).parent / "mascot")
SECRET = "sk-test-4f1d9c0e7b2a85e6d3c1"


def rollout(*args: str, env: dict[str, str] | None = None, timeout: float = 240,
            verbose: bool = False) -> subprocess.CompletedProcess[str]:
    command = [MASCOT, *(["-v"] if verbose else []), "rollout", "--roster", "emotional_support", *args]
    return subprocess.run(command, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def content(record: dict[str, Any]) -> dict[str, Any]:
    """An episode record without the fields that time it."""
    record = {k: v for k, v in record.items() if k not in ("created_at", "duration_s")}
    record["messages"] = [{k: v for k, v in m.items() if k != "latency_s"} for m in record["messages"]]
    return record


def stop_midway(args: list[str], out: Path, signum: int, *, after: int) -> None:
    """Start a rollout and send it ``signum`` once ``out`` holds ``after`` episodes."""
    process = subprocess.Popen([MASCOT, "rollout", "--roster", "emotional_support", *args],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and (not out.exists() or out.read_text().count("\n") < after):
        time.sleep(0.05)
    process.send_signal(signum)
    process.wait(timeout=30)


def test_secrets_never_reach_traces_logs_or_files(tmp_path: Path) -> None:
    out, trace = tmp_path / "episodes.jsonl", tmp_path / "trace.jsonl"
    with start_stub_server(StubConfig(echo_auth=True)) as server:  # a server that leaks the key back
        result = rollout("--base-url", server.url, "--model", "stub", "--api-key-env", "MY_SERVER_KEY",
                         "--episodes", "2", "--max-rounds", "2", "--out", str(out), "--trace", str(trace),
                         env={"MY_SERVER_KEY": SECRET}, verbose=True)
    assert result.returncode == 0, result.stderr
    written = [out.read_text(), trace.read_text(), result.stdout, result.stderr]
    assert not any(SECRET in text for text in written)
    assert "Bearer ***" in trace.read_text()  # the leak was there, and masked
    calls = lines(trace)
    assert {c["role"] for c in calls} >= {"director", "user"}
    assert any(c["role"] in ("anchor", "catalyst", "beacon", "action_guide") for c in calls)
    call = calls[0]
    assert call["prompt"] and call["reply"] and call["latency_s"] >= 0 and call["usage"]["output_tokens"] > 0
    assert call["episode_id"] in {r["id"] for r in lines(out)} and call["model"] == "stub"


def test_concurrent_rollout_on_the_local_backend_is_race_free(tiny_model: Path, tmp_path: Path) -> None:
    policies = str(tiny_model / "policies.yaml")
    common = ["--policies", policies, "--episodes", "3", "--max-rounds", "1", "--max-tokens", "6", "--seed", "2"]
    serial = rollout(*common, "--concurrency", "1", "--out", str(tmp_path / "serial.jsonl"))
    parallel = rollout(*common, "--concurrency", "3", "--out", str(tmp_path / "parallel.jsonl"))
    assert serial.returncode == 0 and parallel.returncode == 0, serial.stderr + parallel.stderr
    one, many = lines(tmp_path / "serial.jsonl"), lines(tmp_path / "parallel.jsonl")
    assert [content(r) for r in many] == [content(r) for r in one]
    turns = [m for r in many for m in r["messages"] if m["role"] == "assistant"]
    assert turns and all(m["policy"]["adapter"] == m["name"] for m in turns)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--out", "/nonexistent-dir/e.jsonl"], "directory of /nonexistent-dir/e.jsonl does not exist"),
        (["--scenarios", "{bad}", "--out", "{out}"], "bad.jsonl:1: expected a mapping"),
        (["--profiles", "{bad}", "--out", "{out}"], "bad.jsonl:1: expected a mapping"),
        (["--concurrency", "0", "--out", "{out}"], "must be >= 1"),
        (["--out", "{out}", "--failures", "{out}"], "must be different files"),
        (["--out", "/dev/full"], "/dev/full is not a regular file"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(tmp_path: Path, args: list[str], message: str) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text("[1, 2]\n")
    args = [a.format(bad=bad, out=tmp_path / "e.jsonl") for a in args]
    result = rollout("--base-url", "http://127.0.0.1:9/v1", "--model", "stub", "--episodes", "1", *args)
    assert result.returncode == 2
    assert message in result.stderr.strip().splitlines()[-1]  # argparse may print its usage above
    assert "Traceback" not in result.stderr


class _LangSmithEndpoint(http.server.BaseHTTPRequestHandler):
    """A stand-in LangSmith API on 127.0.0.1 that keeps every request body."""

    bodies: list[bytes] = []

    def _answer(self) -> None:
        self.bodies.append(self.rfile.read(int(self.headers.get("Content-Length") or 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")

    do_GET = do_POST = do_PATCH = _answer

    def log_message(self, *args: Any) -> None:
        pass


def test_langsmith_tracing_with_the_standard_variables(tmp_path: Path) -> None:
    endpoint = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _LangSmithEndpoint)
    threading.Thread(target=endpoint.serve_forever, daemon=True).start()
    out = tmp_path / "episodes.jsonl"
    try:
        with start_stub_server() as server:
            result = rollout("--base-url", server.url, "--model", "stub", "--api-key-env", "MY_SERVER_KEY",
                             "--episodes", "1", "--max-rounds", "1", "--out", str(out),
                             env={"LANGSMITH_TRACING": "true", "LANGSMITH_API_KEY": "lsv2-test-0123456789",
                                  "LANGSMITH_ENDPOINT": f"http://127.0.0.1:{endpoint.server_port}",
                                  "MY_SERVER_KEY": SECRET})
    finally:
        endpoint.shutdown()
    assert result.returncode == 0, result.stderr
    sent = b"".join(_LangSmithEndpoint.bodies)
    assert b"mascot rollout" in sent and lines(out)[0]["id"].encode() in sent  # runs carry the episode id
    assert SECRET.encode() not in sent


def test_workers_share_one_plan_and_files(tmp_path: Path) -> None:
    out, trace = tmp_path / "episodes.jsonl", tmp_path / "trace.jsonl"
    config = StubConfig(latency_s=0.01, fail_rate=0.2, faults=("500", "429"), seed=4)
    with start_stub_server(config) as server:
        args = ["--base-url", server.url, "--model", "stub", "--episodes", "10", "--concurrency", "4",
                "--workers", "2", "--max-rounds", "2", "--out", str(out), "--trace", str(trace)]
        first = rollout(*args)
        again = rollout(*args)
    assert first.returncode == 0, first.stderr
    assert "rollout: 10/10 episodes" in first.stdout and "(10 new, 0 already there)" in first.stdout
    assert "(0 new, 10 already there)" in again.stdout
    records = lines(out)
    plan_order = [r["id"] for r in records]
    assert len(set(plan_order)) == 10
    assert {c["episode_id"] for c in lines(trace)} == set(plan_order)  # both workers traced


def test_workers_need_server_policies(tiny_model: Path, tmp_path: Path) -> None:
    result = rollout("--model", str(tiny_model), "--episodes", "2", "--workers", "2",
                     "--out", str(tmp_path / "e.jsonl"))
    assert result.returncode == 2 and "--workers needs every role on a server" in result.stderr


def test_stopping_the_parent_stops_its_workers(tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    with start_stub_server(StubConfig(latency_s=0.05)) as server:
        args = ["--base-url", server.url, "--model", "stub", "--episodes", "16", "--concurrency", "4",
                "--workers", "2", "--max-rounds", "2", "--out", str(out)]
        stop_midway(args, out, signal.SIGTERM, after=2)
        time.sleep(1.0)  # workers watch their parent

        def workers() -> list[str]:
            found = []
            for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
                try:
                    text = cmdline.read_bytes().decode(errors="replace")
                except OSError:
                    continue
                if "--shard" in text and str(out) in text:
                    found.append(text)
            return found

        assert workers() == []
        result = rollout(*args)
    assert result.returncode == 0, result.stderr
    records = lines(out)
    assert len(records) == len({r["id"] for r in records}) == 16
