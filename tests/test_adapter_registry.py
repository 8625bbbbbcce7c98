"""Trained adapters registered in a policy file load into the graph and `mascot chat`."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from mascot.graphs import create_director_graph
from mascot.policies import Policies, PolicyError
from mascot.rosters import Roster
from mascot.training.fitting.adapter_registry import register_adapter


def test_registered_adapters_drive_the_graph_and_chat(tiny_model: Path, roster: Roster, tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    for pid in ("anchor", "catalyst"):  # stand-ins for adapters a training run saved
        shutil.copytree(tiny_model / "adapters" / pid, runs / pid)
    policy_file = tmp_path / "policies.yaml"
    first = register_adapter(policy_file, "anchor", base=str(tiny_model), adapter=runs / "anchor", roster=roster)
    register_adapter(policy_file, "catalyst", base=str(tiny_model), adapter=runs / "catalyst", roster=roster,
                     version="v2")
    register_adapter(policy_file, "catalyst", base=str(tiny_model), adapter=runs / "catalyst", roster=roster,
                     version="v3")  # a retrained adapter replaces its entry
    data = yaml.safe_load(policy_file.read_text())
    assert data["roles"]["anchor"]["adapter"] == "runs/anchor" and data["roles"]["anchor"]["version"] == first
    assert data["roles"]["catalyst"]["version"] == "v3" and "adapter" not in data["roles"]["default"]
    policies = Policies.from_file(policy_file, roster, seed=1)
    assert policies.record("catalyst") == {"model": str(tiny_model), "adapter": "catalyst", "adapter_version": "v3"}
    graph = create_director_graph(roster, director=policies.chat_model("director"), speakers=policies.speakers())
    assert graph.compile() is not None
    result = subprocess.run(
        [str(Path(sys.executable).parent / "mascot"), "chat", "--roster", "emotional_support", "--policies",
         str(policy_file), "--message", "hello", "--max-tokens", "6", "--json"],
        capture_output=True, text=True, timeout=180, env={**os.environ, "HF_HUB_OFFLINE": "1"},
    )
    assert result.returncode == 0, result.stderr
    assert '"anchor": "' in result.stdout and "+ anchor (local)" in result.stdout


def test_registration_refuses_bad_input(tiny_model: Path, roster: Roster, tmp_path: Path) -> None:
    policy_file = tmp_path / "policies.yaml"
    with pytest.raises(PolicyError, match="no PEFT adapter"):
        register_adapter(policy_file, "anchor", base=str(tiny_model), adapter=tmp_path, roster=roster)
    with pytest.raises(PolicyError, match="role 'nobody'"):
        register_adapter(policy_file, "nobody", base=str(tiny_model), adapter=tiny_model / "adapters/anchor",
                         roster=roster)
    policy_file.write_text("roles: {anchor: {kind: nonsense}}\n")
    with pytest.raises(PolicyError):
        register_adapter(policy_file, "anchor", base=str(tiny_model), adapter=tiny_model / "adapters/anchor",
                         roster=roster)
    assert policy_file.read_text() == "roles: {anchor: {kind: nonsense}}\n"  # left as it was


def test_concurrent_registrations_keep_every_entry(tiny_model: Path, roster: Roster, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import threading
    import time

    from mascot.training.fitting import adapter_registry

    policy_file = tmp_path / "policies.yaml"
    register_adapter(policy_file, "anchor", base=str(tiny_model), adapter=tiny_model / "adapters/anchor",
                     roster=roster, version="1")
    slow_read = adapter_registry.read_yaml

    def read_then_pause(path: Path) -> dict:
        data = slow_read(path)
        time.sleep(0.2)  # every run has read the file before any writes: a lost update without the lock
        return data

    monkeypatch.setattr(adapter_registry, "read_yaml", read_then_pause)
    roles = [p for p in roster.persona_ids if p != "anchor"] + ["director"]
    errors: list[BaseException] = []

    def register(role: str) -> None:
        try:
            register_adapter(policy_file, role, base=str(tiny_model), adapter=tiny_model / "adapters/anchor",
                             roster=roster, version="2")
        except BaseException as exc:  # reported below: a thread's exception is otherwise lost
            errors.append(exc)

    threads = [threading.Thread(target=register, args=(role,)) for role in roles]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert not errors
    registered = yaml.safe_load(policy_file.read_text())["roles"]
    assert set(registered) == {"default", "anchor", *roles}
    assert all(registered[role]["version"] == "2" for role in roles)
