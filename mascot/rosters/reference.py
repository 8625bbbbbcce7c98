"""The roster schema reference: Markdown tables generated from the pydantic models.

``docs/rosters.md`` holds this text between ``START`` and ``END``; a test keeps
the two equal (``mascot rosters schema --write docs/rosters.md`` regenerates it), so the
reference cannot fall behind the models.
"""

from __future__ import annotations

import inspect
import json
from typing import Any

from pydantic import BaseModel

from mascot.rosters.models import DirectorGuidance, Ocean, Persona, Roster, SafetyRule, Scenario, UserProfile

#: The models documented, in the order a reader meets them.
MODELS: tuple[type[BaseModel], ...] = (Roster, Persona, DirectorGuidance, UserProfile, Ocean, SafetyRule, Scenario)
#: The markers around the generated text in a Markdown document.
START = "<!-- roster-schema:start -->"
END = "<!-- roster-schema:end -->"

_FILES = """\
A roster is a folder holding two files:

- `roster.yaml`: one [Roster](#roster) mapping. Personas, user profiles and the
  Director's guidance are nested inside it (see the outline below).
- `scenarios.jsonl`: the opening situations, one [Scenario](#scenario) JSON object per
  line. `chat` works without it; `rollout` needs it (or `--scenarios FILE.jsonl`).

Every field below is checked by `mascot rosters check FOLDER`, which reads both files
and exits 0 when they are valid (a missing `scenarios.jsonl` is a warning, not an error)
or 2 with every problem of a file at once, one line each under `FILE: N problems:`.
Unknown fields are errors in both files (names are exact, in lower case); surrounding
spaces are stripped from text before its length is counted in characters; a list's
bounds count its items; any YAML style of text or list (`[a, b]`, one `- item` a line,
`>-` blocks) will do. Note that scenario ids follow their own pattern (they may start
with a digit and hold `-`), unlike roster, persona and profile ids."""


def schema_reference() -> str:
    """Render the schema reference: the roster folder, an outline, and one table per model.

    Returns:
        Markdown text (level-4 headings, one per model), ending with a newline.
    """
    parts = [_FILES, "```yaml\n" + "\n".join(_outline(Roster, 0)) + "\n```",
             "`scenarios.jsonl`, one line per scenario:",
             "```json\n" + json.dumps(_json_outline(Scenario)) + "\n```"]
    for model in MODELS:
        parts.append(f"#### {model.__name__}\n\n{_intro(model)}\n\n{_table(model)}")
    return "\n\n".join(parts) + "\n"


def with_reference(document: str) -> str:
    """Return ``document`` with the text between ``START`` and ``END`` replaced by the reference.

    Args:
        document: Markdown text holding both markers, ``START`` first, each once.

    Returns:
        The document with a fresh reference between the markers.

    Raises:
        ValueError: if a marker is missing, repeated or out of order.
    """
    if document.count(START) != 1 or document.count(END) != 1 or document.index(START) > document.index(END):
        raise ValueError(f"the document must hold '{START}' and then '{END}', each once")
    head, rest = document.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{schema_reference()}{END}{tail}"


def field_summary(model: type[BaseModel], name: str) -> str:
    """One sentence about a field: its description, constraints and whether it is required.

    Args:
        model: One of ``MODELS``.
        name: A field of ``model``.

    Returns:
        Text for a comment, e.g. in the YAML that ``mascot rosters new`` writes.

    Raises:
        KeyError: if ``model`` has no such field; the message lists its fields.
    """
    if name not in model.model_fields:
        raise KeyError(f"{model.__name__} has no field '{name}'; fields: {', '.join(model.model_fields)}")
    prop = _properties(model)[name]
    rules = _rules(prop)
    text = model.model_fields[name].description or ""
    kind = _type(prop, links=False)
    text += f" {kind[0].upper()}{kind[1:]}" + (f", {rules}" if rules else "") + "; "
    return text + _required(model, name).replace("`", "") + "."


def _properties(model: type[BaseModel]) -> dict[str, dict[str, Any]]:
    properties = model.model_json_schema()["properties"]
    for name, prop in properties.items():  # an optional value (`X | None`) is documented as X
        kinds = [k for k in prop.get("anyOf", []) if k.get("type") != "null"]
        if len(kinds) == 1:
            properties[name] = {**{k: v for k, v in prop.items() if k != "anyOf"}, **kinds[0]}
    return properties


