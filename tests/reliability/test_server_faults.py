"""Server faults: rollout, judge and eval against a model server that fails 30% of requests
(500, 429 with Retry-After, dropped connections, replies slower than the timeout, replies
cut off halfway) finish with every item done once."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml
from helpers import mascot, records
from suite_tally import account, count

from mascot.rosters import load_roster, load_scenarios
from mascot.testing.stub_server import FAULTS, StubConfig, StubServer, start_stub_server
from mascot.training.episodes.rollout import plan_episodes

FAULTY = StubConfig(fail_rate=0.3, faults=FAULTS, stall_s=3, retry_after_s=0.2, seed=11)
TIMEOUT = ["--timeout", "0.5"]
ROSTER = load_roster("emotional_support")


def planned_ids(episodes: int) -> list[str]:
    """The ids a rollout (or each system of an eval) of ``episodes`` at seed 0 must write, once each."""
    return [p.id for p in plan_episodes(ROSTER.id, load_scenarios(ROSTER.id), ROSTER.user_profiles,
                                        episodes=episodes, seed=0)]


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    with start_stub_server(FAULTY) as stub:
        yield stub
        faults = stub.stats()["faults"]
    count(faults_injected=sum(faults.values()))
    assert all(faults[kind] > 0 for kind in FAULTS), faults  # every kind of fault was met


@pytest.fixture(scope="module")
def rolled_out(server: StubServer, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("faults") / "episodes.jsonl"
    result = mascot("rollout", "--roster", ROSTER.id, "--base-url", server.url, "--model", "stub",
                    "--episodes", "8", "--concurrency", "4", "--max-rounds", "2", *TIMEOUT, "--retries", "6",
                    "--out", str(out))
    assert result.returncode == 0, result.stderr
    return out, result.stdout


def test_rollout_finishes_every_episode_once(rolled_out: tuple[Path, str]) -> None:
    out, stdout = rolled_out
    episodes = records(out)
    ids = [e["id"] for e in episodes]
    planned = planned_ids(8)
    account(ids, expected=planned)
    assert sorted(ids) == sorted(planned)
    assert all(sum(m["role"] == "assistant" for m in e["messages"]) >= 2 for e in episodes)
    assert "rollout: 8/8 episodes" in stdout and "0 failed" in stdout
    assert not out.with_name("episodes.failures.jsonl").exists()


def test_judge_scores_every_reply_once(rolled_out: tuple[Path, str], server: StubServer, tmp_path: Path) -> None:
    episodes, _ = rolled_out
    out = tmp_path / "judgements.jsonl"
    result = mascot("judge", "--in", str(episodes), "--rubric", "persona", "--roster", ROSTER.id,
                    "--base-url", server.url, "--model", "stub", *TIMEOUT, "--retries", "6", "--out", str(out))
    assert result.returncode == 0, result.stderr
    expected = Counter((e["id"], i) for e in records(episodes) for i, m in enumerate(e["messages"])
                       if m["role"] == "assistant" and m.get("name") in ROSTER.persona_ids)
    judged = Counter((j["episode_id"], j["turn"]) for j in records(out))
    account(list(judged.elements()), expected=expected)
    assert judged == Counter(set(expected)), "every persona reply judged exactly once"
    assert all(j["status"] == "ok" and j["scores"] for j in records(out))


def test_eval_judges_every_episode_of_every_system(server: StubServer, tmp_path: Path) -> None:
    policies = tmp_path / "policies.yaml"
    served = {"kind": "openai", "base_url": server.url, "model": "stub", "timeout": 0.5, "max_retries": 3}
    policies.write_text(yaml.safe_dump({"version": 1, "defaults": served, "roles": {"default": {}}}))
    out = tmp_path / "eval"
    planned = planned_ids(2)
    result = mascot("eval", "--roster", ROSTER.id, "--policies", str(policies), "--baselines", "round_robin",
                    "--episodes", "2", "--max-rounds", "1", "--judge-model", "stub", "--judge-base-url", server.url,
                    "--concurrency", "3", "--out", str(out))
    assert result.returncode == 0, result.stderr
    for system in ("trained", "round_robin"):
        ids = [e["id"] for e in records(out / "episodes" / f"{system}.jsonl")]
        judgements = records(out / "judgements" / f"{system}.jsonl")
        account(ids, expected=planned)
        assert sorted(ids) == sorted(planned)
        assert judgements and all(j["status"] == "ok" for j in judgements)
        keys = [(j["episode_id"], j["rubric"], j.get("turn"), j.get("block_start")) for j in judgements]
        assert any(k[3] is not None for k in keys)  # the group rubric judged blocks, keyed by their start
        account(keys, expected=set(keys))  # each judged target once
        assert len(keys) == len(set(keys))
    assert (out / "report.md").is_file()
