"""Loading and validating rosters and scenario files, shipped or user-written."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import TypeVar

from pydantic import BaseModel, ValidationError

from mascot.rosters.models import Roster, Scenario, UserProfile
from mascot.rosters.yaml_file import YamlFileError, read_yaml

_DATA = "data"
_ROSTER_FILE = "roster.yaml"
_SCENARIO_FILE = "scenarios.jsonl"


class RosterError(ValueError):
    """A roster or scenario file is missing or does not validate.

    The message is one line naming the file, the field and the problem.
    """


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


def load_roster(name_or_path: str | Path) -> Roster:
    """Load and validate a roster.

    Args:
        name_or_path: A shipped roster id, a roster YAML file, or its directory.

    Returns:
        The validated roster.

    Raises:
        RosterError: on a missing file, malformed YAML, unknown or missing fields,
            duplicate ids or out-of-range values, with a one-line message.
    """
    path = roster_path(name_or_path)
    data = _read_yaml(path)
    return _validate(Roster, data, path)


def load_scenarios(name_or_path: str | Path) -> list[Scenario]:
    """Load the opening scenarios of a roster or from a JSONL file.

    Args:
        name_or_path: A shipped roster id, a roster directory holding
            ``scenarios.jsonl``, or a JSONL file with one scenario object per line.

    Returns:
        The scenarios in file order.

    Raises:
        RosterError: on a missing file, a line that is not JSON, an invalid scenario,
            duplicate scenario ids or an empty file.
    """
    text = str(name_or_path)
    if text in list_rosters():
        path = Path(str(resources.files(__package__).joinpath(_DATA, text, _SCENARIO_FILE)))
    else:
        path = Path(text).expanduser()
        if path.is_dir():
            path = path / _SCENARIO_FILE
    return _read_models(path, Scenario, "scenario")


def load_profiles(path: str | Path) -> list[UserProfile]:
    """Load user profiles for the simulator from a file.

    Args:
        path: A JSONL file (one profile per line), or a YAML file holding a list of
            profiles or a mapping with ``user_profiles`` (a roster file works).

    Returns:
        The profiles in file order.

    Raises:
        RosterError: on a missing file, malformed content, an invalid profile,
            duplicate ids or no profiles.
    """
    path = Path(path).expanduser()
    if path.suffix != ".jsonl":
        if not path.is_file():
            raise RosterError(f"{path}: no such profile file")
        data = _read_yaml(path)
        if isinstance(data, dict) and "user_profiles" in data:
            data = data["user_profiles"]
        if not isinstance(data, list):
            raise RosterError(f"{path}: expected a list of user profiles or a 'user_profiles' key")
        profiles = [_validate(UserProfile, item, f"{path}: profile {i + 1}") for i, item in enumerate(data)]
        return _unique(profiles, path, "user profile")
    return _read_models(path, UserProfile, "user profile")


_M = TypeVar("_M", Scenario, UserProfile)


def _read_models(path: Path, model: type[_M], what: str) -> list[_M]:
    """One validated object per line of a JSONL file, ids unique."""
    if not path.is_file():
        raise RosterError(f"{path}: no such {what} file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise RosterError(f"{path}: cannot read file ({exc})") from None
    items: list[_M] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            data = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RosterError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
        items.append(_validate(model, data, f"{path}:{number}"))
    return _unique(items, path, what)


def _unique(items: list[_M], path: Path, what: str) -> list[_M]:
    seen: set[str] = set()
    for item in items:
        if item.id in seen:
            raise RosterError(f"{path}: duplicate {what} id '{item.id}'")
        seen.add(item.id)
    if not items:
        raise RosterError(f"{path}: no {what}s in file")
    return items


def _read_yaml(path: Path) -> object:
    try:
        return read_yaml(path)
    except YamlFileError as exc:
        raise RosterError(str(exc)) from None


_B = TypeVar("_B", bound=BaseModel)


def _validate(model: type[_B], data: object, where: object) -> _B:
    if not isinstance(data, dict):
        raise RosterError(f"{where}: expected a mapping at the top level, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        field = ".".join(str(part) for part in error["loc"]) or "(top level)"
        message = error["msg"]
        if error["type"] == "extra_forbidden":
            valid = ", ".join(_field_names(model, error["loc"][:-1]))
            message = f"unknown field (valid fields: {valid})"
        more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
        raise RosterError(f"{where}: field '{field}': {message}{more}") from None


def _field_names(model: type[BaseModel], loc: tuple[int | str, ...]) -> list[str]:
    """Return the field names of the (nested) model that ``loc`` points into."""
    current: type[BaseModel] = model
    for part in loc:
        if isinstance(part, int):
            continue
        annotation = current.model_fields[str(part)].annotation
        inner = getattr(annotation, "__args__", (annotation,))[0]  # list[X] -> X
        if isinstance(inner, type) and issubclass(inner, BaseModel):
            current = inner
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            current = annotation
    return sorted(current.model_fields)
