"""`mascot eval` on the tiny model with the stub server judging: every file, and tables
whose numbers are recomputed here from results.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from mascot.stub_server import start_stub_server

MASCOT = str(Path(sys.executable).parent / "mascot")


def test_eval_against_baselines_and_ablations(tiny_model: Path, tmp_path: Path) -> None:
    out = tmp_path / "eval"
    with start_stub_server() as judge:
        args = [MASCOT, "eval", "--roster", "emotional_support", "--policies", str(tiny_model / "policies.yaml"),
                "--baselines", "zero_shot,round_robin", "--ablations", "--episodes", "2", "--max-rounds", "1",
                "--max-tokens", "6", "--judge-model", "stub-judge", "--judge-base-url", judge.url,
                "--out", str(out)]
        result = subprocess.run(args, capture_output=True, text=True, timeout=600,
                                env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert result.returncode == 0, result.stderr[-3000:]
        calls = judge.stats()["requests"]
        again = subprocess.run(args, capture_output=True, text=True, timeout=600,
                               env={**os.environ, "HF_HUB_OFFLINE": "1"})
        assert again.returncode == 0 and judge.stats()["requests"] == calls  # resumed: nothing asked again
    assert {p.name for p in out.iterdir()} >= {"report.md", "results.json", "results.csv", "persona.png", "group.png",
                                               "redundancy.png", "episodes", "judgements"}
    results = json.loads((out / "results.json").read_text())
    systems = results["systems"]
    assert list(systems) == ["trained", "zero_shot", "round_robin", "no_alignment", "no_director"]
    assert systems["zero_shot"]["kind"] == "baseline" and systems["no_director"]["kind"] == "ablation"
    report = (out / "report.md").read_text()
    for name, system in systems.items():
        for table in ("persona", "group"):
            episodes = system["episodes"][table]["overall"]
            stats = system["tables"][table]["overall"]
            assert stats["n"] == len(episodes) == 2
            assert abs(stats["mean"] - sum(episodes.values()) / 2) < 1e-9
            assert f"{stats['mean']:.1f} ± {stats['sd']:.1f} (n=2)" in report
    trained_ids = set(systems["trained"]["episodes"]["persona"]["overall"])
    assert trained_ids == set(systems["round_robin"]["episodes"]["persona"]["overall"])  # paired by episode id
    assert results["differences"]["persona"]["overall"]["paired"]
    assert systems["zero_shot"]["tables"]["metrics"]["speaker_balance"]["mean"] == 0.0  # one generic voice
    episodes = [json.loads(line) for line in (out / "episodes" / "trained.jsonl").read_text().splitlines()]
    assert episodes[0]["policies"]["anchor"]["adapter"] == "anchor"
    baseline = [json.loads(line) for line in (out / "episodes" / "round_robin.jsonl").read_text().splitlines()]
    assert baseline[0]["policies"]["anchor"].get("adapter") is None  # the same base, untrained
    assert "base model of every system" in report and "trained - best baseline" in report
    assert "[conversations.html](conversations.html)" in report
    page = (out / "conversations.html").read_text()
    assert all(f"<h2>{name}</h2>" in page for name in systems) and "judge " in page


def test_show_prints_and_writes_one_page(episodes: list, tmp_path: Path, capsys) -> None:
    from mascot.cli import main
    from mascot.training.jsonl import JsonlAppender

    source = tmp_path / "episodes.jsonl"
    with JsonlAppender(source) as sink:
        for episode in episodes:
            sink.write(episode.record())
    first = episodes[0]
    turn = next(i for i, m in enumerate(first.messages) if m.role == "assistant")
    judged = tmp_path / "judged.jsonl"
    judged.write_text(json.dumps({"episode_id": first.id, "turn": turn, "status": "ok", "overall": 87.5}) + "\n")
    assert main(["show", str(source), "--limit", "1"]) == 0
    printed = capsys.readouterr().out
    assert "Person:" in printed and "»" in printed
    page = tmp_path / "page.html"
    assert main(["show", str(source), "--html", str(page), "--judgements", str(judged)]) == 0
    text = page.read_text()
    assert text.startswith("<!doctype html>") and "judge 88" in text and "http" not in text.split("<body>")[0]
    assert first.messages[0].content.replace("'", "&#x27;")[:20] in text
    assert main(["show", str(tmp_path / "missing.jsonl")]) == 2
