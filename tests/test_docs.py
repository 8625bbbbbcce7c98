"""Every ```python block of README.md runs as written, so the README cannot drift.

Each block runs in its own process (the README's rule: one event loop per process), in a
fresh folder that holds what the blocks read, with OpenAI's client pointed at the stub
server through its standard variables: ``ChatOpenAI(model="gpt-4o-mini")`` reaches
127.0.0.1, nothing else. A block marked ```python fragment (a piece of a larger program) is
only compiled. Nothing in a block is replaced: what runs is what a reader copies.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from fakes import PromptChat, digest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver

from mascot.testing.stub_server import StubServer, start_stub_server

README = Path(__file__).parents[1] / "README.md"
#: Seconds one block may run (the slowest, 50 episodes against the stub, takes ~20 s alone).
TIMEOUT_S = 300
_FENCE = re.compile(r"^(`{3,})(.*)$")
#: Variables that would send a block's calls elsewhere than the stub (or to LangSmith).
_UNSET = ("OPENAI_API_BASE", "OPENAI_ORGANIZATION", "LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2",
          "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY")


@dataclass(frozen=True)
class Block:
    """A fenced python block of the README."""

    heading: str
    index: int  # among the python blocks under the same heading, from 1
    line: int  # of the opening fence, from 1
    fragment: bool
    code: str

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"{slug}-{self.index}"


def python_blocks(text: str) -> list[Block]:
    """The ```python blocks of a Markdown text, each with the heading above it.

    Headings inside fences (a ``# comment`` in a bash block) are not headings.
    """
    blocks: list[Block] = []
    heading, fence, info, start, body = "(top)", "", "", 0, []
    counts: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        match = _FENCE.match(line)
        if fence:
            if match and match.group(1) == fence and not match.group(2).strip():
                words = info.split()
                if words and words[0] == "python":
                    counts[heading] = counts.get(heading, 0) + 1
                    blocks.append(Block(heading, counts[heading], start, "fragment" in words[1:],
                                        "\n".join(body) + "\n"))
                fence = ""
            else:
                body.append(line)
        elif match:
            fence, info, start, body = match.group(1), match.group(2).strip(), number, []
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    assert not fence, f"README.md: the fence opened at line {start} is never closed"
    return blocks


BLOCKS = python_blocks(README.read_text(encoding="utf-8"))


def test_readme_blocks_are_found() -> None:
    assert len({b.id for b in BLOCKS}) == len(BLOCKS)
    ids = {b.id for b in BLOCKS}
    assert {"use-the-graph-in-your-app-1", "local-models-and-adapters-from-python-1", "from-python-1"} <= ids


@pytest.fixture(scope="session")
def stub() -> Iterator[StubServer]:
    """The OpenAI-compatible stub: directions for the Director, sentences for everyone else."""
    with start_stub_server() as server:
        yield server


@pytest.fixture(scope="session")
def readme_files(tmp_path_factory: pytest.TempPathFactory, roster) -> Path:
    """What the README's blocks read, built once:

    - ``tiny/``: ``mascot tiny-model --out tiny --with-adapters`` (a policy file, an
      adapter per persona);
    - ``checkpoints.db``: an app's SQLite checkpointer database, written by the real
      compiled director graph (two threads, scripted models).
    """
    from mascot.graphs import create_director_graph
    from mascot.testing.tiny_model import build_tiny_model

    folder = tmp_path_factory.mktemp("readme-files")
    build_tiny_model(folder / "tiny", with_adapters=True)
    choices = [*roster.persona_ids, "user"]
    director = PromptChat(reply=lambda p: json.dumps(
        {"speaker": choices[digest(p) % len(choices)], "action": "respond", "tone": "warm"}))
    speakers = PromptChat(reply=lambda p: f"reply {digest(p) % 10007}")
    connection = sqlite3.connect(folder / "checkpoints.db", check_same_thread=False)
    graph = create_director_graph(roster, director=director, speakers=speakers).compile(
        checkpointer=SqliteSaver(connection))
    for thread, texts in {"alice": ["I failed my driving test again", "The parking, again"],
                          "bob": ["My team ignores my ideas"]}.items():
        for text in texts:
            graph.invoke({"messages": [HumanMessage(text)]}, {"configurable": {"thread_id": thread}})
    connection.close()
    return folder


@pytest.mark.parametrize("block", BLOCKS, ids=[b.id for b in BLOCKS])
def test_readme_python_block_runs(block: Block, stub: StubServer, readme_files: Path, tmp_path: Path) -> None:
    where = f"README.md line {block.line} (under '{block.heading}')"
    compile(block.code, f"README.md:{block.line}", "exec")  # a syntax error names the block
    if block.fragment:
        return
    for item in readme_files.iterdir():  # a copy each: a block may write where it reads
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp_path / item.name)
    script = tmp_path / "readme_block.py"
    script.write_text(block.code, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key not in _UNSET}
    env.update(OPENAI_BASE_URL=stub.url, OPENAI_API_KEY="dummy", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    try:
        result = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{where} ran over {TIMEOUT_S} s; stderr:\n{(exc.stderr or b'')[-3000:]!r}")
    print(f"{where}, stdout:\n{result.stdout}")  # shown with -s, and with a failure
    assert result.returncode == 0, (
        f"{where} failed (exit {result.returncode})\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-6000:]}")
