"""The dependency rules of the layout: mascot.graphs, mascot.rosters and mascot.policies
(except policies/local/) import without torch; graphs and policies never import each other;
policies never imports training; rosters imports no other part; nothing imports mascot.cli but
the entry point; and no import cycles. The import rules hold through every chain of imports
(graphs -> offline -> policies breaks the first), read from the code of every module of mascot/.

And the layout as a ladder: training's subpackages import only downward (episodes <- judging
<- data <- fitting, training's own root modules below them all), nothing in training reads
evaluation but evaluation, the package root holds only the entry points and the shared leaves,
one module (cli/child.py) builds a `mascot` child process's command line, and reward functions
are defined in training/rewards.py and the Director's in training/fitting/director_rewards.py."""

from __future__ import annotations

import ast
import functools
import subprocess
import sys
from collections import deque
from collections.abc import Callable, Collection, Iterable
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
    """graphs and policies never reach each other, policies never reach training, rosters reach
    nothing else of mascot, by any chain of imports (and name none of it even for types)."""
    bad = _layout_violations("graphs and policies never import each other", "policies never import training",
                             "rosters import no other part of mascot", types=True)
    assert not bad, "\n".join(bad)


def test_the_folders_are_the_packages() -> None:
    import mascot.graphs
    import mascot.policies
    import mascot.rosters
    import mascot.training

    for package in (mascot.graphs, mascot.policies, mascot.rosters, mascot.training):
        assert Path(package.__file__).parent == ROOT / "mascot" / package.__name__.split(".")[1]
    assert "package-dir" not in (ROOT / "pyproject.toml").read_text()


def test_only_the_entry_point_imports_the_cli() -> None:
    bad = _layout_violations("nothing imports mascot.cli but the entry point", types=True)
    assert not bad, "\n".join(bad)


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


# --- the import graph: the rules followed through every chain of imports -----------------
#
# A module's edges are the imports its code names, at the top or inside a function (a lazy import
# runs too), resolved to modules of mascot/: ``import a.b`` and ``from a.b import X`` are an edge to
# a.b; ``from a import b`` is an edge to a.b when a.b is a module, else to a (its __init__). Python
# runs the parent packages' __init__ first, so each import is also an edge to every parent package
# of its target, except the importer's own parents: Python puts a package in sys.modules before it
# runs its __init__, and a module runs only once its parents have begun, so its own parents are
# never waited on.
#
# That makes the rule for a package's __init__: its imports of its own submodules (the re-exports)
# are edges like any other, and no edge leads back from a submodule that imports a sibling (its
# parent is its own), so re-exporting is no cycle. A submodule that imports from its package's
# __init__ itself (``from mascot.graphs import X`` in graphs/speaker.py) names the package: that
# edge does lead back and closes a cycle, as it does at runtime (whether X is bound yet depends on
# which module was imported first). Imports under ``if TYPE_CHECKING:`` run nowhere: they form no
# edges, and the rules that forbid naming a part at all check them one step deep.

#: Module -> [(line, imported module)], the imports of every module of mascot/ (a package by its name).
Graph = dict[str, list[tuple[int, str]]]
#: The parts of mascot: its subpackages; the package root's own modules are the part "".
PARTS = frozenset(p.name for p in MASCOT.iterdir() if (p / "__init__.py").is_file())


