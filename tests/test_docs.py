"""Every block of README.md and docs/*.md runs as written, so the docs cannot drift.

- ```python blocks run each in its own process (one event loop per process), in a fresh
  folder holding what they read (``tiny/`` from ``mascot tiny-model --with-adapters``, an
  app's ``checkpoints.db``), with OpenAI's client pointed at the stub server through its
  standard variables: ``ChatOpenAI(model="gpt-4o-mini")`` reaches 127.0.0.1, nothing else.
  ```python fragment (a piece of a larger program) is only compiled.
- ```bash blocks run page by page, in the order of ``SHELL_PAGES``, in one folder (a page
  goes on from the files the earlier pages wrote, as a reader following them would), with
  the virtualenv's ``mascot`` first on ``PATH``; a background process a block starts is
  stopped when its page ends. A block marked ``gpu`` (needs a CUDA GPU), ``online`` (needs a
  key, the Hub or a server elsewhere), ``scratch`` (installs from a fresh clone: ``.ci/run``
  does that) or ``serves`` (a server that runs until stopped: ``tests/test_studio.py`` and
  ``tests/test_serve_cli.py`` run them) is not run; it and every other block still parse
  (``bash -n``), and every ``mascot`` command line in them parses with mascot's own parser.
- ```mermaid is what ``mascot graph`` prints, ```yaml parses, the command-line reference is
  what the parsers generate, and every relative link points at a file and heading that exist.

Nothing in a block is replaced: what runs is what a reader copies.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from fakes import PromptChat, digest
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from test_safety_memory import PLAIN_INSTALL

from mascot.testing.stub_server import StubServer, start_stub_server

ROOT = Path(__file__).parents[1]
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md"))]
#: The pages whose shell blocks run, in this order, in one folder (the method's pages go on
#: from each other's files); the other pages' blocks are all marked.
SHELL_PAGES = ["docs/rosters.md", "docs/episodes.md", "docs/judging.md", "docs/training.md",
               "docs/evaluation.md", "docs/serving.md", "docs/safety.md"]
#: Marks of a shell block that is parsed but not run (see the module docstring).
NOT_RUN = {"gpu", "online", "scratch", "serves"}
#: Seconds one block (python) or one page (shell) may run.
TIMEOUT_S = 600
_FENCE = re.compile(r"^(`{3,})(.*)$")
#: Variables that would send a block's calls elsewhere than the stub (or to LangSmith).
_UNSET = ("OPENAI_API_BASE", "OPENAI_ORGANIZATION", "LANGSMITH_TRACING", "LANGCHAIN_TRACING_V2",
          "LANGSMITH_API_KEY", "LANGCHAIN_API_KEY")


@dataclass(frozen=True)
class Block:
    """A fenced block of a page."""

    page: str  # relative to the repository
    heading: str
    index: int  # among the blocks under the same heading, from 1
    line: int  # of the opening fence, from 1
    lang: str
    marks: tuple[str, ...]
    code: str

    @property
    def id(self) -> str:
        slug = re.sub(r"[^a-z0-9]+", "-", self.heading.lower()).strip("-")
        return f"{self.page}:{slug}-{self.index}"

    @property
    def where(self) -> str:
        return f"{self.page} line {self.line} (under '{self.heading}')"


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, each with the heading above it.

    Headings inside fences (a ``# comment`` in a bash block) are not headings.
    """
    page = path.relative_to(ROOT).as_posix()
    blocks: list[Block] = []
    heading, fence, info, start, body = "(top)", "", "", 0, []
    counts: dict[str, int] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        match = _FENCE.match(line)
        if fence:
            if match and match.group(1) == fence and not match.group(2).strip():
                lang, *marks = info.split() or [""]
                counts[heading] = counts.get(heading, 0) + 1
                blocks.append(Block(page, heading, counts[heading], start, lang, tuple(marks),
                                    "\n".join(body) + "\n"))
                fence = ""
            else:
                body.append(line)
        elif match:
            fence, info, start, body = match.group(1), match.group(2).strip(), number, []
        elif line.startswith("#"):
            heading = line.lstrip("#").strip()
    assert not fence, f"{page}: the fence opened at line {start} is never closed"
    return blocks


