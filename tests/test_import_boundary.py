"""The dependency rules of the layout: mascot.graphs, mascot.rosters and mascot.policies
(except policies/local/) import without torch; graphs and policies never import each other;
policies never imports training; nothing imports mascot.cli but the entry point."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

BLOCK_TORCH = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {'torch', 'transformers', 'peft', 'trl', 'accelerate', 'tokenizers'}:
            raise ImportError('blocked: ' + name)
sys.meta_path.insert(0, Block())
"""


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK_TORCH + code], capture_output=True, text=True, timeout=120)


def test_light_packages_import_without_torch() -> None:
    result = _run("import mascot, mascot.rosters, mascot.graphs, mascot.policies, mascot.cli\n"
                  "from mascot import create_director_graph, load_roster, Policies\n"
                  "assert 'torch' not in sys.modules\nprint('ok')")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"


def test_the_blocker_works() -> None:
    result = _run("import mascot.policies.local")
    assert result.returncode != 0 and "blocked: torch" in result.stderr


def _imports(folder: str, *, skip: str | None = None) -> set[str]:
    names: set[str] = set()
    for path in (ROOT / "mascot" / folder).rglob("*.py"):
        if skip and path.is_relative_to(ROOT / "mascot" / skip):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module:
                names.add(node.module)
            elif isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
    return names


def test_dependency_direction() -> None:
    graphs, policies, rosters = _imports("graphs"), _imports("policies"), _imports("rosters")
    assert not any(n.startswith("mascot.policies") for n in graphs)
    assert not any(n.startswith("mascot.graphs") for n in policies)
    assert not any(n.startswith(("mascot.graphs", "mascot.policies", "mascot.training")) for n in rosters)
    assert not any(n.startswith("mascot.training") for n in policies)


def test_the_folders_are_the_packages() -> None:
    import mascot.graphs
    import mascot.policies
    import mascot.rosters
    import mascot.training

    for package in (mascot.graphs, mascot.policies, mascot.rosters, mascot.training):
        assert Path(package.__file__).parent == ROOT / "mascot" / package.__name__.split(".")[1]
    assert "package-dir" not in (ROOT / "pyproject.toml").read_text()


def test_only_the_entry_point_imports_the_cli() -> None:
    users = set()
    for path in (ROOT / "mascot").rglob("*.py"):
        if path.is_relative_to(ROOT / "mascot" / "cli") or path.name == "__main__.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            modules = ([node.module] if isinstance(node, ast.ImportFrom) and node.module
                       else [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            if any(m == "mascot.cli" or m.startswith("mascot.cli.") for m in modules):
                users.add(str(path.relative_to(ROOT)))
    assert users == set()


def test_torch_only_in_the_local_backend() -> None:
    heavy = {"torch", "transformers", "peft", "trl", "accelerate", "tokenizers"}
    outside = {n for n in _imports("policies", skip="policies/local") if n.split(".")[0] in heavy}
    assert outside == set()


def test_a_model_name_resolves_without_torch(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text("{}")
    result = _run("from mascot.policies.model_source import resolve_model, LocalModelError\n"
                  f"print(resolve_model({str(tmp_path)!r}))\n"
                  "try:\n    resolve_model('/no/such/model')\nexcept LocalModelError as exc:\n    print(exc)\n"
                  "assert 'torch' not in sys.modules")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [str(tmp_path), "no model directory at /no/such/model"]


def test_importing_rosters_loads_neither_training_nor_langgraph() -> None:
    result = _run("import mascot.rosters\n"
                  "heavy = sorted(m for m in sys.modules if m.split('.')[0] in {'langgraph', 'langchain_openai',"
                  " 'langchain_core', 'openai'} or m.startswith(('mascot.training', 'mascot.graphs',"
                  " 'mascot.policies')))\n"
                  "print(heavy)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_every_public_name_resolves_from_the_root() -> None:
    result = _run("import mascot\n"
                  "missing = [n for n in mascot.__all__ if getattr(mascot, n, None) is None]\n"
                  "print(len(mascot.__all__), missing)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "26 []"


def test_root_type_checking_imports_match_the_lazy_table() -> None:
    tree = ast.parse((ROOT / "mascot" / "__init__.py").read_text())
    checked = {alias.name for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)
               and node.module and node.module.startswith("mascot.") for alias in node.names}
    import mascot

    assert checked == set(mascot.__all__)


@pytest.mark.parametrize("argv", [["--help"], ["rosters", "check", "emotional_support"], ["rosters"]])
def test_light_commands_load_no_langchain_langgraph_or_torch(argv: list[str]) -> None:
    result = _run("from mascot.cli import main\n"
                  f"try:\n    code = main({argv!r})\nexcept SystemExit as exc:\n    code = exc.code\n"
                  "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'langchain_core', 'langchain_openai',"
                  " 'langgraph', 'openai', 'torch', 'transformers'})\n"
                  "print(code, heavy, file=sys.stderr)")
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip().splitlines()[-1] == "0 []"


def test_the_cli_baseline_names_are_the_graphs() -> None:
    from mascot.cli.options import BASELINES
    from mascot.graphs import BASELINES as GRAPH_BASELINES

    assert BASELINES == GRAPH_BASELINES


def test_message_conversions_live_in_one_module() -> None:
    tree = ast.parse((ROOT / "mascot" / "messages.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not any(m.startswith("mascot") for m in imported)  # graphs, policies and training all use it
    defined = {"openai_messages", "chat_messages", "langchain_message", "to_chat", "_openai"}
    for path in (ROOT / "mascot").rglob("*.py"):
        if path.name == "messages.py":
            continue
        functions = {n.name for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)}
        assert not functions & defined, f"{path.relative_to(ROOT)} converts messages itself"
