"""Bad files: fuzzed rosters, policy files, rubrics and training recipes (wrong types,
missing fields, duplicate ids, unknown keys, cut-off text, stray bytes) and hostile ones
(10 MB, alias bombs, recursive aliases, deep nesting, non-UTF-8) get one clear error line
(a file with several problems: that line, ``FILE: N problems:``, then one indented line
per problem) and exit code 2 from the command line, every time, in bounded time and memory."""

from __future__ import annotations

import copy
import re
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from helpers import mascot
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from suite_tally import count

from mascot.cli import main
from mascot.rosters import roster_path

REPO = Path(__file__).resolve().parents[2]
VALID: dict[str, Any] = {
    "roster": yaml.safe_load(roster_path("emotional_support").read_text()),
    "policy": {"version": 1, "defaults": {"kind": "local", "model": "Qwen/Qwen3-0.6B", "max_tokens": 200},
               "roles": {"default": {}, "director": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1",
                                                     "model": "director", "api_key_env": "MY_KEY"}}},
    "rubric": yaml.safe_load((REPO / "mascot" / "training" / "judging" / "rubrics" / "persona.yaml").read_text()),
    "recipe": yaml.safe_load(
        (REPO / "mascot" / "training" / "fitting" / "recipes" / "speakers-dpo-cpu-smoke.yaml").read_text()),
}


def command(kind: str, path: Path, tmp: Path) -> list[str]:
    """A command that reads ``path`` as a ``kind`` file first and, when it is valid, stops at once."""
    return {
        "roster": ["rosters", "check", str(path)],
        "policy": ["serve", "--policies", str(path), "--engine", "vllm", "--dry-run"],
        "rubric": ["judge", "--in", str(tmp / "missing.jsonl"), "--rubric", str(path), "--roster", "emotional_support",
                   "--out", str(tmp / "j.jsonl")],
        "recipe": ["train-speakers", "--roster", "emotional_support", "--method", "dpo", "--config", str(path),
                   "--out", str(tmp / "adapters")],
        "pipeline": ["pipeline", "--recipe", str(path)],
    }[kind]


