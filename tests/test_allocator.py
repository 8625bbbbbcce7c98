"""The allocator setting of processes that train or serve (mascot.policies.allocator)."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from mascot.policies import allocator
from mascot.policies.allocator import ALLOCATOR_ENV, GLIBC_ENV, MODES, allocator_env, with_allocator


def test_jemalloc_is_preloaded_before_what_was_there(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(allocator, "jemalloc_library", lambda: "/lib/libjemalloc.so.2")
    env = allocator_env({"LD_PRELOAD": "/lib/other.so", "PATH": "/bin"})
    assert env["LD_PRELOAD"] == "/lib/libjemalloc.so.2:/lib/other.so"
    assert env["MALLOC_CONF"] == MODES["train"] and "dirty_decay_ms:-1" in env["MALLOC_CONF"]
    assert env[ALLOCATOR_ENV] == "jemalloc" and env["PATH"] == "/bin"
    # sampling in process fragments the heap: freed pages go back after a while
    assert "dirty_decay_ms:10000" in allocator_env({}, mode="generate")["MALLOC_CONF"]
    # a server's request shapes vary: jemalloc with its own defaults
    server = allocator_env({}, mode="serve")
    assert server["LD_PRELOAD"] == "/lib/libjemalloc.so.2" and "MALLOC_CONF" not in server
    with pytest.raises(ValueError, match="allocator mode 'fast'"):
        allocator_env({}, mode="fast")
    # a user's own settings win, and a second pass adds nothing
    assert allocator_env({"MALLOC_CONF": "narenas:2"})["MALLOC_CONF"] == "narenas:2"
    assert allocator_env(env)["LD_PRELOAD"] == env["LD_PRELOAD"]


def test_without_jemalloc_glibc_keeps_freed_memory_and_says_so_once(monkeypatch: pytest.MonkeyPatch,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(allocator, "jemalloc_library", lambda: None)
    monkeypatch.setattr(allocator, "_warned", [])
    with caplog.at_level(logging.INFO, logger="mascot.policies.allocator"):
        first, second = allocator_env({}), allocator_env({})
    assert first == second == {**GLIBC_ENV, ALLOCATOR_ENV: "glibc"}
    assert ([r.message for r in caplog.records if "jemalloc is not installed" in r.message]
            == [caplog.records[0].message])
    assert allocator_env({}, mode="serve") == {}  # a server keeps glibc as it comes
    with pytest.raises(ValueError, match="libjemalloc.so.2 is not installed"):
        allocator_env({}, choice="jemalloc")


def test_system_leaves_the_allocator_alone_and_a_bad_choice_is_refused() -> None:
    assert allocator_env({"PATH": "/bin"}, choice="system") == {"PATH": "/bin", ALLOCATOR_ENV: "system"}
    assert allocator_env({ALLOCATOR_ENV: "system"}) == {ALLOCATOR_ENV: "system"}
    with pytest.raises(ValueError, match="MASCOT_ALLOCATOR=tcmalloc: use jemalloc, glibc or system"):
        allocator_env({ALLOCATOR_ENV: "tcmalloc"})


@pytest.mark.skipif(allocator.jemalloc_library() is None, reason="jemalloc is not installed here")
def test_a_started_process_runs_on_jemalloc() -> None:
    code = ("from pathlib import Path; from mascot.policies.allocator import active_allocator; "
            "print(active_allocator(), 'libjemalloc' in Path('/proc/self/maps').read_text())")
    done = subprocess.run([sys.executable, "-c", code], env=allocator_env(), capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["jemalloc", "True"]


def test_a_training_command_restarts_itself_with_the_setting_once(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    calls: list[tuple[str, list[str], dict[str, str]]] = []

    class Restarted(Exception):
        pass

    def execve(path: str, argv: list[str], env: dict[str, str]) -> None:
        calls.append((path, argv, env))
        raise Restarted

    monkeypatch.setattr(allocator.os, "execve", execve)
    monkeypatch.delenv(ALLOCATOR_ENV, raising=False)
    monkeypatch.setattr(sys, "orig_argv", [sys.executable, "-m", "mascot", "train-rm", "--pairs", "p", "--out", "o"])
    monkeypatch.setattr(sys, "argv", ["mascot", "train-rm", "--pairs", str(tmp_path / "p"), "--out", str(tmp_path)])
    from mascot.cli import main

    assert main() == 2 and calls == []  # a flag's mistake is said first, without a second start
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "train.jsonl").write_text("")
    for name in ("e", "s"):
        (tmp_path / name).write_text("")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(Restarted):
        main()  # the real command line: the process starts again with the setting
    assert calls[0][1] == [sys.executable, "-m", "mascot", "train-rm", "--pairs", "p", "--out", "o"]
    assert calls[0][2][ALLOCATOR_ENV] in ("jemalloc", "glibc")
    if calls[0][2][ALLOCATOR_ENV] == "jemalloc":
        assert calls[0][2]["MALLOC_CONF"] == MODES["train"]
    # Director GRPO sampling in process: the mode that gives memory back
    monkeypatch.setattr(sys, "argv", ["mascot", "train-director", *["--roster", "emotional_support"],
                                      "--episodes", "e", "--speakers", "s", "--out", str(tmp_path)])
    with pytest.raises(Restarted):
        main()
    if calls[1][2][ALLOCATOR_ENV] == "jemalloc":
        assert calls[1][2]["MALLOC_CONF"] == MODES["generate"]
    # sampled on a vLLM server too: a trainer that kept every page grew to 18 GiB in 7 steps
    monkeypatch.setattr(sys, "argv", [*sys.argv, "--engine", "vllm"])
    with pytest.raises(Restarted):
        main()
    if calls[2][2][ALLOCATOR_ENV] == "jemalloc":
        assert calls[2][2]["MALLOC_CONF"] == MODES["generate"]
    calls.pop()
    # called as a function (tests, notebooks) it never restarts; nor once the setting is there
    assert main(["train-rm", "--pairs", str(tmp_path / "missing"), "--out", str(tmp_path / "rm")]) == 2
    monkeypatch.setenv(ALLOCATOR_ENV, "glibc")
    with_allocator()
    assert len(calls) == 2
