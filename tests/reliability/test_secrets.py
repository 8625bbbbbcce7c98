"""Secrets: a sentinel API key set in the environment — sent to a model server that echoes it
back in every reply, and set as the Hugging Face token — never appears in any file the
project writes (episodes, traces, judgements, caches, eval reports and pages, policy files,
model cards, logs) nor in its output."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from mascot.cli import main
from mascot.stub_server import StubConfig, start_stub_server

from helpers import mascot
from suite_tally import count

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
    assert main(["train-rm", "--pairs", str(_pairs(tmp_path)), "--base", str(tiny_model), "--out", str(tmp_path / "rm"),
                 "--max_steps", "1"]) == 0
    outputs.extend(capsys.readouterr())
    assert "Bearer ***" in (tmp_path / "trace.jsonl").read_text()  # the echoed key was there, masked
    checked = scan(tmp_path, outputs)
    count(inputs_tried=checked)
    assert checked > 20


def _pairs(tmp_path: Path) -> Path:
    """A few preference pairs from the rolled-out episodes."""
    from mascot.policies.local_chat import to_chat
    from mascot.rosters import load_roster
    from mascot.training.candidates import candidate_contexts
    from mascot.training.episode import read_episodes
    from mascot.training.pairs import JudgedCandidate, build_pairs, write_pairs

    roster = load_roster("emotional_support")
    judged = [JudgedCandidate(context_id=c.context_id, prompt=to_chat(c.prompt), persona=c.persona, reply=reply,
                              overall=overall)
              for c in candidate_contexts(read_episodes(tmp_path / "episodes.jsonl"), roster)
              for reply, overall in (("I hear you; what would help?", 90.0), ("fine.", 10.0))]
    write_pairs(build_pairs(judged, test_fraction=0.0), tmp_path / "pairs")
    return tmp_path / "pairs"


@pytest.mark.parametrize("flag", ["--api-key-env", "--judge-api-key-env"])
def test_a_key_on_the_command_line_is_not_echoed_in_errors(flag: str, tmp_path: Path) -> None:
    """Naming the key itself where a variable name belongs gets an error that does not repeat it."""
    args = {"--api-key-env": ["rollout", "--roster", "emotional_support", "--base-url", "http://127.0.0.1:9/v1",
                              "--model", "m", "--api-key-env", SENTINEL, "--out", str(tmp_path / "e.jsonl")],
            "--judge-api-key-env": ["eval", "--roster", "emotional_support", "--policies", str(tmp_path / "p.yaml"),
                                    "--judge-model", "m", "--judge-base-url", "http://127.0.0.1:9/v1",
                                    "--judge-api-key-env", SENTINEL, "--out", str(tmp_path / "eval")]}[flag]
    (tmp_path / "p.yaml").write_text("version: 1\nroles:\n  default: {kind: openai, base_url: 'http://127.0.0.1:9/v1', "
                                     "model: m}\n")
    result = mascot(*args, env=ENV)
    count(inputs_tried=1)
    assert result.returncode == 2 and SENTINEL not in result.stdout + result.stderr, result.stderr
