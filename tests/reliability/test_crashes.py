"""Crashes: a rollout, a judge run and a training run are each SIGKILLed at three different
points (restarting after each), then run to the end: the outputs equal an uninterrupted
run's in ids and count, and hold no torn records."""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from helpers import MASCOT, mascot, records, write_warm_over_curt_pairs
from suite_tally import account, count

from mascot.cli import main
from mascot.rosters import load_roster
from mascot.testing.stub_server import StubConfig, StubServer, start_stub_server

ROSTER = load_roster("emotional_support")
EPISODES = 12


def lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def kill_when(args: list[str], reached: Callable[[], bool], *, timeout: float = 300) -> None:
    """Start ``mascot ARGS`` and SIGKILL it the moment ``reached()`` holds; it must still run."""
    with tempfile.TemporaryFile() as errors:  # a pipe nobody reads could fill and stall the run
        process = subprocess.Popen([MASCOT, *args], stdout=subprocess.DEVNULL, stderr=errors,
                                   env={**os.environ, "HF_HUB_OFFLINE": "1"})
        deadline = time.monotonic() + timeout
        while not reached():
            if process.poll() is not None:
                errors.seek(0)
                raise AssertionError(f"mascot {args[0]} ended before the crash point: {errors.read()[-2000:]!r}")
            assert time.monotonic() < deadline, "the crash point was never reached"
            time.sleep(0.01)
        process.kill()
        process.wait(timeout=30)
    assert process.returncode == -9, "the run ended by itself before the kill landed"


def restart(args: list[str]) -> subprocess.CompletedProcess[str]:
    """The same command again, to the end."""
    result = mascot(*args)
    assert result.returncode == 0, result.stderr[-3000:]
    return result


@pytest.fixture(scope="module")
def server() -> Iterator[StubServer]:
    with start_stub_server(StubConfig(latency_s=0.08)) as stub:
        yield stub


def rollout_args(server: StubServer, out: Path) -> list[str]:
    return ["rollout", "--roster", ROSTER.id, "--base-url", server.url, "--model", "stub", "--episodes",
            str(EPISODES), "--concurrency", "2", "--max-rounds", "2", "--seed", "5", "--out", str(out)]


@pytest.fixture(scope="module")
def uninterrupted(server: StubServer, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """An uninterrupted rollout and judge run: what every crashed-and-restarted run must equal."""
    root = tmp_path_factory.mktemp("uninterrupted")
    assert mascot(*rollout_args(server, root / "episodes.jsonl")).returncode == 0
    judged = mascot(*judge_args(server, root / "episodes.jsonl", root / "judgements.jsonl"))
    assert judged.returncode == 0, judged.stderr
    return {"episodes": root / "episodes.jsonl", "judgements": root / "judgements.jsonl"}


def test_rollout_killed_three_times_then_finished(server: StubServer, uninterrupted: dict[str, Path],
                                                  tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    args = rollout_args(server, out)
    for after in (1, EPISODES // 2, EPISODES - 1):  # early, midway, almost done
        kill_when(args, lambda after=after: lines(out) >= after)
        if after == EPISODES // 2:  # as if this kill had landed in the middle of a write
            with out.open("a") as handle:
                handle.write('{"id": "torn-record", "messages": [{"role": "us')
        count(crashes_survived=1)
    before = lines(out)
    result = restart(args)
    expected = [e["id"] for e in records(uninterrupted["episodes"])]
    got = [e["id"] for e in records(out)]
    account(got, expected=expected)
    assert sorted(got) == sorted(expected)  # same ids, each once, nothing torn
    assert "0 failed" in result.stdout and f"({EPISODES - before} new, {before} already there)" in result.stdout


def judge_args(server: StubServer, episodes: Path, out: Path) -> list[str]:
    return ["judge", "--in", str(episodes), "--rubric", "persona", "--roster", ROSTER.id, "--base-url", server.url,
            "--model", "stub", "--concurrency", "2", "--out", str(out)]


def test_judge_killed_three_times_then_finished(server: StubServer, uninterrupted: dict[str, Path],
                                               tmp_path: Path) -> None:
    reference = records(uninterrupted["judgements"])
    out = tmp_path / "judgements.jsonl"
    args = judge_args(server, uninterrupted["episodes"], out)
    for fraction in (0.05, 0.5, 0.95):
        kill_when(args, lambda fraction=fraction: lines(out) >= max(1, int(fraction * len(reference))))
        count(crashes_survived=1)
    restart(args)
    judgements = records(out)
    got = sorted((j["episode_id"], j["turn"]) for j in judgements)
    expected = sorted((j["episode_id"], j["turn"]) for j in reference)
    account(got, expected=expected)
    assert got == expected and all(j["status"] == "ok" for j in judgements)

    def scores(found: list[dict]) -> list[dict]:
        return [j["scores"] for j in sorted(found, key=lambda j: (j["episode_id"], j["turn"]))]

    assert scores(judgements) == scores(reference)


PERSONAS = ("anchor", "catalyst")
STEPS = 4


@pytest.fixture(scope="module")
def pairs(uninterrupted: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Preference pairs on every persona turn of the rollout."""
    return write_warm_over_curt_pairs(uninterrupted["episodes"], tmp_path_factory.mktemp("pairs"))


def train_args(tiny_model: Path, pairs: Path, out: Path) -> list[str]:
    return ["train-speakers", "--roster", ROSTER.id, "--method", "dpo", "--base", str(tiny_model), "--pairs",
            str(pairs), "--personas", ",".join(PERSONAS), "--out", str(out), "--config", "speakers-dpo-cpu-smoke",
            "--max_steps", str(STEPS), "--save_steps", "1", "--per_device_train_batch_size", "1"]


def trained(out: Path) -> dict[str, tuple[int, list[str]]]:
    """Per adapter: the steps its card records and the files it holds (all readable)."""
    result = {}
    for persona in PERSONAS:
        card = json.loads((out / persona / "adapter_card.json").read_text())
        json.loads((out / persona / "adapter_config.json").read_text())
        result[persona] = (card["steps"], sorted(p.name for p in (out / persona).iterdir()))
    return result


def test_training_killed_three_times_then_finished(tiny_model: Path, pairs: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    once = tmp_path / "uninterrupted"
    assert main(train_args(tiny_model, pairs, once)) == 0  # in this process: its imports are paid already
    out = tmp_path / "adapters"
    checkpoints = out / "checkpoints"
    points = [lambda: any(checkpoints.glob(f"{PERSONAS[0]}/checkpoint-*/trainer_state.json")),  # mid first adapter
              lambda: (out / PERSONAS[0] / "adapter_card.json").exists(),  # first adapter saved
              lambda: any(checkpoints.glob(f"{PERSONAS[1]}/checkpoint-*/trainer_state.json"))]  # mid second
    for reached in points:
        kill_when(train_args(tiny_model, pairs, out), reached)
        count(crashes_survived=1)
    restart(train_args(tiny_model, pairs, out))
    got, expected = trained(out), trained(once)
    account(got, expected=expected)
    assert got == expected  # every adapter, trained for as many steps, with the same files
    assert all(load_file(out / p / "adapter_model.safetensors") for p in PERSONAS)
    assert not checkpoints.exists()
