"""Loading and validating rosters and scenario files, shipped or user-written."""

from __future__ import annotations

import json
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import TypeVar, get_args

from pydantic import BaseModel, ValidationError

from mascot.rosters.models import Roster, Scenario, UserProfile
from mascot.rosters.yaml_file import YamlFileError, read_yaml

_DATA = "data"
_ROSTER_FILE = "roster.yaml"
_SCENARIO_FILE = "scenarios.jsonl"


class RosterError(ValueError):
    """A roster or scenario file is missing or does not validate.

    ``str(error)`` names the file and the problem in one line; when the file has several
    problems, it is a summary line (``FILE: N problems:``) followed by one indented line
    per problem.

    Attributes:
        summary: The first line: the whole message, or the summary of several problems.
        problems: Each problem of a file with several, one line each; empty otherwise.
    """

    def __init__(self, summary: str, problems: Sequence[str] = ()) -> None:
        super().__init__(summary, tuple(problems))  # both in args: the error pickles whole
        self.summary = summary
        self.problems = tuple(problems)

    def __str__(self) -> str:
        return "\n".join([self.summary, *(f"  {problem}" for problem in self.problems)])


def list_rosters() -> list[str]:
    """Return the ids of the rosters that ship with mascot, sorted."""
    root = resources.files(__package__).joinpath(_DATA)
    return sorted(p.name for p in root.iterdir() if p.joinpath(_ROSTER_FILE).is_file())


def roster_path(name_or_path: str | Path) -> Path:
    """Resolve a shipped roster id or a path to the roster YAML file.

    Args:
        name_or_path: A shipped roster id (``emotional_support``), a YAML file, or a
            directory holding ``roster.yaml``.

    Returns:
        The path of the roster YAML file.

    Raises:
        RosterError: if nothing of that name exists; the message lists shipped ids.
    """
    text = str(name_or_path)
    if text in list_rosters():
        return Path(str(resources.files(__package__).joinpath(_DATA, text, _ROSTER_FILE)))
    path = Path(text).expanduser()
    if path.is_dir():
        path = path / _ROSTER_FILE
    if path.is_file():
        return path
    raise RosterError(
        f"unknown roster '{text}': not a shipped roster ({', '.join(list_rosters())}) "
        "and no such file"
    )


def scenario_path(name_or_path: str | Path) -> Path:
    """Return the absolute path where a roster's scenarios are read from.

    Args:
        name_or_path: A shipped roster id, a roster directory, its roster YAML file
            (the scenarios lie beside it), or a JSONL file (returned as it is).

    Returns:
        The path of the scenario JSONL file; it need not exist.
    """
    text = str(name_or_path)
    if text in list_rosters():
        return Path(str(resources.files(__package__).joinpath(_DATA, text, _SCENARIO_FILE))).absolute()
    path = Path(text).expanduser().absolute()
    if path.is_dir():
        return path / _SCENARIO_FILE
    if path.suffix in {".yaml", ".yml"}:
        return path.parent / _SCENARIO_FILE
    return path


def load_roster(name_or_path: str | Path) -> Roster:
    """Load and validate a roster.

    Args:
        name_or_path: A shipped roster id, a roster YAML file, or its directory.

    Returns:
        The validated roster.

    Raises:
        RosterError: on a missing file, malformed YAML, unknown or missing fields,
            reserved or duplicate ids or out-of-range values; every problem of the file
            is listed, one line each.
    """
    path = roster_path(name_or_path)
    data = _read_yaml(path)
    return _validate(Roster, data, path)


def load_scenarios(name_or_path: str | Path) -> list[Scenario]:
    """Load the opening scenarios of a roster or from a JSONL file.

    Args:
        name_or_path: A shipped roster id, a roster directory holding
            ``scenarios.jsonl`` (or its roster YAML file), or a JSONL file with one
            scenario object per line.

    Returns:
        The scenarios in file order.

    Raises:
        RosterError: on a missing file, lines that are not JSON, invalid scenarios,
            duplicate scenario ids or an empty file; every problem is listed.
    """
    return _read_models(scenario_path(name_or_path), Scenario, "scenario")


def load_profiles(path: str | Path) -> list[UserProfile]:
    """Load user profiles for the simulator from a file.

    Args:
        path: A JSONL file (one profile per line), or a YAML file holding a list of
            profiles or a mapping with ``user_profiles`` (a roster file works).

    Returns:
        The profiles in file order.

    Raises:
        RosterError: on a missing file, malformed content, invalid profiles,
            duplicate ids or no profiles; every problem is listed.
    """
    path = Path(path).expanduser()
    if path.suffix == ".jsonl":
        return _read_models(path, UserProfile, "user profile")
    if not path.is_file():
        raise RosterError(f"{path}: no such profile file")
    data = _read_yaml(path)
    if isinstance(data, dict) and "user_profiles" in data:
        data = data["user_profiles"]
    if not isinstance(data, list):
        raise RosterError(f"{path}: expected a list of user profiles or a 'user_profiles' key")
    items = [(f"profile {i + 1}", item) for i, item in enumerate(data)]
    return _validate_items(items, path, UserProfile, "user profile")


_M = TypeVar("_M", Scenario, UserProfile)


