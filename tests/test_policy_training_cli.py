"""The policy training commands end to end on the tiny model, offline: train-speakers (GRPO
and DPO), train-director, the policy file they write, and mascot chat on it."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mascot.cli import main
from mascot.graphs import create_director_graph
from mascot.policies import Policies
from mascot.rosters import load_roster, load_scenarios
from mascot.training.data.candidates import Candidate, candidate_contexts
from mascot.training.data.pairs import build_pairs, write_pairs
from mascot.training.episodes.episode import TurnPolicy, read_episodes
from mascot.training.episodes.rollout import collect_episodes
from mascot.training.judging.judgement import JudgedCandidate

MASCOT = str(Path(sys.executable).parent / "mascot")
ROSTER = ["--roster", "emotional_support"]


def mascot(*args: str, ok: bool = True) -> subprocess.CompletedProcess[str]:
    result = subprocess.run([MASCOT, *args], capture_output=True, text=True, timeout=600,
                            env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if ok:
        assert result.returncode == 0, f"mascot {args[0]}: {result.stderr[-3000:]}"
    return result


@pytest.fixture(scope="module")
def workspace(tiny_model: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Episodes of the tiny model, synthetic pairs per persona, and a reward model on them."""
    root = tmp_path_factory.mktemp("policy-training")
    mascot("rollout", *ROSTER, "--policies", str(tiny_model / "policies.yaml"), "--max-tokens", "8",
           "--episodes", "2", "--max-rounds", "1", "--out", str(root / "episodes.jsonl"))
    judged = [JudgedCandidate(context_id=c.context_id, prompt=c.prompt, persona=c.persona, reply=reply,
                              overall=overall)
              for c in (Candidate(**row) for row in _candidate_rows(root / "episodes.jsonl"))
              for reply, overall in (("That sounds hard. What would help most tonight?", 90.0),
                                     ("Anchor: fine.\nUser: ok", 10.0))]
    write_pairs(build_pairs(judged, test_fraction=0.0), root / "pairs")
    # TRL flags after the recipe flags: a two-step reward model
    rm = mascot("train-rm", "--pairs", str(root / "pairs"), "--base", str(tiny_model), "--out", str(root / "rm"),
                "--max_steps", "2", "--lora_r", "4")
    assert "2 steps" in rm.stdout
    assert json.loads((root / "rm" / "adapter_card.json").read_text())["recipe"]["lora_r"] == 4
    return root


