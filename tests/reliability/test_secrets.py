"""Secrets: a sentinel API key set in the environment — sent to a model server that echoes it
back in every reply, and set as the Hugging Face token — never appears in any file the
project writes (episodes, traces, judgements, caches, eval reports and pages, policy files,
model cards, logs) nor in its output."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from helpers import mascot, write_warm_over_curt_pairs
from suite_tally import count

from mascot.cli import main
from mascot.testing.stub_server import StubConfig, start_stub_server

SENTINEL = "sk-SENTINEL-7f3a9d21c4e8b065"
ENV = {"SERVER_KEY": SENTINEL, "HF_TOKEN": SENTINEL, "HUGGING_FACE_HUB_TOKEN": SENTINEL}


def scan(root: Path, outputs: list[str]) -> int:
    """Files and outputs checked; fails naming any that holds the sentinel."""
    files = [p for p in root.rglob("*") if p.is_file()]
    leaks = [str(p) for p in files if SENTINEL.encode() in p.read_bytes()]
    leaks += [f"output {i}" for i, text in enumerate(outputs) if SENTINEL in text]
    assert not leaks, f"the key reached {leaks}"
    return len(files) + len(outputs)


def test_the_key_reaches_no_file_nor_output(tiny_model: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    outputs: list[str] = []

    def run(*args: str) -> None:
        result = mascot("-v", *args, env=ENV)
        outputs.extend([result.stdout, result.stderr])
        assert result.returncode == 0, result.stderr[-3000:]

    with start_stub_server(StubConfig(echo_auth=True)) as server:  # every reply carries "Bearer <key>"
        served = ["--base-url", server.url, "--model", "stub", "--api-key-env", "SERVER_KEY"]
        run("rollout", "--roster", "emotional_support", *served, "--episodes", "2", "--max-rounds", "2",
            "--out", str(tmp_path / "episodes.jsonl"), "--trace", str(tmp_path / "trace.jsonl"))
        run("judge", "--in", str(tmp_path / "episodes.jsonl"), "--rubric", "persona", "--roster", "emotional_support",
            *served, "--out", str(tmp_path / "judgements.jsonl"))
        policies = tmp_path / "policies.yaml"
        policies.write_text(yaml.safe_dump({"version": 1, "defaults": {
            "kind": "openai", "base_url": server.url, "model": "stub", "api_key_env": "SERVER_KEY"},
            "roles": {"default": {}}}))
        run("eval", "--roster", "emotional_support", "--policies", str(policies), "--baselines", "round_robin",
            "--episodes", "1", "--max-rounds", "1", "--judge-policies", str(policies), "--out", str(tmp_path / "eval"))
    run("serve", "--policies", str(tiny_model / "policies.yaml"), "--engine", "vllm", "--dry-run", "--api-key-env",
        "SERVER_KEY", "--client-policies", str(tmp_path / "client-policies.yaml"))
    for name, value in ENV.items():
        monkeypatch.setenv(name, value)
    # in this process, whose training imports are paid already
    pairs = write_warm_over_curt_pairs(tmp_path / "episodes.jsonl", tmp_path / "pairs")
    assert main(["train-rm", "--pairs", str(pairs), "--base", str(tiny_model), "--out", str(tmp_path / "rm"),
                 "--max_steps", "1"]) == 0
    outputs.extend(capsys.readouterr())
    assert "Bearer ***" in (tmp_path / "trace.jsonl").read_text()  # the echoed key was there, masked
    checked = scan(tmp_path, outputs)
    count(inputs_tried=checked)
    assert checked > 20
