"""Candidate replies sampled again at each persona turn of rolled-out episodes."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fakes import PromptChat, director_fake, speaker_fake

from mascot.graphs import create_director_graph
from mascot.rosters import Roster, load_scenarios
from mascot.training.data.candidates import candidate_contexts, read_candidates, sample_candidates
from mascot.training.episodes.episode import read_episodes
from mascot.training.episodes.rollout import collect_episodes


@pytest.fixture
def episodes(roster: Roster, tmp_path: Path) -> list:
    graph = create_director_graph(roster, director=director_fake(roster.persona_ids), speakers=speaker_fake(),
                                  user=speaker_fake(), max_rounds=2)
    out = tmp_path / "episodes.jsonl"
    asyncio.run(collect_episodes(graph, load_scenarios(roster.id)[:2], roster.user_profiles[:1],
                                 roster=roster.id, out=out))
    return read_episodes(out)


def test_contexts_are_the_persona_turns(roster: Roster, episodes: list) -> None:
    contexts = candidate_contexts(episodes, roster)
    turns = [(e.id, i) for e in episodes for i, m in enumerate(e.messages) if m.role == "assistant"]
    assert [(c.episode_id, c.turn) for c in contexts] == turns
    first = contexts[0]
    persona = roster.persona(first.persona)
    assert first.prompt[0].type == "system" and persona.name in first.prompt[0].text
    assert f"The Director asks you to: {first.direction.action}" in first.prompt[0].text  # the direction is its task
    episode = next(e for e in episodes if e.id == first.episode_id)
    assert first.context == [m.model_dump(include={"role", "content", "name"}, exclude_none=True)
                             for m in episode.messages[: first.turn]]
    assert len({c.context_id for c in contexts}) == len(contexts)


def test_k_samples_per_context_resumable(roster: Roster, episodes: list, tmp_path: Path) -> None:
    contexts = candidate_contexts(episodes, roster)[:5]
    calls: list[str] = []

    def speaker(prefix: str) -> PromptChat:
        def reply(prompt: str) -> str:
            calls.append(prompt)
            return f"{prefix}candidate number {len(calls)}"
        return PromptChat(reply=reply)

    # the Anchor writes its own name first, which is cleaned off
    speakers = {pid: speaker(f"{roster.persona(pid).name}: " if pid == "anchor" else "")
                for pid in roster.persona_ids}
    out = tmp_path / "candidates.jsonl"
    report = asyncio.run(sample_candidates(contexts, roster, speakers, k=3, out=out, concurrency=4))
    assert (report.wanted, report.written, report.skipped) == (15, 15, 0)
    again = asyncio.run(sample_candidates(contexts, roster, speakers, k=3, out=out))
    assert (again.written, again.skipped, len(calls)) == (0, 15, 15)  # nothing asked twice
    candidates = read_candidates(out)
    assert sorted(c.key for c in candidates) == sorted((c.context_id, s) for c in contexts for s in range(3))
    assert all(c.reply.startswith("candidate number") for c in candidates)
    assert all(c.prompt[0]["role"] == "system" and c.prompt[-1]["role"] == "user" for c in candidates)


def test_other_roster_is_refused(roster: Roster, episodes: list) -> None:
    from mascot.rosters import load_roster

    with pytest.raises(ValueError, match="is of roster 'emotional_support', not 'workplace_meeting'"):
        candidate_contexts(episodes, load_roster("workplace_meeting"))


def test_candidates_command_against_a_server(tmp_path: Path) -> None:
    import json
    import os
    import subprocess
    import sys

    from mascot.testing.stub_server import start_stub_server

    mascot = str(Path(sys.executable).parent / "mascot")
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    with start_stub_server() as server:
        model = ["--roster", "emotional_support", "--base-url", server.url, "--model", "stub"]
        subprocess.run([mascot, "rollout", *model, "--episodes", "2", "--max-rounds", "1",
                        "--out", str(tmp_path / "e.jsonl")], check=True, capture_output=True, env=env)
        result = subprocess.run([mascot, "candidates", "--in", str(tmp_path / "e.jsonl"), *model, "--k", "2",
                                 "--out", str(tmp_path / "c.jsonl")], capture_output=True, text=True, env=env)
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in (tmp_path / "c.jsonl").read_text().splitlines()]
    contexts = {r["context_id"] for r in rows}
    assert len(rows) == 2 * len(contexts) > 0
    assert f"candidates: {len(rows)} new in" in result.stdout