def _read_models(path: Path, model: type[_M], what: str) -> list[_M]:
    """One validated object per line of a JSONL file, ids unique."""
    if not path.is_file():
        raise RosterError(f"{path}: no such {what} file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RosterError(f"{path}: cannot read file ({exc})") from None
    items: list[tuple[str, object]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            items.append((f"line {number}", json.loads(line)))
        except json.JSONDecodeError as exc:
            items.append((f"line {number}", exc))
    return _validate_items(items, path, model, what)


def _validate_items(items: list[tuple[str, object]], path: Path, model: type[_M], what: str) -> list[_M]:
    """Validate each ``(where, data)`` (``data`` may be the line's JSON error), refuse
    duplicate ids and an empty file, and raise one error listing every problem."""
    problems: list[str] = []
    valid: list[_M] = []
    first_seen: dict[str, str] = {}
    for where, data in items:
        if isinstance(data, json.JSONDecodeError):
            problems.append(f"{where}: not valid JSON at column {data.colno} ({data.msg})")
            continue
        item, found = _check(model, data)
        problems += [f"{where}: {problem}" for problem in found]
        if item is None:
            continue
        if item.id in first_seen:
            problems.append(f"{where}: duplicate {what} id '{item.id}' (first on {first_seen[item.id]})")
        first_seen.setdefault(item.id, where)
        valid.append(item)
    if not items:
        problems.append(f"no {what}s in file")
    if problems:
        raise _error(path, problems)
    return valid


def _read_yaml(path: Path) -> object:
    try:
        return read_yaml(path)
    except YamlFileError as exc:
        raise RosterError(str(exc)) from None


_B = TypeVar("_B", bound=BaseModel)


def _validate(model: type[_B], data: object, path: Path) -> _B:
    item, problems = _check(model, data)
    if item is None:
        if model is Roster and isinstance(data, dict):
            problems = _with_duplicates(data, problems)
        raise _error(path, problems)
    return item


#: The roster's lists whose items must be unique: (field, label, key of an item's raw data).
_UNIQUE = (
    ("personas", "persona id", lambda item: item.get("id")),
    ("personas", "persona name", lambda item: item.get("name").lower() if isinstance(item.get("name"), str) else None),
    ("user_profiles", "user profile id", lambda item: item.get("id")),
)


def _with_duplicates(data: dict, problems: list[str]) -> list[str]:
    """``problems`` and the duplicates in the roster's raw lists: the model's uniqueness
    checks run only on a list whose every item is valid, so a file with an invalid item
    would list its duplicates only once that item is fixed."""
    problems = list(problems)
    for field, label, key in _UNIQUE:
        items = data.get(field)
        if not isinstance(items, list):
            continue
        keys = [key(i) for i in items if isinstance(i, dict)]
        keys = [k.strip() for k in keys if isinstance(k, str) and k.strip()]
        duplicates = sorted({k for k in keys if keys.count(k) > 1})
        problem = f"field '{field}': duplicate {label}: {', '.join(duplicates)}"
        if not duplicates or problem in problems:
            continue
        # after the field's other problems, as the model's own check would place it
        at = max((n + 1 for n, p in enumerate(problems) if p.startswith(f"field '{field}")), default=None)
        if at is None:
            at = len(problems)
        problems.insert(at, problem)
    return problems


def _error(path: Path, problems: list[str]) -> RosterError:
    """One error for the file: its one problem, or a summary and each problem.

    A lone problem of a JSONL line keeps the ``FILE:LINE:`` form editors jump to.
    """
    if len(problems) > 1:
        return RosterError(f"{path}: {len(problems)} problems:", problems)
    problem = problems[0]
    if problem.startswith("line "):
        number, _, rest = problem.removeprefix("line ").partition(": ")
        return RosterError(f"{path}:{number}: {rest}")
    return RosterError(f"{path}: {problem}")


def _check(model: type[_B], data: object) -> tuple[_B | None, list[str]]:
    """``data`` validated as ``model``, or ``None`` and every problem, one line each."""
    if not isinstance(data, dict):
        return None, [f"expected a mapping at the top level, got {type(data).__name__}"]
    try:
        return model.model_validate(data), []
    except ValidationError as exc:
        return None, [_problem(model, error) for error in exc.errors(include_url=False)]


def _problem(model: type[BaseModel], error: dict) -> str:
    """One pydantic error as ``field 'a.0.b': what is wrong (got VALUE)``."""
    loc = error["loc"]
    field = ".".join(str(part) for part in loc) or "(top level)"
    if error["type"] == "extra_forbidden":
        parent = _model_at(model, loc[:-1])
        message = f"unknown field (valid fields: {', '.join(sorted(parent.model_fields))})"
        home = [name for name, child in _children(parent).items() if str(loc[-1]) in child.model_fields]
        if home:
            message += f"; '{loc[-1]}' is a field of '{home[0]}'"
        return f"field '{field}': {message}"
    if error["type"] == "value_error":  # our validators: the message without pydantic's prefix
        message = str(error.get("ctx", {}).get("error", error["msg"]))
    else:
        message = error["msg"]
    value = error.get("input")
    if error["type"] != "missing" and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
        message += f" (got {shown})"
    return f"field '{field}': {message}"


def _children(model: type[BaseModel]) -> dict[str, type[BaseModel]]:
    """The fields of ``model`` that hold a model or a list of models, with that model."""
    found: dict[str, type[BaseModel]] = {}
    for name, info in model.model_fields.items():
        inner = _model_of(info.annotation)
        if inner is not None:
            found[name] = inner
    return found


def _model_of(annotation: object) -> type[BaseModel] | None:
    """The model an annotation holds: ``X``, ``list[X]`` or ``list[Annotated[X, ...]]``."""
    while not (isinstance(annotation, type) and issubclass(annotation, BaseModel)):
        args = get_args(annotation)
        if not args:
            return None
        annotation = args[0]
    return annotation


def _model_at(model: type[BaseModel], loc: tuple[int | str, ...]) -> type[BaseModel]:
    """The (nested) model that ``loc`` points into."""
    current = model
    for part in loc:
        if isinstance(part, str):
            current = _children(current).get(part, current)
    return current
