"""The training-data pipeline end to end through the CLI, offline: rollout -> judge ->
candidates -> judge -> pairs -> train-rm on the tiny model, with the stub server judging."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mascot.testing.stub_server import start_stub_server

MASCOT = str(Path(sys.executable).parent / "mascot")


def mascot(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([MASCOT, *args], capture_output=True, text=True, timeout=300,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0 or not check, f"mascot {args[0]}: {result.stderr[-2000:]}"
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
    assert "train-rm:" in rm.stdout and (tmp_path / "rm" / "adapter_card.json").is_file()


def test_group_reward_model_from_sibling_blocks(tiny_model: Path, tmp_path: Path, roster) -> None:
    """G blocks per decision point, judged, paired within their point, some points held out."""
    episodes = tmp_path / "episodes.jsonl"
    # unguarded: a guarded round is no decision point, and one of these openings ("I snapped
    # at my kid this morning over spilled cereal") reads as harm to others at 0.63
    mascot("rollout", "--roster", "emotional_support", "--policies", str(tiny_model / "policies.yaml"),
           "--max-tokens", "12", "--episodes", "3", "--max-rounds", "1", "--no-safety-guard", "--out", str(episodes))
    blocks_file = tmp_path / "siblings.jsonl"
    played = mascot("blocks", "--in", str(episodes), "--roster", "emotional_support", "--policies",
                    str(tiny_model / "policies.yaml"), "--max-tokens", "12", "--g", "3", "--block-turns", "2",
                    "--max-points", "8", "--seed", "1", "--out", str(blocks_file))
    siblings = [json.loads(line) for line in blocks_file.read_text().splitlines()]
    by_point: dict[str, list[dict]] = {}
    for block in siblings:
        by_point.setdefault(block["context_id"], []).append(block)
    assert "blocks:" in played.stdout and len(by_point) == 8
    assert all(sorted(b["sample"] for b in group) == [0, 1, 2] for group in by_point.values())
    assert all(len({json.dumps(b["prompt"]) for b in group}) == 1 for group in by_point.values())  # one prefix each
    # mid-round points: the prefix keeps who said what
    assert any(m.get("name") in roster.persona_ids for b in siblings for m in b["prompt"] if m["role"] == "assistant")
    again = mascot("blocks", "--in", str(episodes), "--roster", "emotional_support", "--policies",
                   str(tiny_model / "policies.yaml"), "--max-tokens", "12", "--g", "3", "--block-turns", "2",
                   "--max-points", "8", "--seed", "1", "--out", str(blocks_file))
    assert "0 new" in again.stdout and len(blocks_file.read_text().splitlines()) == len(siblings)  # resumable
    with start_stub_server() as server:
        mascot("judge", "--in", str(blocks_file), "--rubric", "group", "--roster", "emotional_support",
               "--base-url", server.url, "--model", "stub-judge", "--out", str(tmp_path / "judged-blocks.jsonl"))
        refused = mascot("judge", "--in", str(blocks_file), "--rubric", "persona", "--roster", "emotional_support",
                         "--base-url", server.url, "--model", "stub-judge", "--out", str(tmp_path / "x.jsonl"),
                         check=False)
        mascot("judge", "--in", str(episodes), "--rubric", "group", "--block-turns", "2", "--roster",
               "emotional_support", "--base-url", server.url, "--model", "stub-judge",
               "--out", str(tmp_path / "episode-blocks.jsonl"))
    assert refused.returncode == 2 and "candidate blocks" in refused.stderr
    judged = [json.loads(line) for line in (tmp_path / "judged-blocks.jsonl").read_text().splitlines()]
    assert len(judged) == len(siblings)
    assert len({(j["context_id"], j["judgement"]["sample"]) for j in judged}) == len(judged)
    pairs = mascot("pairs", "--in", str(tmp_path / "judged-blocks.jsonl"), "--min-margin", "0.25",
                   "--test-fraction", "0.4", "--out", str(tmp_path / "group-pairs"))
    train = [json.loads(line) for line in (tmp_path / "group-pairs" / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (tmp_path / "group-pairs" / "test.jsonl").read_text().splitlines()]
    assert "pairs:" in pairs.stdout and train and test and {p["persona"] for p in train} == {"group"}
    assert not {p["context_id"] for p in train} & {p["context_id"] for p in test}  # held out by decision point
    assert all(p["context_id"] in by_point for p in train + test)
    rm = mascot("train-rm", "--pairs", str(tmp_path / "group-pairs"), "--base", str(tiny_model),
                "--out", str(tmp_path / "rm-group"))
    assert "held-out pairwise accuracy" in rm.stdout
    # blocks cut from whole episodes share no prefix: refused with the way to make sibling blocks
    refused = mascot("pairs", "--in", str(tmp_path / "episode-blocks.jsonl"), "--out", str(tmp_path / "p2"),
                     check=False)
    assert refused.returncode == 2 and "mascot blocks" in refused.stderr


def roster_scenarios() -> str:
    from mascot.rosters import roster_path

    return str(roster_path("emotional_support").parent / "scenarios.jsonl")


def server_calls_for(folder: Path) -> int:
    """Model calls the two first judge runs needed: one per judged line."""
    return sum(len((folder / name).read_text().splitlines()) for name in ("blocks.jsonl", "judged.jsonl"))