def _part(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in PARTS else ""


def _graphs_and_policies(importer: str, module: str) -> bool:
    return {_part(importer), _part(module)} == {"graphs", "policies"}


def _policies_into_training(importer: str, module: str) -> bool:
    return _part(importer) == "policies" and _part(module) == "training"


def _rosters_outward(importer: str, module: str) -> bool:
    return _part(importer) == "rosters" and _part(module) != "rosters"


def _into_the_cli(importer: str, module: str) -> bool:
    return _part(module) == "cli" and _part(importer) != "cli" and importer != "mascot.__main__"


def _upward(importer: str, module: str) -> bool:
    rank = {"": 0, **{floor: i + 1 for i, floor in enumerate(FLOORS)}}
    own, target = _training_part(importer), _training_part(module)
    return own in rank and target in rank and rank[target] > rank[own]


def _into_evaluation(importer: str, module: str) -> bool:
    return _training_part(importer) not in (None, EVALUATION) and _training_part(module) == EVALUATION


#: The layout's rules on imports: rule -> whether a module that reaches another breaks it.
RULES: dict[str, Callable[[str, str], bool]] = {
    "graphs and policies never import each other": _graphs_and_policies,
    "policies never import training": _policies_into_training,
    "rosters import no other part of mascot": _rosters_outward,
    "nothing imports mascot.cli but the entry point": _into_the_cli,
    "training's floors import only downward": _upward,
    "nothing in training reads evaluation but evaluation": _into_evaluation,
}


def _import_statements(tree: ast.Module) -> list[tuple[ast.Import | ast.ImportFrom, bool]]:
    """Every import statement of a module, at the top or inside a function, each with whether it
    runs: False under ``if TYPE_CHECKING:``, where it only names types for annotations."""
    found: list[tuple[ast.Import | ast.ImportFrom, bool]] = []

    def visit(node: ast.AST, runs: bool) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.body:
                visit(child, False)
            for child in node.orelse:
                visit(child, runs)
            return
        if isinstance(node, ast.Import | ast.ImportFrom):
            found.append((node, runs))
        for child in ast.iter_child_nodes(node):
            visit(child, runs)

    visit(tree, True)
    return found


def _edges(importer: str, tree: ast.Module, modules: Collection[str], *, runs: bool = True) -> list[tuple[int, str]]:
    """(line, module) of every module of ``modules`` that the imports of ``importer`` (its parsed
    source ``tree``) load, as the comment above says; ``runs=False``: the type-checking imports."""

    def known(name: str) -> str | None:  # the module itself, or its nearest package that exists
        parts = name.split(".")
        return next((".".join(parts[:n]) for n in range(len(parts), 0, -1) if ".".join(parts[:n]) in modules), None)

    found: list[tuple[int, str]] = []
    for node, running in _import_statements(tree):
        if running != runs:
            continue
        assert not (isinstance(node, ast.ImportFrom) and node.level), f"{importer}:{node.lineno}: a relative import"
        if isinstance(node, ast.Import):
            targets = [known(alias.name) for alias in node.names]
        else:
            assert node.module is not None
            targets = [f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in modules else known(node.module)
                       for a in node.names]
        for target in dict.fromkeys(t for t in targets if t is not None):
            parents = target.split(".")
            found.extend((node.lineno, ".".join(parents[:n])) for n in range(1, len(parents))
                         if not (importer + ".").startswith(".".join(parents[:n]) + "."))
            found.append((node.lineno, target))
    return list(dict.fromkeys(found))


@functools.cache
def _modules() -> dict[str, Path]:
    """Every module of mascot/ by its dotted name (a package's __init__ by the package's)."""
    modules = {}
    for path in sorted(MASCOT.rglob("*.py")):
        parts = path.relative_to(ROOT).with_suffix("").parts
        modules[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return modules


@functools.cache
def _import_graph(*, runs: bool = True) -> Graph:
    """The import graph of mascot/ (``runs=False``: the imports under ``if TYPE_CHECKING:``)."""
    modules = _modules()
    return {name: _edges(name, ast.parse(path.read_text(encoding="utf-8")), modules, runs=runs)
            for name, path in modules.items()}


def _reach(graph: Graph, start: str) -> dict[str, tuple[str, int] | None]:
    """Every module ``start`` loads through any chain of imports (the transitive closure), each
    with the (importer, line) that reaches it on a shortest chain; ``start`` itself maps to None."""
    found: dict[str, tuple[str, int] | None] = {start: None}
    queue = deque([start])
    while queue:
        importer = queue.popleft()
        for line, module in graph.get(importer, ()):
            if module not in found:
                found[module] = (importer, line)
                queue.append(module)
    return found


def _where(module: str) -> str:
    path = _modules().get(module)
    return str(path.relative_to(ROOT)) if path else module


def _chain(reach: dict[str, tuple[str, int] | None], module: str) -> str:
    """The chain from the start of ``reach`` to ``module``: ``file:line -> file:line -> file``."""
    steps = [_where(module)]
    while (step := reach[module]) is not None:
        module, line = step
        steps.append(f"{_where(module)}:{line}")
    return " -> ".join(reversed(steps))


def _violations(graph: Graph, rules: Iterable[str], named: Graph | None = None) -> list[str]:
    """Each import that breaks one of ``rules`` (names of :data:`RULES`), as ``rule: chain``.

    Every module is followed through all its chains of imports. A rule is broken where a chain
    first steps into a module the start may not reach; that step is reported once, with the
    shortest chain from any start that takes it. ``named``: the imports that only name types,
    checked one step deep (a type may not be named across those rules either).
    """
    found: dict[tuple[str, str, int], tuple[int, int, str]] = {}
    for start in sorted(graph):
        reach = _reach(graph, start)
        for rule in rules:
            broken = RULES[rule]
            for module, step in reach.items():
                if step is not None and broken(start, module) and not broken(start, step[0]):
                    chain = _chain(reach, module)
                    shortest = (chain.count(" -> "), -len(module), chain)  # the statement's own module first
                    if (rule, *step) not in found or shortest < found[(rule, *step)]:
                        found[(rule, *step)] = shortest
            for line, module in (named or {}).get(start, ()):
                if broken(start, module):
                    found.setdefault((rule, start, line), (0, 0, f"{_where(start)}:{line} -> {_where(module)} (types)"))
    return [f"{rule}: {chain}" for (rule, _, _), (_, _, chain) in sorted(found.items())]


def _layout_violations(*rules: str, types: bool = False) -> list[str]:
    """The imports of mascot/ that break ``rules``; ``types``: type-checking imports count too."""
    return _violations(_import_graph(), rules, _import_graph(runs=False) if types else None)


def _cycles(graph: Graph) -> list[str]:
    """One shortest import cycle per tangle of modules that import each other (a strongly
    connected component), from its first module by name: ``file:line -> ... -> file``."""
    reaches = {module: _reach(graph, module) for module in sorted(graph)}
    tangled: set[str] = set()
    found = []
    for start, reach in reaches.items():
        if start in tangled:
            continue
        back = next(((module, line) for module in reach for line, target in graph.get(module, ())
                     if target == start), None)
        if back is None:
            continue
        tangled.update(module for module in reach if start in reaches.get(module, {}))
        found.append(f"{_chain(reach, back[0])}:{back[1]} -> {_where(start)}")
    return found


def test_no_import_cycles() -> None:
    cycles = _cycles(_import_graph())
    assert not cycles, "\n".join(cycles)


def test_the_checks_catch_planted_chains_and_cycles() -> None:
    """The checks on a small graph made up here: they can fail, and report where."""
    planted: Graph = {  # made-up modules (none of them exists), so chains show their names
        "mascot.graphs.planted_view": [(3, "mascot.offline.planted_helper")],
        "mascot.graphs.planted_other": [(5, "mascot.graphs.planted_view")],
        "mascot.offline.planted_helper": [(7, "mascot.policies.local.planted_backend"),
                                          (8, "mascot.rosters.planted_models")],
        "mascot.policies.local.planted_backend": [(1, "mascot.policies.planted_spec")],
        "mascot.rosters.planted_models": [(2, "mascot.planted_leaf")],
    }
    direction = ("graphs and policies never import each other", "rosters import no other part of mascot")
    assert _violations(planted, direction) == [
        "graphs and policies never import each other: mascot.graphs.planted_view:3 -> "
        "mascot.offline.planted_helper:7 -> mascot.policies.local.planted_backend",
        "rosters import no other part of mascot: mascot.rosters.planted_models:2 -> mascot.planted_leaf",
    ]
    types = {"mascot.graphs.planted_other": [(9, "mascot.policies.planted_spec")]}
    assert _violations(planted, direction, types)[0] == (
        "graphs and policies never import each other: mascot.graphs.planted_other:9 -> mascot.policies.planted_spec "
        "(types)")
    # through the package's public face (a real module: shown as its file)
    ladder: Graph = {"mascot.training.episodes.planted": [(4, "mascot.training")],
                     "mascot.training": [(1, "mascot.training.fitting.planted")]}
    assert _violations(ladder, ["training's floors import only downward"]) == [
        "training's floors import only downward: mascot.training.episodes.planted:4 -> "
        "mascot/training/__init__.py:1 -> mascot.training.fitting.planted"]

    package: Graph = {"mascot.pkg": [(1, "mascot.pkg.a"), (2, "mascot.pkg.b")], "mascot.pkg.a": [(5, "mascot.pkg.b")]}
    assert _cycles(package) == []  # an __init__ re-exporting submodules that import each other
    package["mascot.pkg.b"] = [(9, "mascot.pkg")]  # a submodule importing from its package's __init__
    assert _cycles(package) == ["mascot.pkg:2 -> mascot.pkg.b:9 -> mascot.pkg"]


def test_imports_resolve_to_modules_and_their_parent_packages() -> None:
    modules = {"mascot", "mascot.pkg", "mascot.pkg.a", "mascot.pkg.b", "mascot.other", "mascot.other.c"}
    source = ("import json\nfrom mascot.pkg import b, NAME\nimport mascot.other.c\n"
              "def f():\n    from mascot.pkg.b import X\n"
              "if TYPE_CHECKING:\n    from mascot.other import Y\n")
    tree = ast.parse(source)
    # in mascot.pkg.a: a sibling (no edge to its own package), a name from the package's __init__,
    # another package's module (and that package's __init__), a lazy import; not json, not the types
    assert _edges("mascot.pkg.a", tree, modules) == [
        (2, "mascot.pkg.b"), (2, "mascot.pkg"), (3, "mascot.other"), (3, "mascot.other.c"), (5, "mascot.pkg.b")]
    assert _edges("mascot.pkg.a", tree, modules, runs=False) == [(7, "mascot.other")]
    # from outside the package, its __init__ runs first: an edge too
    assert _edges("mascot.other.c", tree, modules)[:2] == [(2, "mascot.pkg"), (2, "mascot.pkg.b")]


def _training_part(module: str) -> str | None:
    """Which part of training ``module`` is: a floor, evaluation, "" for the root floor; None
    outside training (and for the package itself, ``mascot.training``: its __init__)."""
    parts = module.split(".")
    if parts[:2] != ["mascot", "training"] or len(parts) < 3:
        return None
    return parts[2] if parts[2] in (*FLOORS, EVALUATION) else ""


def _ladder_violations() -> list[str]:
    # the package's __init__ is its public face, no floor: it re-exports names from every floor
    return _layout_violations("training's floors import only downward")


def test_training_floors_import_only_downward() -> None:
    """episodes <- judging <- data <- fitting, with training's root modules below them all."""
    assert sorted(p.name for p in TRAINING.iterdir() if p.is_dir() and (p / "__init__.py").is_file()) == sorted(
        (*FLOORS, EVALUATION)), "a new subpackage of training needs its place in FLOORS"
    bad = _ladder_violations()
    assert not bad, "\n".join(bad)


def _evaluation_users() -> list[str]:
    return _layout_violations("nothing in training reads evaluation but evaluation")


def test_nothing_in_training_imports_evaluation() -> None:
    bad = _evaluation_users()
    assert not bad, "\n".join(bad)


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
