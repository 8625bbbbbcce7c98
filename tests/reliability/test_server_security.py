"""Server security: ``mascot serve`` (the local engine) under a scripted attack list — missing
and wrong keys, adapter paths that escape the adapters folder, oversized and malformed
bodies, absurd sampling requests, hidden routes — answers each with the right refusal, keeps
serving, never logs the key, and (like the stub server) listens on 127.0.0.1 only."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from helpers import MASCOT
from suite_tally import count

KEY = "sk-reliability-9c1e5f0a7d3b2468"
TCP_LISTEN = "0A"


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def served(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """``mascot serve`` on the tiny model with a key and runtime adapter loading, default host."""
    root = tmp_path_factory.mktemp("secure")
    shutil.copytree(tiny_model / "adapters", root / "adapters")
    outside = root.parent / f"{root.name}-outside"
    shutil.copytree(tiny_model / "adapters" / "beacon", outside)
    (root / "adapters" / "sneaky").symlink_to(outside)
    policy = {"version": 1, "defaults": {"kind": "local", "model": str(tiny_model)},
              "roles": {"default": {}, "anchor": {"adapter": "adapters/anchor", "version": "1"}}}
    (root / "policies.yaml").write_text(yaml.safe_dump(policy))
    port = free_port()
    log = root / "server.log"
    with log.open("w") as sink:
        process = subprocess.Popen(
            [MASCOT, "-v", "serve", "--policies", str(root / "policies.yaml"), "--port", str(port), "--api-key-env",
             "SERVE_KEY", "--allow-runtime-lora", "--adapters-dir", str(root / "adapters"), "--max-tokens-cap", "16"],
            stdout=sink, stderr=subprocess.STDOUT, env={**os.environ, "HF_HUB_OFFLINE": "1", "SERVE_KEY": KEY})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while True:
        assert process.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server did not start"
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    yield {"url": url, "pid": process.pid, "port": port, "log": log, "outside": outside}
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)


AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = {"model": "anchor", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
# (what, method, path, headers, body, expected status)
ATTACKS: list[tuple[str, str, str, dict[str, str], Any, int]] = [
    ("no key", "GET", "/v1/models", {}, None, 401),
    ("no key, chat", "POST", "/v1/chat/completions", {}, CHAT, 401),
    ("no key, load adapter", "POST", "/v1/load_lora_adapter", {}, {"lora_name": "x", "lora_path": "anchor"}, 401),
    ("wrong key", "GET", "/v1/models", {"Authorization": "Bearer sk-wrong"}, None, 401),
    ("key prefix only", "GET", "/v1/models", {"Authorization": f"Bearer {KEY[:-1]}"}, None, 401),
    ("key with extra", "GET", "/v1/models", {"Authorization": f"Bearer {KEY}x"}, None, 401),
    ("key without Bearer", "GET", "/v1/models", {"Authorization": KEY}, None, 401),
    ("basic auth", "GET", "/v1/models", {"Authorization": "Basic c2s6c2s="}, None, 401),
    ("key in the query", "GET", f"/v1/models?api_key={KEY}", {}, None, 401),
    ("path traversal", "POST", "/v1/load_lora_adapter", AUTH, {"lora_name": "evil", "lora_path": "../../etc"}, 400),
    ("absolute path", "POST", "/v1/load_lora_adapter", AUTH, {"lora_name": "evil", "lora_path": "/etc"}, 400),
    ("dot-dot inside", "POST", "/v1/load_lora_adapter", AUTH,
     {"lora_name": "evil", "lora_path": "anchor/../../.."}, 400),
    ("symlink out", "POST", "/v1/load_lora_adapter", AUTH, {"lora_name": "evil", "lora_path": "sneaky"}, 400),
    ("URL-encoded traversal", "POST", "/v1/load_lora_adapter", AUTH,
     {"lora_name": "evil", "lora_path": "%2e%2e/%2e%2e/etc"}, 400),
    ("NUL byte in path", "POST", "/v1/load_lora_adapter", AUTH, {"lora_name": "evil", "lora_path": "anchor\x00"}, 400),
    ("name with a slash", "POST", "/v1/load_lora_adapter", AUTH, {"lora_name": "../x", "lora_path": "anchor"}, 400),
    ("unload an unknown adapter", "POST", "/v1/unload_lora_adapter", AUTH, {"lora_name": "nobody"}, 404),
    ("oversized body", "POST", "/v1/chat/completions", AUTH,
     {**CHAT, "messages": [{"role": "user", "content": "x" * (2 << 20)}]}, 413),
    ("lying Content-Length", "POST", "/v1/chat/completions", {**AUTH, "Content-Length": "abc"}, b"{}", 400),
    ("deeply nested JSON", "POST", "/v1/chat/completions", {**AUTH, "Content-Type": "application/json"},
     b"[" * 100_000 + b"]" * 100_000, 400),
    ("not JSON", "POST", "/v1/chat/completions", {**AUTH, "Content-Type": "application/json"}, b"{nope", 400),
    ("wrong types", "POST", "/v1/chat/completions", AUTH, {"model": 5, "messages": "hi"}, 400),
    ("n too large", "POST", "/v1/chat/completions", AUTH, {**CHAT, "n": 10**9}, 400),
    ("temperature out of range", "POST", "/v1/chat/completions", AUTH, {**CHAT, "temperature": 1e9}, 400),
    ("unknown model", "POST", "/v1/chat/completions", AUTH, {**CHAT, "model": "../../etc/passwd"}, 404),
    ("API docs", "GET", "/docs", {}, None, 404),
    ("OpenAPI schema", "GET", "/openapi.json", {}, None, 404),
    ("wrong method", "GET", "/v1/chat/completions", AUTH, None, 405),
]


def _send(url: str, method: str, path: str, headers: dict[str, str], body: Any) -> httpx.Response:
    if isinstance(body, bytes):
        return httpx.request(method, url + path, headers=headers, content=body, timeout=30)
    return httpx.request(method, url + path, headers=headers, json=body, timeout=30)


@pytest.mark.parametrize(("what", "method", "path", "headers", "body", "status"), ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_is_refused(served: dict[str, Any], what: str, method: str, path: str, headers: dict[str, str],
                           body: Any, status: int) -> None:
    if what == "lying Content-Length":  # httpx would fix the header: send it raw
        with socket.create_connection(("127.0.0.1", served["port"]), timeout=10) as raw:
            raw.sendall(f"POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {KEY}\r\n"
                        "Content-Length: abc\r\n\r\n{}".encode())
            answer = raw.recv(4096).decode("latin-1")
        count(inputs_tried=1)
        assert answer.split(" ", 2)[1] == str(status), answer
        return
    response = _send(served["url"], method, path, headers, body)
    count(inputs_tried=1)
    assert response.status_code == status, f"{what}: {response.status_code} {response.text[:200]}"
    assert KEY not in response.text
    if path.startswith("/v1") and status != 405:
        assert "error" in response.json(), response.text[:200]


def test_still_serving_and_the_key_never_logged(served: dict[str, Any]) -> None:
    reply = httpx.post(served["url"] + "/v1/chat/completions", headers=AUTH, json=CHAT, timeout=60)
    assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"] is not None
    models = {m["id"] for m in httpx.get(served["url"] + "/v1/models", headers=AUTH).json()["data"]}
    assert "evil" not in models and "x" not in models  # nothing was loaded by an attack
    log = served["log"].read_text()
    assert KEY not in log and "Traceback" not in log


def _listening(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed between listing and reading
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for table, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for row in Path(table).read_text().splitlines()[1:]:
            fields = row.split()
            if fields[3] == TCP_LISTEN and fields[9] in inodes:
                address, port = fields[1].split(":")
                found.append((_address(address, width), int(port, 16)))
    return found


def _address(hexed: str, width: int) -> str:
    raw = bytes.fromhex(hexed)
    if width == 8:
        return socket.inet_ntop(socket.AF_INET, raw[::-1])
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, 16, 4))
    return socket.inet_ntop(socket.AF_INET6, words)


def test_servers_listen_on_loopback_only(served: dict[str, Any]) -> None:
    sockets = _listening(served["pid"])
    assert sockets and all(address in ("127.0.0.1", "::1") for address, _ in sockets), sockets
    stub = subprocess.Popen([sys.executable, "-m", "mascot.testing.stub_server"], stdout=subprocess.PIPE, text=True)
    try:
        assert stub.stdout is not None and "http://127.0.0.1:" in stub.stdout.readline()
        stub_sockets = _listening(stub.pid)
    finally:
        stub.terminate()
        stub.wait(timeout=10)
    assert stub_sockets and all(address == "127.0.0.1" for address, _ in stub_sockets), stub_sockets
    refused = subprocess.run([sys.executable, "-m", "mascot.testing.stub_server", "--host", "0.0.0.0"],
                             capture_output=True, text=True, timeout=30)
    assert refused.returncode == 2 and "refusing non-loopback" in refused.stderr
    count(inputs_tried=3)
