"""Rollouts with prompt-driven fake models: concurrency, stable ids, resume, failures."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fakes import PromptChat, digest, director_fake, speaker_fake

from mascot.graphs import create_director_graph
from mascot.redaction import Redactor
from mascot.rosters import Roster, load_scenarios
from mascot.training.episodes.episode import SCHEMA_VERSION, EpisodeError, read_episodes
from mascot.training.episodes.rollout import (
    RolloutError,
    collect_episodes,
    failures_path,
    plan_episodes,
)
from mascot.training.jsonl import JsonlAppender, JsonlError, exclusive
from mascot.training.retry import model_retry_policy, transient_error


def _graph(roster: Roster, *, delay: bool = False, user: PromptChat | None = None, **kwargs: Any) -> Any:
    jitter = (lambda p: (digest(p) % 7) / 1000) if delay else (lambda p: 0.0)
    return create_director_graph(
        roster,
        director=director_fake(roster.persona_ids, delay=jitter),
        speakers=speaker_fake(delay=jitter),
        user=user or speaker_fake(delay=jitter),
        max_rounds=2,
        **kwargs,
    )


def _collect(roster: Roster, graph: Any, out: Path, **kwargs: Any) -> Any:
    # without written follow-ups: the simulated person speaks every round here
    scenarios = [s.model_copy(update={"followups": []}) for s in load_scenarios(roster.id)[:3]]
    profiles = list(roster.user_profiles[:2])
    return asyncio.run(collect_episodes(graph, scenarios, profiles, roster=roster.id, out=out, **kwargs))


def _content(episode: Any) -> dict[str, Any]:
    """An episode without its timings (which differ from run to run)."""
    record = episode.record()
    for key in ("created_at", "duration_s"):
        record.pop(key, None)
    for message in record["messages"]:
        message.pop("latency_s", None)
    return record


def test_plan_is_stable_and_repeats_pairs(roster: Roster) -> None:
    # without written follow-ups: the simulated person speaks every round here
    scenarios = [s.model_copy(update={"followups": []}) for s in load_scenarios(roster.id)[:3]]
    profiles = list(roster.user_profiles[:2])
    plan = plan_episodes(roster.id, scenarios, profiles, episodes=8, seed=5)
    assert plan == plan_episodes(roster.id, scenarios, profiles, episodes=8, seed=5)
    assert len({p.id for p in plan}) == 8
    assert [p.repeat for p in plan] == [0] * 6 + [1] * 2
    assert len({(p.scenario.id, p.profile.id) for p in plan[:6]}) == 6
    assert plan[0].id != plan_episodes(roster.id, scenarios, profiles, episodes=8, seed=6)[0].id
    with pytest.raises(ValueError, match="at least one scenario"):
        plan_episodes(roster.id, [], profiles)


def test_concurrent_rollout_matches_serial_rollout(roster: Roster, tmp_path: Path) -> None:
    serial = _collect(roster, _graph(roster), tmp_path / "serial.jsonl", episodes=10, concurrency=1)
    status = _collect(roster, _graph(roster, delay=True), tmp_path / "parallel.jsonl", episodes=10, concurrency=6)
    assert (serial.completed, status.completed, status.failed) == (10, 10, 0)
    one, many = read_episodes(tmp_path / "serial.jsonl"), read_episodes(tmp_path / "parallel.jsonl")
    plan = plan_episodes(roster.id, load_scenarios(roster.id)[:3], list(roster.user_profiles[:2]), episodes=10)
    assert [e.id for e in many] == [p.id for p in plan]  # plan order, whatever finished first
    assert [_content(e) for e in many] == [_content(e) for e in one]
    episode = many[0]
    assert episode.schema_version == SCHEMA_VERSION and episode.roster == roster.id
    assert episode.messages[0].role == "user" and episode.messages[0].content == plan[0].scenario.opening
    personas = [m for m in episode.messages if m.role == "assistant"]
    assert personas and all(m.name in roster.persona_ids and m.stage_direction for m in personas)
    assert all(m.stage_direction["speaker"] == m.name for m in personas)
    assert all(m.policy.model == "prompt-fake" and m.usage.output_tokens == 2 for m in personas)
    assert episode.usage.output_tokens == 2 * len(personas)
    assert episode.directions and episode.directions[-1]["speaker"] == "user"
    assert episode.user_profile.id == plan[0].profile.id and episode.source.kind == "rollout"


def test_rerun_resumes_without_duplicates(roster: Roster, tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    first = _collect(roster, _graph(roster), out, episodes=4, concurrency=2)
    second = _collect(roster, _graph(roster), out, episodes=9, concurrency=3)
    third = _collect(roster, _graph(roster), out, episodes=9, concurrency=3)
    assert (first.completed, second.skipped, second.completed, third.completed, third.skipped) == (4, 4, 5, 0, 9)
    ids = [e.id for e in read_episodes(out)]
    assert len(ids) == len(set(ids)) == 9


def test_failed_episodes_are_recorded_and_retried_next_run(roster: Roster, tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    scenario = load_scenarios(roster.id)[0]
    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    broken = speaker_fake(fail=lambda p: openai.InternalServerError(
        "overloaded", response=httpx.Response(503, request=request), body=None)
        if scenario.opening in p else None)
    retry = model_retry_policy(2, initial_interval=0.01, max_interval=0.02)
    status = _collect(roster, _graph(roster, user=broken, retry_policy=retry), out, episodes=6)
    failures = [json.loads(line) for line in failures_path(out).read_text().splitlines()]
    assert status.failed == len(failures) == 2 and status.completed == 4
    assert {f["scenario_id"] for f in failures} == {scenario.id}
    assert all(f["transient"] and f["failed_runs"] == 1 and "503" in f["reason"] for f in failures)

    again = _collect(roster, _graph(roster, user=broken), out, episodes=6)
    failures = [json.loads(line) for line in failures_path(out).read_text().splitlines()]
    assert again.failed == 2 and [f["failed_runs"] for f in failures] == [2, 2]  # one line each

    healed = _collect(roster, _graph(roster), out, episodes=6)
    assert (healed.skipped, healed.completed, healed.failed) == (4, 2, 0)
    assert not failures_path(out).exists()
    assert len({e.id for e in read_episodes(out)}) == 6


def test_graph_retry_policy_gets_past_transient_faults(roster: Roster, tmp_path: Path) -> None:
    calls: list[str] = []

    def flaky(prompt: str) -> BaseException | None:
        calls.append(prompt)
        if len(calls) % 3 == 1:
            return openai.APITimeoutError(request=httpx.Request("POST", "http://127.0.0.1"))
        return None

    graph = _graph(roster, user=speaker_fake(fail=flaky),
                   retry_policy=model_retry_policy(3, initial_interval=0.01, max_interval=0.02))
    status = _collect(roster, graph, tmp_path / "e.jsonl", episodes=3, concurrency=1)
    assert (status.completed, status.failed) == (3, 0)
    assert len(calls) > 3


def test_server_refusal_stops_the_run(roster: Roster, tmp_path: Path) -> None:
    response = httpx.Response(401, request=httpx.Request("POST", "http://127.0.0.1"))
    graph = _graph(roster, user=speaker_fake(
        fail=lambda p: openai.AuthenticationError("bad key", response=response, body=None)))
    with pytest.raises(RolloutError, match="refused"):
        _collect(roster, graph, tmp_path / "e.jsonl", episodes=20, concurrency=2)
    assert len(failures_path(tmp_path / "e.jsonl").read_text().splitlines()) <= 2


def test_transient_error_classes() -> None:
    request = httpx.Request("POST", "http://127.0.0.1")
    assert transient_error(openai.RateLimitError("slow", response=httpx.Response(429, request=request), body=None))
    assert transient_error(openai.APIConnectionError(request=request))
    assert transient_error(httpx.ReadTimeout("t"))
    assert not transient_error(openai.BadRequestError("bad", response=httpx.Response(400, request=request), body=None))
    assert not transient_error(ValueError("bug"))


def test_torn_last_line_is_dropped_and_the_run_completes(
    roster: Roster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "episodes.jsonl"
    _collect(roster, _graph(roster), out, episodes=3)
    whole = out.read_text()
    out.write_text(whole + whole.splitlines()[0][:57])  # a crash in the middle of a write
    with caplog.at_level(logging.WARNING):
        status = _collect(roster, _graph(roster), out, episodes=5)
    assert "torn last line" in caplog.text
    assert (status.skipped, status.completed) == (3, 2)
    lines = out.read_text().splitlines()
    assert len(lines) == 5 and all(json.loads(line)["id"] for line in lines)


def test_corrupt_line_in_the_middle_is_skipped_with_its_number(
    roster: Roster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    out = tmp_path / "episodes.jsonl"
    _collect(roster, _graph(roster), out, episodes=3)
    lines = out.read_text().splitlines()
    out.write_text("\n".join([lines[0], "{not json", lines[1], '{"id": "x"}', lines[2]]) + "\n")
    with caplog.at_level(logging.WARNING):
        episodes = read_episodes(out)
    assert len(episodes) == 3
    assert f"{out}:2: skipped a corrupt line" in caplog.text
    assert f"{out}:4: not an episode" in caplog.text


def test_newer_schema_version_is_refused(roster: Roster, tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    _collect(roster, _graph(roster), out, episodes=1)
    record = json.loads(out.read_text())
    record["schema_version"] = SCHEMA_VERSION + 1
    out.write_text(json.dumps(record) + "\n")
    with pytest.raises(EpisodeError, match=r"episodes.jsonl:1: written by a newer mascot"):
        read_episodes(out)


def test_output_in_missing_directory_is_refused(roster: Roster, tmp_path: Path) -> None:
    with pytest.raises(JsonlError, match="does not exist"):
        _collect(roster, _graph(roster), tmp_path / "nope" / "e.jsonl", episodes=1)


def test_appender_writes_whole_lines_from_threads(tmp_path: Path) -> None:
    path = tmp_path / "lines.jsonl"

    async def write_many(appender: JsonlAppender) -> None:
        await asyncio.gather(*(asyncio.to_thread(appender.write, {"n": n, "pad": "x" * 5000}) for n in range(200)))

    with JsonlAppender(path, fsync=False) as appender:
        asyncio.run(write_many(appender))
    numbers = sorted(json.loads(line)["n"] for line in path.read_text().splitlines())
    assert numbers == list(range(200))


def test_a_second_run_on_the_same_file_is_refused(roster: Roster, tmp_path: Path) -> None:
    out = tmp_path / "episodes.jsonl"
    with exclusive(out), pytest.raises(JsonlError, match="being written by another run"):
        _collect(roster, _graph(roster), out, episodes=1)
    assert _collect(roster, _graph(roster), out, episodes=1).completed == 1  # free again


def test_redaction_masks_values_never_keys_or_structure(tmp_path: Path) -> None:
    redact = Redactor.from_environment(["MY_KEY"], environ={
        "MY_KEY": "sk-test-abcdef123456", "SORT_KEY": "assistant", "LONG_TOKEN": "tok-0123456789abcdefXYZ"})
    path = tmp_path / "r.jsonl"
    with JsonlAppender(path, redact=redact) as appender:
        appender.write({"role": "assistant", "sk-test-abcdef123456": 1,
                        "text": ["key sk-test-abcdef123456", "tok-0123456789abcdefXYZ", "assistant"]})
    record = json.loads(path.read_text())
    assert record == {"role": "assistant", "sk-test-abcdef123456": 1, "text": ["key ***", "***", "assistant"]}


def test_placeholder_keys_are_not_masked_out_of_records(tmp_path: Path) -> None:
    """Local servers take any key; masking a word like "anything" would blank it out of data."""
    redact = Redactor.from_environment(["LOCAL_KEY", "SHORT_KEY"], environ={
        "LOCAL_KEY": "anything", "SHORT_KEY": "key12345"})
    assert redact("Is there anything else? key12345") == "Is there anything else? ***"
