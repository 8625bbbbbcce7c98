"""Reading user-written YAML files (rosters, policies, rubrics, recipes) within bounds.

A YAML file can be small on disk and enormous in memory: aliases let one node be reused
many times ("billion laughs"), which costs nothing to parse but explodes as soon as the
data is validated or copied. ``read_yaml`` refuses files over ``MAX_BYTES``, bytes that
are not UTF-8, nesting too deep to parse, documents whose aliases expand to more than
``MAX_NODES`` nodes, and mappings that name a key twice, each with one line naming the file.
``read_mapping`` also wants a mapping at the top level, ``read_model`` a valid pydantic model;
``first_error`` (and ``first_error_line``) give the first
problem pydantic found in what was read, for the one-line errors every reader raises.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

import yaml
from pydantic import BaseModel, ValidationError

#: Largest YAML file read, in bytes; configuration files are kilobytes.
MAX_BYTES = 2 * 1024 * 1024
#: Most nodes a document may hold once every alias is expanded.
MAX_NODES = 200_000

_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YamlFileError(ValueError):
    """A YAML file cannot be read; the message is one line naming the file."""


def read_mapping(path: str | Path) -> dict[str, Any]:
    """``read_yaml``, for a file whose top level must be a mapping.

    Raises:
        YamlFileError: as ``read_yaml`` does, or if the document is not a mapping.
    """
    data = read_yaml(path)
    if not isinstance(data, dict):
        raise YamlFileError(f"{path}: expected a mapping at the top level, got {type(data).__name__}")
    return data


_Model = TypeVar("_Model", bound=BaseModel)


def read_model(path: str | Path, model: type[_Model]) -> _Model:
    """``read_yaml``, validated as ``model``.

    Raises:
        YamlFileError: as ``read_yaml`` does, or with the first validation problem
            (``FILE: field 'a.b': what is wrong``).
    """
    data = read_yaml(path)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise YamlFileError(f"{path}: {first_error_line(exc)}") from None


def first_error(exc: ValidationError) -> tuple[str, str]:
    """The first problem of a validation error: the dotted field it is in (``(top level)``
    when none) and what is wrong.

    Example:
        >>> from pydantic import BaseModel
        >>> class Stage(BaseModel):
        ...     episodes: int
        >>> try:
        ...     Stage.model_validate({"episodes": "many"})
        ... except ValidationError as exc:
        ...     print(first_error(exc))
        ('episodes', 'Input should be a valid integer, unable to parse string as an integer')
    """
    error = exc.errors(include_url=False)[0]
    return ".".join(str(part) for part in error["loc"]) or "(top level)", error["msg"]


def first_error_line(exc: ValidationError) -> str:
    """``first_error`` as the line file readers print: ``field 'a.b': what is wrong``."""
    field, problem = first_error(exc)
    return f"field '{field}': {problem}"


def read_yaml(path: str | Path) -> object:
    """Parse one YAML document safely and within bounds.

    Args:
        path: The file.

    Returns:
        The document's data (``None`` for an empty file).

    Raises:
        YamlFileError: if the file is missing, unreadable, too large, not UTF-8,
            malformed, too deeply nested, expands past ``MAX_NODES`` through aliases, or
            repeats a key.
    """
    path = Path(path)
    try:
        with path.open("rb") as handle:  # read no more than the limit: pipes and devices have no size
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise YamlFileError(f"{path}: cannot read file ({exc.strerror or exc})") from None
    if len(raw) > MAX_BYTES:
        raise YamlFileError(f"{path}: file too large (over {MAX_BYTES // 2**20} MiB, the limit)")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise YamlFileError(f"{path}: not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(path, node)
        return loader.construct_document(node)
    except YamlFileError:
        raise
    except yaml.MarkedYAMLError as exc:
        mark = f":{exc.problem_mark.line + 1}" if exc.problem_mark is not None else ""
        problem = exc.problem or exc.context or "syntax error"
        raise YamlFileError(f"{path}{mark}: malformed YAML ({problem})") from None
    except yaml.YAMLError as exc:
        raise YamlFileError(f"{path}: malformed YAML ({str(exc).splitlines()[0]})") from None
    except RecursionError:
        raise YamlFileError(f"{path}: YAML nested too deeply") from None
    except (ValueError, OverflowError, TypeError) as exc:  # a typed value that does not convert
        problem = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise YamlFileError(f"{path}: bad YAML value ({problem})") from None
    finally:
        loader.dispose()


def _check_expansion(path: Path, root: yaml.Node) -> None:
    """Refuse a node graph that is cyclic or holds more than ``MAX_NODES`` expanded nodes.

    Each distinct node's expanded size is computed once (iteratively, so depth is no
    problem), which makes the check linear in the file's size even for alias bombs.
    """
    sizes: dict[int, int] = {}
    on_path: set[int] = set()
    stack: list[tuple[yaml.Node, bool]] = [(root, False)]
    while stack:
        node, children_done = stack.pop()
        key = id(node)
        kids = _children(node)
        if children_done:
            on_path.discard(key)
            sizes[key] = 1 + sum(sizes[id(kid)] for kid in kids)
            if sizes[key] > MAX_NODES:
                raise YamlFileError(f"{path}: YAML holds more than {MAX_NODES:,} nodes once its aliases are expanded")
            continue
        if key in sizes:
            continue
        if key in on_path:
            raise YamlFileError(f"{path}: YAML alias refers to itself (a recursive structure)")
        on_path.add(key)
        stack.append((node, True))
        if isinstance(node, yaml.MappingNode):
            _check_keys(path, node)
        for kid in kids:
            if id(kid) in on_path:
                raise YamlFileError(f"{path}: YAML alias refers to itself (a recursive structure)")
            if id(kid) not in sizes:
                stack.append((kid, False))


def _check_keys(path: Path, node: yaml.MappingNode) -> None:
    """Refuse a mapping that names one key twice (YAML would silently keep the last)."""
    seen: set[tuple[str, str]] = set()
    for key, _ in node.value:
        if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
            if (key.tag, key.value) in seen:  # 1 and '1' are different keys
                raise YamlFileError(f"{path}:{key.start_mark.line + 1}: duplicate key '{key.value}'")
            seen.add((key.tag, key.value))


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    return []