ALL = [block for path in PAGES for block in page_blocks(path)]
PYTHON = [b for b in ALL if b.lang == "python"]
SHELL = [b for b in ALL if b.lang in ("bash", "sh", "shell")]


def test_blocks_are_found() -> None:
    assert len({b.id for b in ALL}) == len(ALL)
    ids = {b.id for b in PYTHON}
    assert {"README.md:use-it-in-your-app-1", "docs/app.md:local-models-and-adapters-from-python-1",
            "docs/episodes.md:from-python-1"} <= ids
    assert all(b.lang for b in ALL), [b.where for b in ALL if not b.lang]  # every fence names its language
    unknown = [b.where for b in SHELL if set(b.marks) - NOT_RUN]
    assert not unknown, f"unknown marks: {unknown}"
    stray = [b.where for b in SHELL if b.page not in SHELL_PAGES and not set(b.marks) & NOT_RUN]
    assert not stray, f"shell blocks on a page outside SHELL_PAGES would never run: {stray}"


def test_readme_is_short_and_starts_with_the_app() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    assert len(lines) <= 300, f"README.md has {len(lines)} lines; at most 300"
    first = min(b.line for b in PYTHON if b.page == "README.md")
    assert first <= 80, f"README.md's first Python block starts at line {first}; by line 80"


@pytest.fixture(scope="session")
def stub() -> Iterator[StubServer]:
    """The OpenAI-compatible stub: directions for the Director, sentences for everyone else."""
    with start_stub_server() as server:
        yield server


@pytest.fixture(scope="session")
def docs_files(tmp_path_factory: pytest.TempPathFactory, roster) -> Path:
    """What the blocks read, built once:

    - ``tiny/``: ``mascot tiny-model --out tiny --with-adapters`` (a policy file, an
      adapter per persona);
    - ``checkpoints.db``: an app's SQLite checkpointer database, written by the real
      compiled director graph (two threads, scripted models).
    """
    from mascot.graphs import create_director_graph
    from mascot.testing.tiny_model import build_tiny_model

    folder = tmp_path_factory.mktemp("docs-files")
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