@pytest.fixture(scope="module", autouse=True)
def warm(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Run every command once on a valid file, so that imports are not counted as its cost."""
    tmp = tmp_path_factory.mktemp("warm")
    for kind, document in VALID.items():
        path = tmp / f"{kind}.yaml"
        path.write_text(yaml.safe_dump(document))
        main(command(kind, path, tmp))


def run(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, float, float]:
    """``mascot ARGS`` in process: exit code, stderr, seconds and peak MiB allocated."""
    capsys.readouterr()
    tracemalloc.start()
    start = time.perf_counter()
    try:
        code = main(args)
    except SystemExit as exc:  # argparse
        code = int(exc.code or 0)
    seconds = time.perf_counter() - start
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    count(inputs_tried=1)
    return code, capsys.readouterr().err, seconds, peak


def assert_refused(code: int, stderr: str, path: Path) -> None:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert code == 2, stderr
    assert_one_error(stderr)
    assert "Traceback" not in stderr and str(path.name) in lines[0], stderr


def assert_one_error(stderr: str) -> None:
    """One ``mascot: error:`` line, or its ``N problems:`` summary and exactly N indented lines."""
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[0].startswith("mascot: error:"), stderr
    several = re.search(r": (\d+) problems:$", lines[0])
    problems = int(several.group(1)) if several else 0
    assert problems != 1 and len(lines) == 1 + problems, stderr
    assert all(line.startswith("  ") and not line.startswith("   ") for line in lines[1:]), stderr


def _bomb() -> bytes:
    levels = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    levels += [f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join([f'*{chr(97 + i)}'] * 9)}]" for i in range(8)]
    return "\n".join(levels).encode() + b"\n"


HOSTILE: dict[str, Callable[[bytes], bytes]] = {
    "10 MB": lambda valid: valid + b"# " + b"x" * (10 * 2**20) + b"\n",
    "alias bomb": lambda valid: _bomb(),
    "alias bomb inside a valid file": lambda valid: valid + b"padding:\n" + b"".join(
        b"  " + line + b"\n" for line in _bomb().splitlines()),
    "recursive alias": lambda valid: b"personas: &p [*p]\n",
    "deep nesting": lambda valid: b"x: " + b"[" * 100_000 + b"]" * 100_000 + b"\n",
    "non-UTF-8": lambda valid: valid.replace(b"a", b"\xe9", 3),
    "binary": lambda valid: bytes(range(256)) * 64,
    "empty": lambda valid: b"",
    "a list": lambda valid: b"- 1\n- 2\n",
    "duplicate key": lambda valid: valid + valid.splitlines(keepends=True)[0],
    "tab indentation": lambda valid: b"version: 1\nroles:\n\tdefault: {}\n",
    "impossible date": lambda valid: valid + b"created: 2024-02-30\n",
    "5000-digit integer": lambda valid: valid + b"big: " + b"9" * 5000 + b"\n",
    "bad typed value": lambda valid: valid + b"typed: !!int abc\n",
}


@pytest.mark.parametrize("kind", ["roster", "policy", "rubric", "recipe", "pipeline"])
@pytest.mark.parametrize("case", list(HOSTILE))
def test_hostile_files_are_refused_in_one_line(kind: str, case: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    valid = yaml.safe_dump(VALID.get(kind, {"rollout": {"episodes": 2}}), sort_keys=False).encode()
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(HOSTILE[case](valid))
    code, stderr, seconds, peak = run(command(kind, path, tmp_path), capsys)
    assert_refused(code, stderr, path)
    assert seconds < 5 and peak < 64, f"{seconds:.1f} s, {peak:.0f} MiB"


def _paths(data: Any, prefix: tuple = ()) -> list[tuple]:
    """Every path into nested dicts and lists."""
    found = [prefix] if prefix else []
    if isinstance(data, dict):
        for key, value in data.items():
            found += _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for i, value in enumerate(data):
            found += _paths(value, (*prefix, i))
    return found


def _mutate(data: Any, draw: Any) -> Any:
    data = copy.deepcopy(data)
    path = draw(st.sampled_from(_paths(data)))
    parent = data
    for step in path[:-1]:
        parent = parent[step]
    last = path[-1]
    how = draw(st.sampled_from(["delete", "retype", "duplicate", "unknown key"]))
    if how == "delete":
        del parent[last]
    elif how == "retype":
        parent[last] = draw(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30)
                            | st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=5), st.integers(),
                                                                                    max_size=2))
    elif how == "duplicate" and isinstance(parent, list):
        parent.append(copy.deepcopy(parent[last]))
    else:
        target = parent[last] if isinstance(parent[last], dict) else parent
        if isinstance(target, dict):
            target[draw(st.text(min_size=1, max_size=12))] = draw(st.integers())
    return data


def _corrupt(text: bytes, draw: Any) -> bytes:
    cut = draw(st.integers(0, len(text)))
    how = draw(st.sampled_from(["cut", "insert", "bytes"]))
    if how == "cut":
        return text[:cut]
    if how == "insert":
        return text[:cut] + draw(st.text(max_size=20)).encode() + text[cut:]
    return text[:cut] + draw(st.binary(min_size=1, max_size=8)) + text[cut:]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data(), kind=st.sampled_from(sorted(VALID)))
def test_fuzzed_files_pass_or_fail_in_one_line(data: st.DataObject, kind: str, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    document = _mutate(VALID[kind], data.draw)
    text = yaml.safe_dump(document, sort_keys=False, allow_unicode=True).encode()
    if data.draw(st.booleans()):
        text = _corrupt(text, data.draw)
    path = tmp_path / f"fuzzed-{kind}.yaml"
    path.write_bytes(text)
    code, stderr, seconds, peak = run(command(kind, path, tmp_path), capsys)
    if code != 0:
        assert_refused(code, stderr, path) if "--in" not in stderr and "needs --pairs" not in stderr else None
        assert code == 2 and "Traceback" not in stderr
        assert_one_error(stderr)
    assert seconds < 5 and peak < 64


@pytest.mark.parametrize("kind", ["roster", "policy", "rubric", "recipe"])
def test_the_installed_command_exits_2_without_a_traceback(kind: str, tmp_path: Path) -> None:
    path = tmp_path / f"{kind}.yaml"
    path.write_bytes(_bomb())
    result = mascot(*command(kind, path, tmp_path), timeout=60)
    count(inputs_tried=1)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    flag = "--config " if kind == "recipe" else ""
    assert result.stderr.strip().splitlines() == [
        f"mascot: error: {flag}{path}: YAML holds more than 200,000 nodes once its aliases are expanded"]


def test_a_device_with_no_end_is_refused_within_the_size_limit(capsys: pytest.CaptureFixture[str]) -> None:
    code, stderr, seconds, peak = run(["serve", "--policies", "/dev/zero", "--engine", "vllm", "--dry-run"], capsys)
    assert_refused(code, stderr, Path("/dev/zero"))
    assert "file too large" in stderr and seconds < 5 and peak < 64