def _intro(model: type[BaseModel]) -> str:
    return inspect.cleandoc(model.__doc__ or "").split("\n\n")[0].replace("\n", " ")


def _table(model: type[BaseModel]) -> str:
    rows = ["| field | type | required | constraints | description |", "|---|---|---|---|---|"]
    for name, prop in _properties(model).items():
        cells = [f"`{name}`", _type(prop), _required(model, name), _rules(prop),
                 model.model_fields[name].description or ""]
        rows.append("| " + " | ".join(cell.replace("|", "\\|") for cell in cells) + " |")
    return "\n".join(rows)


def _ref(prop: dict[str, Any]) -> str:
    return str(prop["$ref"]).rsplit("/", 1)[-1]


def _type(prop: dict[str, Any], *, links: bool = True) -> str:
    if "$ref" in prop:
        name = _ref(prop)
        return f"[{name}](#{name.lower()}) mapping" if links else f"{name} mapping"
    if "enum" in prop:
        return "word"
    kind = prop.get("type")
    if kind == "array":
        inner = _type(prop["items"], links=links)
        return f"list of {inner}s" if "$ref" in prop["items"] else f"list of {inner}"
    return {"string": "text", "integer": "whole number", "number": "number"}.get(str(kind), str(kind))


def _rules(prop: dict[str, Any]) -> str:
    rules = []
    if "enum" in prop:
        rules.append("one of " + ", ".join(f"`{word}`" for word in prop["enum"]))
    if "pattern" in prop:
        rules.append(f"matches `{prop['pattern']}`")
    rules += _bounds(prop.get("minLength"), prop.get("maxLength"), "characters")
    rules += _bounds(prop.get("minItems"), prop.get("maxItems"), "items")
    low, high = prop.get("minimum"), prop.get("maximum")
    if low is not None and high is not None:
        rules.append(f"from {low} to {high}")
    elif low is not None:
        rules.append(f"at least {low}")
    elif high is not None:
        rules.append(f"at most {high}")
    return "; ".join(rules)


def _bounds(low: int | None, high: int | None, unit: str) -> list[str]:
    if low is not None and high is not None:
        return [f"{low}–{high} {unit}"]
    if low is not None:
        return [f"at least {low} {unit}"]
    if high is not None:
        return [f"at most {high} {unit}"]
    return []


def _required(model: type[BaseModel], name: str) -> str:
    field = model.model_fields[name]
    if field.is_required():
        return "required"
    return f"optional (default `{json.dumps(field.get_default(call_default_factory=True))}`)"


def _placeholder(prop: dict[str, Any]) -> str:
    if "enum" in prop:
        return " | ".join(prop["enum"])
    return {"string": "text", "integer": "whole number", "number": "number"}.get(str(prop.get("type")), "…")


def _outline(model: type[BaseModel], indent: int) -> list[str]:
    """The YAML shape of ``model``: each field with a placeholder, nested models expanded."""
    pad = " " * indent
    lines: list[str] = []
    for name, prop in _properties(model).items():
        inner = _nested(model, name)
        if inner is None:
            value = f"[{_placeholder(prop['items'])}, …]" if prop.get("type") == "array" else f"<{_placeholder(prop)}>"
            lines.append(f"{pad}{name}: {value}")
        elif prop.get("type") == "array":
            item = _outline(inner, indent + 4)
            lines += [f"{pad}{name}:", f"{pad}  - {item[0].lstrip()}", *item[1:], f"{pad}  - …"]
        else:
            lines += [f"{pad}{name}:", *_outline(inner, indent + 2)]
    return lines


def _json_outline(model: type[BaseModel]) -> dict[str, str | list[str]]:
    outline: dict[str, str | list[str]] = {}
    for name, prop in _properties(model).items():
        outline[name] = [_placeholder(prop["items"])] if prop.get("type") == "array" else _placeholder(prop)
    return outline


def _nested(model: type[BaseModel], name: str) -> type[BaseModel] | None:
    """The model documented in ``MODELS`` that a field holds (itself or as list items)."""
    prop = _properties(model)[name]
    ref = prop.get("$ref") or prop.get("items", {}).get("$ref")
    if ref is None:
        return None
    return next(m for m in MODELS if m.__name__ == str(ref).rsplit("/", 1)[-1])