@pytest.mark.parametrize("block", PYTHON, ids=[b.id for b in PYTHON])
def test_python_block_runs(block: Block, stub: StubServer, docs_files: Path, tmp_path: Path) -> None:
    where = block.where
    compile(block.code, f"{block.page}:{block.line}", "exec")  # a syntax error names the block
    if "fragment" in block.marks:
        return
    for item in docs_files.iterdir():  # a copy each: a block may write where it reads
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, tmp_path / item.name)
    script = tmp_path / "docs_block.py"
    script.write_text(block.code, encoding="utf-8")
    env = {key: value for key, value in os.environ.items() if key not in _UNSET}
    env.update(OPENAI_BASE_URL=stub.url, OPENAI_API_KEY="dummy", HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    if block.page == "README.md":  # the README promises these run on a plain `pip install mascot`
        (tmp_path / "sitecustomize.py").write_text(PLAIN_INSTALL, encoding="utf-8")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(tmp_path), env.get("PYTHONPATH")]))
        env.pop("MASCOT_ENCODER", None)  # the tests' choice of encoder; a plain install has only its own
        env["MASCOT_CACHE"] = str(tmp_path / "cache")  # no encoder or classifier built by other runs
    try:
        result = subprocess.run([sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True,
                                text=True, timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired as exc:
        pytest.fail(f"{where} ran over {TIMEOUT_S} s; stderr:\n{(exc.stderr or b'')[-3000:]!r}")
    print(f"{where}, stdout:\n{result.stdout}")  # shown with -s, and with a failure
    assert result.returncode == 0, (
        f"{where} failed (exit {result.returncode})\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-6000:]}")


# --- shell blocks -------------------------------------------------------------------------

_OPERATORS = {"&&", "||", ";", "|", "&", "(", ")"}


def mascot_commands(code: str) -> list[list[str]]:
    """The argument lists of every ``mascot`` (or ``.venv/bin/mascot``) command in a shell
    block, continuation lines joined, comments dropped, ``$NAME`` expanded from the block's
    own ``NAME="..."`` assignments."""
    names: dict[str, str] = {}
    found: list[list[str]] = []
    for line in code.replace("\\\n", " ").splitlines():
        for name, value in names.items():
            line = line.replace(f"${{{name}}}", value).replace(f"${name}", value)
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split, lexer.commenters = True, "#"
        tokens = list(lexer)
        segment: list[str] = []
        for token in [*tokens, ";"]:
            if token not in _OPERATORS:
                segment.append(token)
                continue
            words = list(segment)
            while words and re.match(r"^[A-Za-z_]\w*=", words[0]):  # NAME=value before a command
                words.pop(0)
            if not words and len(segment) == 1:  # NAME=value alone: a variable of the block
                name, value = segment[0].split("=", 1)
                names[name] = value
            if words and Path(words[0]).name == "mascot":
                found.append(words[1:])
            segment = []
    return found


@pytest.mark.parametrize("block", SHELL, ids=[b.id for b in SHELL])
def test_shell_block_parses(block: Block) -> None:
    syntax = subprocess.run(["bash", "-n"], input=block.code, capture_output=True, text=True)
    assert syntax.returncode == 0, f"{block.where}: {syntax.stderr}"
    from mascot.cli.main import _parser

    for argv in mascot_commands(block.code):
        parser = _parser()
        try:
            args, extra = parser.parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"{block.where}: `mascot {' '.join(argv)}` does not parse (see the error above)")
        assert not extra or hasattr(args, "trainer_flags"), (
            f"{block.where}: `mascot {' '.join(argv)}`: unrecognized arguments {extra}")


def test_mascot_commands_are_found() -> None:
    code = ('M="--roster r --k 2"\nmascot candidates --in e.jsonl $M \\\n  --out c.jsonl  # four\n'
            'X=1 .venv/bin/mascot demo && ls\n')
    assert mascot_commands(code) == [["candidates", "--in", "e.jsonl", "--roster", "r", "--k", "2", "--out", "c.jsonl"],
                                     ["demo"]]


class ShellPages:
    """Runs the shell pages in ``SHELL_PAGES`` order in one folder, each once, on demand."""

    def __init__(self, folder: Path, env: dict[str, str]) -> None:
        self.folder, self.env = folder, env
        self.results: dict[str, subprocess.CompletedProcess[str] | str] = {}

    def run(self, page: str) -> subprocess.CompletedProcess[str] | str:
        for earlier in SHELL_PAGES[:SHELL_PAGES.index(page) + 1]:
            if earlier not in self.results:
                self.results[earlier] = self._run(earlier)
        return self.results[page]

    def _run(self, page: str) -> subprocess.CompletedProcess[str] | str:
        blocks = [b for b in SHELL if b.page == page and not set(b.marks) & NOT_RUN]
        script = ["set -euo pipefail", "trap 'jobs -p | xargs -r kill 2>/dev/null || true; wait' EXIT"]
        for block in blocks:
            script += [f"echo {shlex.quote('>>> ' + block.where)} >&2", block.code]
        try:
            return subprocess.run(["bash", "-c", "\n".join(script)], cwd=self.folder, env=self.env,
                                  capture_output=True, text=True, timeout=TIMEOUT_S)
        except subprocess.TimeoutExpired as exc:
            return f"ran over {TIMEOUT_S} s; stderr:\n{(exc.stderr or b'')[-3000:]!r}"


@pytest.fixture(scope="session")
def shell_pages(docs_files: Path, tmp_path_factory: pytest.TempPathFactory) -> ShellPages:
    folder = tmp_path_factory.mktemp("docs-shell")
    for item in docs_files.iterdir():
        (shutil.copytree if item.is_dir() else shutil.copy2)(item, folder / item.name)
    env = {key: value for key, value in os.environ.items() if key not in _UNSET}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", HF_HUB_OFFLINE="1",
               TRANSFORMERS_OFFLINE="1")
    return ShellPages(folder, env)