def test_train_speakers_director_and_chat(tiny_model: Path, workspace: Path) -> None:
    adapters, policy_file = workspace / "adapters", workspace / "adapters" / "policies.yaml"
    grpo = mascot("train-speakers", *ROSTER, "--base", str(tiny_model), "--episodes",
                  str(workspace / "episodes.jsonl"), "--rm", str(workspace / "rm"), "--personas", "anchor,catalyst",
                  "--out", str(adapters), "--config", "speakers-cpu-smoke", "--max_steps", "2")
    assert "anchor ->" in grpo.stdout and "catalyst ->" in grpo.stdout and "(grpo, 2 steps" in grpo.stdout
    card = json.loads((adapters / "anchor" / "adapter_card.json").read_text())
    assert card["method"] == "grpo" and card["reward_terms"] == ["reward_model", "format_reward"]
    assert card["recipe"]["training"]["max_steps"] == 2 and card["recipe"]["lora_r"] == 8
    assert not (adapters / "checkpoints").exists()  # removed once the adapters are saved

    dpo = mascot("train-speakers", *ROSTER, "--method", "dpo", "--base", str(tiny_model), "--pairs",
                 str(workspace / "pairs"), "--personas", "beacon", "--out", str(adapters),
                 "--config", "speakers-dpo-cpu-smoke", "--max_steps", "2")
    assert "beacon ->" in dpo.stdout and "(dpo, 2 steps" in dpo.stdout
    assert json.loads((adapters / "beacon" / "adapter_card.json").read_text())["method"] == "dpo"

    # the reward model stands in for a group RM here: the command only needs a scorer of blocks
    director = mascot("train-director", *ROSTER, "--base", str(tiny_model), "--episodes",
                      str(workspace / "episodes.jsonl"), "--group-rm", str(workspace / "rm"), "--speakers",
                      str(policy_file), "--out", str(adapters), "--config", "director-cpu-smoke",
                      "--block-turns", "1", "--max_steps", "1")
    assert "director ->" in director.stdout and "(1 steps" in director.stdout

    roles = yaml.safe_load(policy_file.read_text())["roles"]
    assert set(roles) == {"default", "anchor", "catalyst", "beacon", "director"}
    assert all(roles[r]["adapter"] == r and roles[r]["version"] for r in ("anchor", "catalyst", "beacon", "director"))
    assert roles["default"] == {"kind": "local", "model": str(tiny_model)}

    chat = mascot("chat", *ROSTER, "--policies", str(policy_file), "--message", "I failed my exam.",
                  "--max-tokens", "6", "--max-speakers", "2", "--json", "--seed", "0")
    episode = json.loads(chat.stdout)
    assert [m["role"] for m in episode["messages"]][:2] == ["user", "assistant"]
    assert "director" in episode["policies"]["director"]

    # the same file drives the graph in code, and every turn records the adapter version
    roster = load_roster("emotional_support")
    policies = Policies.from_file(policy_file, roster)
    graph = create_director_graph(roster, director=policies.chat_model("director"), speakers=policies.speakers(),
                                  user=policies.chat_model("user"), max_rounds=1)
    roles_ = ("director", "user", *roster.persona_ids)
    asyncio.run(collect_episodes(graph, load_scenarios(roster.id)[:1], roster.user_profiles[:1], roster=roster.id,
                                 out=workspace / "trained.jsonl",
                                 policies={r: TurnPolicy(**policies.record(r)) for r in roles_}))
    turns = [m for m in read_episodes(workspace / "trained.jsonl")[0].messages if m.name in roles]
    assert turns and all(m.policy.adapter == m.name and m.policy.adapter_version == roles[m.name]["version"]
                         for m in turns)

    again = mascot("train-speakers", *ROSTER, "--base", str(tiny_model), "--episodes",
                   str(workspace / "episodes.jsonl"), "--rm", str(workspace / "rm"), "--personas", "anchor",
                   "--out", str(adapters), "--config", "speakers-cpu-smoke")
    assert "already trained" in again.stderr and "(grpo" not in again.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["--method", "grpo"], "needs --episodes"),
    (["--episodes", "missing.jsonl"], "--episodes: no such file"),
    (["--method", "dpo"], "needs --pairs"),
    (["--personas", "anchor,nobody", "--method", "dpo", "--pairs", "x"], "unknown persona(s) nobody"),
    (["--config", "no-such-recipe"], "shipped recipes: accelerate-multi-gpu"),
    (["--lerning_rate", "1"], "unknown speaker-training setting(s) --lerning_rate"),
    (["--lora_r", "many"], "argument --lora_r"),
])
def test_train_speakers_usage_errors(args: list[str], message: str, tmp_path: Path,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["train-speakers", *ROSTER, "--out", str(tmp_path), *args]) == 2
    stderr = capsys.readouterr().err
    assert message in stderr and len(stderr.strip().splitlines()) == 1, stderr


def test_unknown_flags_of_other_commands_are_refused(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        main(["graph", "--roster", "emotional_support", "--learning_rate", "1"])
    assert exit_.value.code == 2 and "unrecognized arguments: --learning_rate 1" in capsys.readouterr().err


def _candidate_rows(episodes: Path) -> list[dict]:
    """Each persona turn of the episodes as a candidate (its prompt in OpenAI format)."""
    from mascot.messages import chat_messages

    contexts = candidate_contexts(read_episodes(episodes), load_roster("emotional_support"))
    return [{"context_id": c.context_id, "episode_id": c.episode_id, "turn": c.turn, "persona": c.persona,
             "stage_direction": c.direction.model_dump(exclude_none=True), "context": c.context,
             "prompt": chat_messages(c.prompt), "reply": "", "sample": 0} for c in contexts]
