from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

MASCOT = str(Path(sys.executable).parent / "mascot")


def run(*args: str, timeout: float = 180) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    return subprocess.run([MASCOT, *args], capture_output=True, text=True, timeout=timeout, env=env)


def test_chat_one_round_on_tiny_model(tiny_model: Path) -> None:
    result = run("chat", "--roster", "emotional_support", "--model", str(tiny_model), "--message",
                 "I failed my driving test again", "--max-rounds", "1", "--seed", "3", "--max-tokens", "24")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    turns = [(i, m.group(1)) for i, line in enumerate(lines) if (m := re.match(r"^\[(\w+)\] \S", line))]
    assert len(turns) >= 2
    assert len({name for _, name in turns}) >= 2
    for index, name in turns:  # each turn comes right after the direction that produced it
        assert lines[index - 1].startswith(f"» {name}: ")
    assert "Traceback" not in result.stderr


def test_chat_json_episode_with_adapter_policies(tiny_model: Path) -> None:
    result = run("chat", "--roster", "emotional_support", "--policies", str(tiny_model / "policies.yaml"),
                 "--message", "I failed my driving test again", "--json", "--max-tokens", "16", "--seed", "1")
    assert result.returncode == 0, result.stderr
    episode = json.loads(result.stdout)
    assert episode["roster"] == "emotional_support"
    assert episode["messages"][0] == {"role": "user", "content": "I failed my driving test again"}
    personas = [m for m in episode["messages"] if m["role"] == "assistant"]
    assert personas and all(m["name"] in {"anchor", "catalyst", "beacon", "action_guide"} for m in personas)
    assert all("stage_direction" in m for m in personas)
    assert episode["directions"][-1]["speaker"] == "user"
    assert episode["policies"]["anchor"].endswith("+ anchor (local)")


def test_interactive_chat_reads_turns_until_quit(tiny_model: Path) -> None:
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result = subprocess.run(
        [MASCOT, "chat", "--roster", "workplace_meeting", "--model", str(tiny_model), "--max-tokens", "8",
         "--max-speakers", "2"],
        input="Should we delay the launch?\nWhat about the risks?\n/quit\n",
        capture_output=True, text=True, timeout=180, env=env,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("you> ") == 3
    assert len(re.findall(r"^\[(\w+)\] ", result.stdout, flags=re.M)) >= 4


def test_tiny_model_command(tmp_path: Path, roster) -> None:
    from mascot.policies import Policies

    result = run("tiny-model", "--out", str(tmp_path / "m"), "--arch", "llama")
    assert result.returncode == 0, result.stderr
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["model_type"] == "llama" and config["hidden_size"] == 64
    # a policy file even without adapters: the base model answers for every role
    policy_file = tmp_path / "m" / "policies.yaml"
    assert f"policy file {policy_file}" in result.stdout
    policies = Policies.from_file(policy_file, roster)
    assert {policies.spec(role).model for role in ("director", "user", *roster.persona_ids)} == {str(tmp_path / "m")}
    assert policies.spec("anchor").adapter is None and not (tmp_path / "m" / "adapters").exists()
    result = run("tiny-model", "--out", str(tmp_path / "m"), "--arch", "llama", "--with-adapters")
    assert result.returncode == 0, result.stderr
    assert f"policy file {policy_file}" in result.stdout
    policies = Policies.from_file(policy_file, roster)
    assert policies.spec("anchor").adapter == str(tmp_path / "m" / "adapters" / "anchor")
    assert policies.spec("director").adapter is None


def test_graph_command() -> None:
    result = run("graph", "--roster", "workplace_meeting")
    assert result.returncode == 0
    assert "director -.-> risk_owner;" in result.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["chat", "--roster", "nope", "--message", "hi"], "unknown roster 'nope'"),
        (["chat", "--roster", "emotional_support", "--model", "org/not-cached", "--message", "hi"],
         "HF_HUB_OFFLINE is set"),
        (["chat", "--roster", "emotional_support", "--base-url", "http://127.0.0.1:9/v1", "--model", "m",
          "--message", "hi"], "cannot reach the model server"),
        (["chat", "--roster", "emotional_support", "--base-url", "http://127.0.0.1:9/v1", "--message", "hi"],
         "--base-url needs --model"),
        (["chat", "--roster", "emotional_support", "--policies", "/nonexistent.yaml", "--message", "hi"],
         "cannot read file"),
        (["chat", "--roster", "emotional_support", "--max-rounds", "0"], "must be >= 1"),
        (["rosters", "check", "/nonexistent/roster.yaml"], "unknown roster"),
    ],
)
def test_user_mistakes_get_one_line_and_exit_2(args: list[str], message: str) -> None:
    result = run(*args, timeout=60)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr


def test_chat_refuses_a_db_that_is_no_checkpoint_database(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import sqlite3

    from mascot.cli import main

    garbage = tmp_path / "notes.txt"
    garbage.write_text("not a database, just text that is long enough to fill a header\n" * 4)
    other = tmp_path / "other.db"
    with sqlite3.connect(other) as connection:
        connection.execute("CREATE TABLE invoices (id INTEGER)")
    connection.close()
    chat = ["chat", "--roster", "emotional_support", "--model", "m", "--message", "hi", "--db"]
    assert main([*chat, str(garbage)]) == 2
    assert capsys.readouterr().err.splitlines() == [f"mascot: error: --db: {garbage} is not a SQLite database"]
    assert main([*chat, str(other)]) == 2
    stderr = capsys.readouterr().err
    assert stderr.count("\n") == 1 and "no LangGraph checkpoint tables (checkpoints, writes)" in stderr
    with sqlite3.connect(other) as connection:  # left as it was
        assert [r[0] for r in connection.execute("SELECT name FROM sqlite_master")] == ["invoices"]
    connection.close()
    assert main([*chat, str(tmp_path)]) == 2
    assert "is not a regular file" in capsys.readouterr().err
