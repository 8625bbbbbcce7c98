"""The training-data pipeline end to end through the CLI, offline: rollout -> judge ->
candidates -> judge -> pairs -> train-rm on the tiny model, with the stub server judging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mascot.stub_server import start_stub_server

MASCOT = str(Path(sys.executable).parent / "mascot")


def mascot(*args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([MASCOT, *args], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, f"mascot {args[0]}: {result.stderr[-2000:]}"
    return result


def test_rollout_judge_candidates_pairs_train_rm(tiny_model: Path, tmp_path: Path) -> None:
    local = ["--roster", "emotional_support", "--policies", str(tiny_model / "policies.yaml"), "--max-tokens", "12"]
    episodes, candidates = tmp_path / "episodes.jsonl", tmp_path / "candidates.jsonl"
    mascot("rollout", *local, "--episodes", "3", "--max-rounds", "1", "--out", str(episodes))
    mascot("candidates", "--in", str(episodes), *local, "--k", "3", "--out", str(candidates))
    with start_stub_server() as server:
        judge = ["--roster", "emotional_support", "--base-url", server.url, "--model", "stub-judge"]
        groups = mascot("judge", "--in", str(episodes), "--rubric", "group", "--block-turns", "2", *judge,
                        "--out", str(tmp_path / "blocks.jsonl"))
        judged = mascot("judge", "--in", str(candidates), "--rubric", "persona", *judge,
                        "--out", str(tmp_path / "judged.jsonl"))
        again = mascot("judge", "--in", str(candidates), "--rubric", "persona", *judge,
                       "--out", str(tmp_path / "judged.jsonl"))
        calls = server.stats()["requests"]
    assert "0 failed" in groups.stdout and "0 failed" in judged.stdout
    assert "0 judged" in again.stdout and calls == server_calls_for(tmp_path)  # the rerun asked nothing
    blocks = [json.loads(line) for line in (tmp_path / "blocks.jsonl").read_text().splitlines()]
    assert blocks and all(b["rubric"] == "group" and 0 <= b["overall"] <= 100 for b in blocks)
    pairs = mascot("pairs", "--in", str(tmp_path / "judged.jsonl"), "--test-fraction", "0.3",
                   "--out", str(tmp_path / "pairs"))
    assert "pairs:" in pairs.stdout
    train = [json.loads(line) for line in (tmp_path / "pairs" / "train.jsonl").read_text().splitlines()]
    assert train and all(p["margin"] >= 0.5 and p["chosen"][0]["role"] == "assistant" for p in train)
    rm = mascot("train-rm", "--pairs", str(tmp_path / "pairs"), "--base", str(tiny_model),
                "--out", str(tmp_path / "rm"))
    assert "train-rm:" in rm.stdout and (tmp_path / "rm" / "reward_model.json").is_file()


def test_group_reward_model_from_block_judgements(tiny_model: Path, tmp_path: Path, roster) -> None:
    """Repeated rollouts of one scenario and person give blocks after the same opening."""
    scenario, profile = tmp_path / "one.jsonl", tmp_path / "person.jsonl"
    scenario.write_text(Path(roster_scenarios()).read_text().splitlines()[0] + "\n")
    profile.write_text(json.dumps(roster.user_profiles[0].model_dump()) + "\n")
    episodes = tmp_path / "episodes.jsonl"
    mascot("rollout", "--roster", "emotional_support", "--policies", str(tiny_model / "policies.yaml"),
           "--max-tokens", "12", "--episodes", "6", "--max-rounds", "1", "--scenarios", str(scenario),
           "--profiles", str(profile), "--out", str(episodes))
    with start_stub_server() as server:
        mascot("judge", "--in", str(episodes), "--rubric", "group", "--block-turns", "4", "--roster",
               "emotional_support", "--base-url", server.url, "--model", "stub-judge",
               "--out", str(tmp_path / "blocks.jsonl"))
    pairs = mascot("pairs", "--in", str(tmp_path / "blocks.jsonl"), "--episodes", str(episodes),
                   "--test-fraction", "0", "--out", str(tmp_path / "group-pairs"))
    train = [json.loads(line) for line in (tmp_path / "group-pairs" / "train.jsonl").read_text().splitlines()]
    assert train and {p["persona"] for p in train} == {"group"}
    assert len({p["context_id"] for p in train}) == 1  # every block follows the same opening
    assert train[0]["prompt"][-1]["role"] == "user" and ": " in train[0]["chosen"][0]["content"]
    rm = mascot("train-rm", "--pairs", str(tmp_path / "group-pairs"), "--base", str(tiny_model),
                "--out", str(tmp_path / "rm-group"))
    assert "train-rm:" in rm.stdout and "pairs:" in pairs.stdout


def roster_scenarios() -> str:
    from mascot.rosters import roster_path

    return str(roster_path("emotional_support").parent / "scenarios.jsonl")


def server_calls_for(folder: Path) -> int:
    """Model calls the two first judge runs needed: one per judged line."""
    return sum(len((folder / name).read_text().splitlines()) for name in ("blocks.jsonl", "judged.jsonl"))
