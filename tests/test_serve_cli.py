"""`mascot serve`: the local engine in its own process with `mascot chat` against it, the vLLM
command (dry run) and the user mistakes."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

from mascot.cli import main

MASCOT = str(Path(sys.executable).parent / "mascot")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_for_health(port: int, *, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            time.sleep(0.2)
    raise AssertionError(f"no server answered on port {port} within {seconds} s")


def test_serve_local_and_chat_against_it(tiny_model: Path, tmp_path: Path) -> None:
    port, client = free_port(), tmp_path / "client.yaml"
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "SERVE_KEY": "serve-key-0123456789"}
    server = subprocess.Popen([MASCOT, "serve", "--policies", str(tiny_model / "policies.yaml"), "--port", str(port),
                               "--api-key-env", "SERVE_KEY", "--client-policies", str(client)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        wait_for_health(port, seconds=30)
        roles = yaml.safe_load(client.read_text())["roles"]
        assert roles["anchor"]["model"] == "anchor" and roles["anchor"]["api_key_env"] == "SERVE_KEY"
        assert "serve-key" not in client.read_text()
        models = httpx.get(f"http://127.0.0.1:{port}/v1/models", timeout=10,
                           headers={"Authorization": "Bearer serve-key-0123456789"}).json()["data"]
        assert models[0]["id"] == tiny_model.name  # the folder's name, not its absolute path
        assert str(tiny_model) not in json.dumps([m["id"] for m in models])
        assert roles["default"]["model"] == tiny_model.name
        chat = subprocess.run([MASCOT, "chat", "--roster", "emotional_support", "--policies", str(client),
                               "--message", "I failed my exam.", "--max-tokens", "8", "--temperature", "1",
                               "--seed", "0", "--json"], env=env, capture_output=True, text=True, timeout=120)
        assert chat.returncode == 0, chat.stderr[-2000:]
        episode = json.loads(chat.stdout)
        assert episode["messages"][0]["role"] == "user" and len(episode["directions"]) >= 1
        assert f"127.0.0.1:{port}" in episode["policies"]["anchor"]
        reload = subprocess.run([MASCOT, "serve", "--reload", "--policies", str(tiny_model / "policies.yaml"),
                                 "--url", f"http://127.0.0.1:{port}/v1", "--api-key-env", "SERVE_KEY"],
                                env=env, capture_output=True, text=True, timeout=60)
        assert reload.returncode == 2 and "runtime adapter loading is disabled" in reload.stderr
    finally:
        server.terminate()
        server.wait(timeout=30)


def test_vllm_dry_run_prints_the_command(tiny_model: Path, capsys: pytest.CaptureFixture[str],
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SERVE_KEY", "secret-value-123456")
    assert main(["serve", "--engine", "vllm", "--dry-run", "--policies", str(tiny_model / "policies.yaml"),
                 "--api-key-env", "SERVE_KEY", "--allow-runtime-lora", "--port", "8100",
                 "--vllm-args", "--tensor-parallel-size 2"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("VLLM_CPU_KVCACHE_SPACE=") or line.startswith("VLLM_ALLOW_RUNTIME_LORA_UPDATING=True")
    assert "VLLM_ALLOW_RUNTIME_LORA_UPDATING=True VLLM_API_KEY=$SERVE_KEY " in line
    assert " -m vllm.entrypoints.openai.api_server --model " in line  # not the `vllm` script: it crashes on vllm-cpu
    assert f"anchor={tiny_model / 'adapters' / 'anchor'}" in line and "--max-lora-rank 8 --max-loras 4" in line
    assert "--served-model-name tiny-model" in line or f"--served-model-name {tiny_model.name}" in line
    assert line.endswith(" --tensor-parallel-size 2") and "secret-value" not in line


@pytest.mark.parametrize(("args", "message"), [
    (["--api-key-env", "NO_SUCH_VARIABLE_SET"], "the variable NO_SUCH_VARIABLE_SET is not set"),
    (["--reload"], "--reload needs --url"),
    (["--dry-run"], "are for --engine vllm"),
    (["--vllm-args", "--tensor-parallel-size 2"], "are for --engine vllm"),
    (["--engine", "vllm"], "MASCOT_VLLM_PYTHON=/no/such/python: no such interpreter"),
])
def test_serve_usage_errors(tiny_model: Path, args: list[str], message: str, capsys: pytest.CaptureFixture[str],
                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASCOT_VLLM_PYTHON", "/no/such/python")
    assert main(["serve", "--policies", str(tiny_model / "policies.yaml"), *args]) == 2
    stderr = capsys.readouterr().err
    assert message in stderr and len(stderr.strip().splitlines()) == 1


def test_serve_refuses_two_base_models(tmp_path: Path, tiny_model: Path, tiny_llama: Path,
                                       capsys: pytest.CaptureFixture[str]) -> None:
    policy = tmp_path / "two.yaml"
    policy.write_text(yaml.safe_dump({"version": 1, "roles": {"default": {"kind": "local", "model": str(tiny_model)},
                                                               "anchor": {"kind": "local", "model": str(tiny_llama)}}}))
    assert main(["serve", "--policies", str(policy)]) == 2
    assert "one server serves one base model" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(shutil.which("vllm") is None, reason="needs vLLM (its own GPU environment) on PATH")
def test_vllm_engine_serves_the_adapters(tiny_model: Path, tmp_path: Path) -> None:
    from langchain_openai import ChatOpenAI

    port, client = free_port(), tmp_path / "client.yaml"
    server = subprocess.Popen([MASCOT, "serve", "--engine", "vllm", "--policies", str(tiny_model / "policies.yaml"),
                               "--port", str(port), "--client-policies", str(client)],
                              env={**os.environ, "HF_HUB_OFFLINE": "1"})
    try:
        wait_for_health(port, seconds=600)
        url = f"http://127.0.0.1:{port}/v1"
        replies = {m: ChatOpenAI(base_url=url, api_key="EMPTY", model=m, temperature=0, max_tokens=8)
                   .invoke([("user", "hello")]).content for m in ("anchor", "catalyst")}
        assert len(set(replies.values())) == 2
    finally:
        server.terminate()
        server.wait(timeout=60)
