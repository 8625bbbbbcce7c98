"""A training recipe's own settings as command-line flags with help, read from the recipe
classes' source so that ``--help`` stays light (the classes import the trainers' stack).

Each setting is a field of the recipe dataclass (or of a base class in mascot, such as
``LoraRecipe``'s LoRA fields), documented once in that class's ``Attributes:`` docstring, as
TRL documents its configs' fields. ``add_recipe_settings`` lists them in a command's help;
a value given on the command line is passed on with TRL's flags to the recipe's parser,
exactly as before, so a bad value is refused there with the same message.
"""

from __future__ import annotations

import argparse
import ast
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

_PACKAGE = Path(__file__).resolve().parents[1]

@dataclass(frozen=True)
class Setting:
    """One field of a recipe: its name, annotation (as written), default (as written, or
    ``None`` when required) and the docstring's description (``""`` when undocumented)."""

    name: str
    annotation: str
    default: str | None
    doc: str


def recipe_settings(module: str, name: str) -> list[Setting]:
    """The settings of recipe class ``name`` in ``module`` and of its bases in the same
    package, base fields first, read from the source without importing it. The ``training``
    field (the TRL config itself) is left out: its fields are TRL's own flags.

    Raises:
        LookupError: if the module or the class cannot be found.
    """
    tree, imports = _module(module)
    node = next((n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == name), None)
    if node is None:
        raise LookupError(f"no class {name} in {module}")
    inherited: list[Setting] = []
    for base in node.bases:
        if isinstance(base, ast.Name) and base.id in imports:
            inherited += recipe_settings(imports[base.id], base.id)
        elif isinstance(base, ast.Name) and any(isinstance(n, ast.ClassDef) and n.name == base.id for n in tree.body):
            inherited += recipe_settings(module, base.id)
    docs = {**{s.name: s.doc for s in inherited}, **_attributes(ast.get_docstring(node) or "")}
    own = [Setting(target.id, ast.unparse(stmt.annotation), None if stmt.value is None else _default(stmt.value),
                   docs.get(target.id, ""))
           for stmt in node.body if isinstance(stmt, ast.AnnAssign) and isinstance(target := stmt.target, ast.Name)
           and not ast.unparse(stmt.annotation).startswith("ClassVar")]
    names = {s.name for s in own}
    merged = [Setting(s.name, s.annotation, s.default, docs.get(s.name, s.doc)) for s in inherited
              if s.name not in names] + own
    return [s for s in merged if s.name != "training"]


class _RecipeFlag(argparse.Action):
    """Keeps a recipe setting's flag and value(s) for the recipe's parser (``trainer_flags``)."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,
                 values: Any, option_string: str | None = None) -> None:
        given = values if isinstance(values, list) else [] if values is None else [values]
        namespace.trainer_flags = [*getattr(namespace, "trainer_flags", []), str(option_string), *map(str, given)]


def add_recipe_settings(parser: argparse.ArgumentParser, recipes: Sequence[tuple[str, str]], title: str) -> None:
    """List the settings of ``recipes`` ((module, class) pairs) as flags in a group of
    ``parser`` named ``title``; a setting two recipes share is listed once, and one whose flag
    the command has already (``--personas``) keeps the command's."""
    group = parser.add_argument_group(title)
    seen = {option.lstrip("-") for option in parser._option_string_actions}
    for module, name in recipes:
        for setting in recipe_settings(module, name):
            if setting.name in seen:
                continue
            seen.add(setting.name)
            shown = "" if setting.default in (None, "None") else f" (default {setting.default})"
            group.add_argument(f"--{setting.name}", action=_RecipeFlag, default=argparse.SUPPRESS,
                               nargs="+" if "list" in setting.annotation else "?" if setting.annotation == "bool"
                               else None,
                               metavar=_metavar(setting.annotation),
                               help=f"{setting.doc or setting.name.replace('_', ' ')}{shown}".replace("%", "%%"))


@cache
def _module(module: str) -> tuple[ast.Module, dict[str, str]]:
    """The parsed source of ``module`` and where each ``from X import Name`` of mascot comes from."""
    path = _PACKAGE.joinpath(*module.split(".")[1:]).with_suffix(".py")  # found, not imported
    if not module.startswith("mascot.") or not path.is_file():
        raise LookupError(f"no module {module}")
    tree = ast.parse(path.read_text(encoding="utf-8"))
    imports = {alias.asname or alias.name: node.module for node in tree.body if isinstance(node, ast.ImportFrom)
               and node.module and node.module.startswith("mascot.") for alias in node.names}
    return tree, imports


def _default(value: ast.expr) -> str:
    """A field's default as written: ``field(default=X)`` is X, a factory is what it makes."""
    if isinstance(value, ast.Call) and ast.unparse(value.func) == "field":
        for keyword in value.keywords:
            if keyword.arg == "default":
                return ast.unparse(keyword.value)
            if keyword.arg == "default_factory":
                factory = keyword.value
                if isinstance(factory, ast.Lambda):
                    return ast.unparse(factory.body)
                return {"list": "[]", "dict": "{}"}.get(ast.unparse(factory), f"{ast.unparse(factory)}()")
    return ast.unparse(value)


def _attributes(docstring: str) -> dict[str, str]:
    """The ``Attributes:`` section of a Google-style docstring: name -> its text on one line."""
    found: dict[str, str] = {}
    lines = docstring.splitlines()
    if "Attributes:" not in (line.strip() for line in lines):
        return found
    start = [line.strip() for line in lines].index("Attributes:") + 1
    indent, current = None, None
    for line in lines[start:]:
        if not line.strip():
            continue
        width = len(line) - len(line.lstrip())
        indent = width if indent is None else indent
        if width < indent:
            break
        entry = re.match(r"(\w+): (.*)", line.strip()) if width == indent else None
        if entry:
            current = entry.group(1)
            found[current] = entry.group(2)
        elif current is not None:
            found[current] += " " + line.strip()
    return found


def _metavar(annotation: str) -> str:
    """What a setting's value is, for its flag's help: ``N``, ``X``, ``NAME`` or ``TEXT``."""
    kinds = (("list", "NAME"), ("bool", "true|false"), ("int", "N"), ("float", "X"))
    return next((shown for kind, shown in kinds if annotation.startswith(kind)), "TEXT")
