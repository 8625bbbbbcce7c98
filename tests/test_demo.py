"""`mascot demo`: the whole method end to end on the tiny model, offline, through the CLI:
rollout -> judges -> pairs -> reward models -> GRPO speakers and Director -> eval. The
report's numbers are recomputed here from results.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

MASCOT = str(Path(sys.executable).parent / "mascot")


@pytest.mark.slow
@pytest.mark.timeout(1200)  # every stage in its own process, the judge's sanity sets included
def test_demo_end_to_end(tmp_path: Path) -> None:
    out = tmp_path / "demo"
    result = subprocess.run([MASCOT, "demo", "--out", str(out)], capture_output=True, text=True, timeout=1200,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"demo: report {out / 'eval' / 'report.md'}" in result.stdout
    for stage in ("rollout", "blocks", "judge-blocks", "judge-sanity-persona", "judge-sanity-group", "candidates",
                  "pairs", "persona-rm", "speakers", "director", "eval"):
        assert f"[{stage}] done in" in result.stderr
    evaluation = out / "eval"
    assert {p.name for p in evaluation.iterdir()} >= {"report.md", "results.json", "results.csv", "persona.png",
                                                      "group.png", "redundancy.png", "conversations.html"}
    results = json.loads((evaluation / "results.json").read_text())
    systems = results["systems"]
    assert list(systems) == ["trained", "zero_shot", "round_robin", "random", "no_alignment", "no_director"]
    assert systems["zero_shot"]["kind"] == "baseline" and systems["no_director"]["kind"] == "ablation"
    report = (evaluation / "report.md").read_text()
    assert "a tiny random-weight model" in report and "[conversations.html](conversations.html)" in report
    for system in systems.values():
        for table in ("persona", "group"):
            episodes = system["episodes"][table]["overall"]
            stats = system["tables"][table]["overall"]
            assert stats["n"] == len(episodes) == 3
            assert abs(stats["mean"] - sum(episodes.values()) / 3) < 1e-9
            assert f"{stats['mean']:.1f} ± {stats['sd']:.1f} (n=3)" in report
    # every system played the same plan: differences are paired by episode id
    assert set(systems["trained"]["episodes"]["persona"]["overall"]) == set(
        systems["round_robin"]["episodes"]["persona"]["overall"])
    assert results["differences"]["persona"]["overall"]["paired"]
    assert systems["zero_shot"]["tables"]["metrics"]["speaker_balance"]["mean"] == 0.0  # one generic voice
    compliance = systems["trained"]["tables"]["metrics"]["direction_compliance"]
    assert compliance["n"] == 3 and 0 <= compliance["mean"] <= 100 and "Direction compliance" in report
    trained = [json.loads(line) for line in (evaluation / "episodes" / "trained.jsonl").read_text().splitlines()]
    baseline = [json.loads(line) for line in (evaluation / "episodes" / "round_robin.jsonl").read_text().splitlines()]
    assert trained[0]["policies"]["anchor"]["adapter"] == "anchor"
    assert baseline[0]["policies"]["anchor"].get("adapter") is None  # the same base, untrained
    page = (evaluation / "conversations.html").read_text()
    assert all(f"<h2>{name}</h2>" in page for name in systems)
    roles = yaml.safe_load((out / "adapters" / "policies.yaml").read_text())["roles"]
    assert {"anchor", "director"} <= set(roles) and roles["director"]["adapter"] == "director"
    pairs = [json.loads(line) for line in (out / "pairs" / "train.jsonl").read_text().splitlines()]
    assert pairs and all(p["margin"] >= 0.5 for p in pairs)