@pytest.mark.parametrize("page", SHELL_PAGES)
@pytest.mark.timeout(TIMEOUT_S + 60)  # a page has TIMEOUT_S (the training page takes 224 s on a 2-core AVX2 CPU)
def test_shell_page_runs(page: str, shell_pages: ShellPages) -> None:
    assert any(b.page == page for b in SHELL), f"{page} has no shell block: take it out of SHELL_PAGES"
    result = shell_pages.run(page)
    assert not isinstance(result, str), f"{page}: {result}"
    print(f"{page}, stdout:\n{result.stdout}")  # shown with -s, and with a failure
    assert result.returncode == 0, (
        f"{page}'s shell blocks failed (exit {result.returncode})\n--- stdout\n{result.stdout[-3000:]}"
        f"\n--- stderr\n{result.stderr[-6000:]}")


# --- what is generated -------------------------------------------------------------------

def test_the_pictured_graph_is_what_mascot_graph_prints() -> None:
    from mascot.cli.main import main

    pictures = [b for b in ALL if b.lang == "mermaid"]
    assert pictures, "README.md shows the graph"
    for block in pictures:
        command = re.search(r"`mascot graph\s+([^`]*)`", README.read_text(encoding="utf-8").replace("\n", " "))
        assert command, "README.md names the command that prints its picture"
        printed = subprocess.run([sys.executable, "-m", "mascot", "graph", *command.group(1).split()],
                                 capture_output=True, text=True, check=True).stdout
        assert block.code.strip() == printed.strip(), f"{block.where}: run `mascot graph {command.group(1)}`"
    assert callable(main)


@pytest.mark.parametrize("block", [b for b in ALL if b.lang == "yaml"], ids=lambda b: b.id)
def test_yaml_block_parses(block: Block) -> None:
    assert yaml.safe_load(block.code) is not None, block.where


def test_cli_reference_is_generated_from_the_parsers() -> None:
    from mascot.cli.reference import END, START, cli_reference

    page = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")
    assert page.count(START) == 1 and page.count(END) == 1
    assert page.split(START)[1].split(END)[0].strip() == cli_reference().strip(), (
        "docs/cli.md is out of date: run `python -m mascot.cli.reference --write docs/cli.md`")
    assert "### `mascot train-director`" in page and "`--group-rm GROUP_RM_DIR`" in page


