"""The dependency rules of the layout: mascot.graphs, mascot.rosters and mascot.policies
(except policies/local/) import without torch; graphs and policies never import each other;
policies never imports training; nothing imports mascot.cli but the entry point.

And the layout as a ladder: training's subpackages import only downward (episodes <- judging
<- data <- fitting, training's own root modules below them all), nothing in training reads
evaluation but evaluation, the package root holds only the entry points and the shared leaves,
one module (cli/child.py) builds a `mascot` child process's command line, and reward functions
are defined in training/rewards.py and the Director's in training/fitting/director_rewards.py."""

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


# --- the layout as a ladder -------------------------------------------------------------

MASCOT = ROOT / "mascot"
TRAINING = MASCOT / "training"
#: training's floors, lowest first: a floor may import the floors below it, never one above.
#: The training root's own modules (jsonl, retry, measures, rewards, ...) are floor 0, below all.
FLOORS = ("episodes", "judging", "data", "fitting")
#: Beside the ladder: may read every floor, and no floor (nor the root floor) may read it.
EVALUATION = "evaluation"
#: The modules allowed at the package root besides __init__ and __main__, and why each stays there.
ROOT_MODULES = {
    "messages.py": "LangChain <-> OpenAI message conversions, used by graphs and policies, which never import "
                   "each other",
    "redaction.py": "secret redaction, used by the CLI at start-up (light commands load no LangChain) and by "
                    "training's JSONL writer; importing mascot.training would load LangChain",
    "studio.py": "the `langgraph dev` entry of langgraph.json: wires graphs, policies and rosters together",
}
#: The one module that builds a command line running the `mascot` CLI in a child process.
CHILD_BOUNDARY = MASCOT / "cli" / "child.py"
#: The modules that define GRPO reward functions: training/rewards.py, and the Director's (over played blocks).
REWARDS = (TRAINING / "rewards.py", TRAINING / "fitting" / "director_rewards.py")


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _runtime_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every import the module runs, at the top or inside a function; imports
    under ``if TYPE_CHECKING:`` only name types for annotations and are left out."""
    found: list[tuple[int, str]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom) and node.module:
            found.append((node.lineno, node.module))
        elif isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name) for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text(encoding="utf-8")))
    return found


def _training_part(module: str) -> str | None:
    """Which part of training ``module`` is: a floor, evaluation, "" for the root floor; None
    outside training (and for the package itself, ``mascot.training``: its __init__)."""
    parts = module.split(".")
    if parts[:2] != ["mascot", "training"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in (*FLOORS, EVALUATION) else ""


def _part_of(path: Path) -> str:
    relative = path.relative_to(TRAINING)
    return relative.parts[0] if len(relative.parts) > 1 else ""


def _training_files() -> list[Path]:
    # the package's __init__ is its public face: it re-exports names from every floor
    return [p for p in sorted(TRAINING.rglob("*.py")) if p != TRAINING / "__init__.py"]


def _ladder_violations() -> list[str]:
    rank = {"": 0, **{floor: i + 1 for i, floor in enumerate(FLOORS)}}
    bad = []
    for path in _training_files():
        own = _part_of(path)
        if own == EVALUATION:
            continue
        for line, module in _runtime_imports(path):
            target = _training_part(module)
            if target is None or target == EVALUATION:
                continue  # evaluation: test_nothing_in_training_imports_evaluation
            if rank[target] > rank[own]:
                bad.append(f"{path.relative_to(ROOT)}:{line} ({own or 'root floor'}) imports {module} ({target})")
    return bad


def test_training_floors_import_only_downward() -> None:
    """episodes <- judging <- data <- fitting, with training's root modules below them all."""
    assert sorted(p.name for p in TRAINING.iterdir() if p.is_dir() and (p / "__init__.py").is_file()) == sorted(
        (*FLOORS, EVALUATION)), "a new subpackage of training needs its place in FLOORS"
    assert _ladder_violations() == []


def _evaluation_users() -> list[str]:
    return [f"{path.relative_to(ROOT)}:{line} imports {module}"
            for path in _training_files() if _part_of(path) != EVALUATION
            for line, module in _runtime_imports(path) if _training_part(module) == EVALUATION]


def test_nothing_in_training_imports_evaluation() -> None:
    assert _evaluation_users() == []


def _root_modules() -> set[str]:
    return {p.name for p in MASCOT.glob("*.py")} - {"__init__.py", "__main__.py"}


def test_the_root_holds_only_the_entry_points_and_the_shared_leaves() -> None:
    assert _root_modules() == set(ROOT_MODULES)


def _spawns_mascot(node: ast.AST) -> bool:
    """A ``[..., "-m", "mascot", ...]`` command line, the ``mascot`` script beside the
    interpreter (``Path(sys.executable).parent / "mascot"``), ``which("mascot")``, or a
    process started on ``["mascot", ...]``."""
    def text(n: ast.AST) -> str | None:
        return n.value if isinstance(n, ast.Constant) and isinstance(n.value, str) else None

    if isinstance(node, ast.List | ast.Tuple):
        items = [text(e) for e in node.elts]
        return any(a == "-m" and b == "mascot" for a, b in zip(items, items[1:], strict=False))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        return text(node.right) == "mascot" and "sys.executable" in ast.unparse(node.left)
    if isinstance(node, ast.Call):
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
        if name == "which":
            return [text(a) for a in node.args] == ["mascot"]
        first = node.args[0] if node.args else None
        return (name in {"run", "Popen", "call", "check_call", "check_output", "create_subprocess_exec"}
                and isinstance(first, ast.List | ast.Tuple) and bool(first.elts) and text(first.elts[0]) == "mascot")
    return False


def _mascot_spawners() -> list[str]:
    return [f"{path.relative_to(ROOT)}:{node.lineno}"
            for path in sorted(MASCOT.rglob("*.py")) if path != CHILD_BOUNDARY
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _spawns_mascot(node)]


def test_only_the_child_module_re_enters_the_cli() -> None:
    assert any(_spawns_mascot(node) for node in ast.walk(ast.parse(CHILD_BOUNDARY.read_text(encoding="utf-8"))))
    assert _mascot_spawners() == []


def _is_reward_function(node: ast.AST) -> bool:
    """Named ``*_reward``, or TRL's reward signature: ``(prompts, completions, ...)`` (after ``self``)."""
    if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        return False
    names = [a.arg for a in (*node.args.posonlyargs, *node.args.args)]
    names = names[1:] if names[:1] in (["self"], ["cls"]) else names
    return node.name.endswith("_reward") or names[:2] == ["prompts", "completions"]


def _reward_functions_elsewhere() -> list[str]:
    return [f"{path.relative_to(ROOT)}:{node.lineno} {getattr(node, 'name', '')}"
            for path in sorted(MASCOT.rglob("*.py")) if path not in REWARDS
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))) if _is_reward_function(node)]


def test_reward_functions_live_in_the_rewards_module() -> None:
    for rewards in REWARDS:
        assert sum(_is_reward_function(n) for n in ast.walk(ast.parse(rewards.read_text(encoding="utf-8")))) > 5
    assert _reward_functions_elsewhere() == []