def test_cli_reference_writer(tmp_path: Path) -> None:
    from mascot.cli.reference import END, START, main

    document = tmp_path / "cli.md"
    document.write_text(f"# CLI\n\n{START}\nOLD-TEXT\n{END}\ntail\n", encoding="utf-8")
    assert main(["--write", str(document)]) == 0
    text = document.read_text(encoding="utf-8")
    assert "OLD-TEXT" not in text and text.endswith(f"{END}\ntail\n") and "### `mascot chat`" in text
    (tmp_path / "plain.md").write_text("no markers\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_info:
        main(["--write", str(tmp_path / "plain.md")])
    assert exit_info.value.code == 2


# --- links ---------------------------------------------------------------------------------

def _anchors(path: Path) -> set[str]:
    """GitHub's heading anchors of a page."""
    anchors, fence = set(), ""
    for line in path.read_text(encoding="utf-8").splitlines():
        match = _FENCE.match(line)
        if fence:
            fence = "" if match and match.group(1) == fence and not match.group(2).strip() else fence
        elif match:
            fence = match.group(1)
        elif line.startswith("#"):
            title = line.lstrip("#").strip().lower()
            anchors.add(re.sub(r"[^\w\- ]", "", title).replace(" ", "-"))
    return anchors


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_links_resolve(path: Path) -> None:
    text = re.sub(r"```.*?```", "", path.read_text(encoding="utf-8"), flags=re.S)
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in _anchors(linked):
            broken.append(target)
    assert not broken, f"{path.relative_to(ROOT)}: links to nothing: {broken}"


# --- signatures come from the docstrings ----------------------------------------------------

_API = re.compile(r"<!-- api: ([\w.]+) -->\n(.*?)<!-- api: end -->", re.S)


def api_text(name: str) -> str:
    """The signature and docstring of a public function, as a page shows them."""
    import importlib
    import inspect

    module, _, attribute = name.rpartition(".")
    function = getattr(importlib.import_module(module), attribute)
    return f"```text\n{attribute}{inspect.signature(function)}\n\n{inspect.getdoc(function)}\n```\n"


@pytest.mark.parametrize("path", PAGES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_api_copies_are_the_docstrings(path: Path) -> None:
    for name, shown in _API.findall(path.read_text(encoding="utf-8")):
        assert shown == api_text(name), (
            f"{path.relative_to(ROOT)}: the copy of {name} differs from its docstring; put this between its "
            f"markers:\n{api_text(name)}")


# --- the README's map of the package ---------------------------------------------------------

def readme_map() -> set[str]:
    """The paths the README's map of the package names (indentation is nesting)."""
    block = next(b for b in ALL if b.page == "README.md" and b.heading == "The package" and b.lang == "text")
    listed, stack = set(), []
    for line in block.code.splitlines():
        if not line.strip():
            continue
        depth = (len(line) - len(line.lstrip())) // 2
        stack[depth:] = [line.split()[0].rstrip("/")]
        listed.add("/".join(stack))
    return listed


def test_readme_map_names_every_folder_and_nothing_else() -> None:
    listed = readme_map()
    missing = sorted(p.relative_to(ROOT).as_posix() for p in (ROOT / "mascot").rglob("__init__.py")
                     if p.parent != ROOT / "mascot" and p.parent.relative_to(ROOT).as_posix() not in listed)
    for folder in ("mascot", "mascot/training"):
        missing += sorted(f"{folder}/{p.name}" for p in (ROOT / folder).glob("*.py")
                          if p.name not in ("__main__.py", "__init__.py" if folder != "mascot" else "")
                          and f"{folder}/{p.name}" not in listed)
    assert not missing, f"README.md's map of the package lacks {missing}"
    gone = sorted(path for path in listed if not (ROOT / path).exists())
    assert not gone, f"README.md's map names what does not exist: {gone}"


def test_module_map_is_generated_from_the_docstrings() -> None:
    from mascot.cli.reference import MODULES_END, MODULES_START, module_map

    page = (ROOT / "docs" / "contributing.md").read_text(encoding="utf-8")
    assert page.count(MODULES_START) == 1 and page.count(MODULES_END) == 1
    assert page.split(MODULES_START)[1].split(MODULES_END)[0].strip() == module_map().strip(), (
        "docs/contributing.md's module map is out of date: run "
        "`python -m mascot.cli.reference --write docs/contributing.md`")
    assert "| `mascot/training/rewards.py` |" in page


def test_readme_inline_commands_parse() -> None:
    """The README's commands in running text and tables parse as written (every block's too)."""
    from mascot.cli.main import _parser

    spans = re.findall(r"`(mascot [^`]+)`", re.sub(r"```.*?```", "", README.read_text(encoding="utf-8"), flags=re.S))
    commands = [span for span in spans if "..." not in span and "--help" not in span]
    assert len(commands) >= 14
    for command in commands:
        argv = shlex.split(command)[1:]
        try:
            args, extra = _parser().parse_known_args(argv)
        except SystemExit:
            pytest.fail(f"README.md: `{command}` does not parse (see the error above)")
        assert not extra or hasattr(args, "trainer_flags"), f"README.md: `{command}`: unrecognized {extra}"
