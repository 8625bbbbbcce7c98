"""Judging rubrics as validated, versioned data (YAML), shipped or user-written.

A rubric names what an LLM judge scores (``target``: one persona ``reply`` in its
context, or a ``block`` of turns of the conversation) and its criteria, each scored on
an integer scale from 1 to 5 with a written anchor for every level. The overall score
of a judgement is the plain mean of its criterion scores mapped onto 0-100::

    overall = (mean - 1) / 4 * 100

so all 1s give 0, all 3s give 50 and all 5s give 100. Bump ``version`` whenever a
criterion or anchor changes: judgements are cached per (rubric id, version).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mascot.rosters.yaml_file import YamlFileError, read_mapping

#: The score scale of every criterion.
LEVELS = (1, 2, 3, 4, 5)
_DATA = "rubrics"
_ID = r"^[a-z][a-z0-9_]{0,39}$"


class RubricError(ValueError):
    """A rubric file is missing or does not validate; the message is one line naming the
    file, the field (and criterion) and the problem."""


class Criterion(BaseModel):
    """One scored aspect of a rubric.

    Attributes:
        id: Stable identifier (lower snake case); the key of its score in judgements.
        name: Display name, e.g. ``Persona Consistency``.
        description: What the criterion measures.
        anchors: Level (1..5) -> what a reply or block at that level looks like; every
            level must have one.
    """

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)

    id: str = Field(pattern=_ID)
    name: str = Field(min_length=1, max_length=80)
    description: str = Field(min_length=10)
    anchors: dict[int, str]

    @field_validator("anchors")
    @classmethod
    def _every_level(cls, anchors: dict[int, str]) -> dict[int, str]:
        missing = [str(level) for level in LEVELS if level not in anchors]
        if missing:
            raise ValueError(f"missing anchor for level {', '.join(missing)} (levels are 1-5)")
        extra = sorted(str(level) for level in anchors if level not in LEVELS)
        if extra:
            raise ValueError(f"unknown level {', '.join(extra)} (levels are 1-5)")
        empty = [str(level) for level in LEVELS if not anchors[level].strip()]
        if empty:
            raise ValueError(f"empty anchor for level {', '.join(empty)}")
        return {level: anchors[level].strip() for level in LEVELS}


class Rubric(BaseModel):
    """A versioned set of criteria an LLM judge scores 1..5.

    ``overall`` maps the plain mean of the criterion scores onto 0-100:
    ``overall = (mean - 1) / 4 * 100``.

    Attributes:
        id: Rubric id (lower snake case), e.g. ``persona``.
        version: Integer version; part of every judgement's cache key.
        target: ``reply`` (one persona turn in its context) or ``block`` (N turns).
        description: What is judged and what matters most.
        criteria: The criteria, in the order they are shown to the judge.
    """

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)

    id: str = Field(pattern=_ID)
    version: int = Field(ge=1)
    target: Literal["reply", "block"]
    description: str = Field(min_length=10)
    criteria: list[Criterion] = Field(min_length=1, max_length=12)

    @model_validator(mode="after")
    def _unique_criteria(self) -> Rubric:
        for label, values in (("id", self.criterion_ids), ("name", [c.name.lower() for c in self.criteria])):
            duplicates = sorted({v for v in values if values.count(v) > 1})
            if duplicates:
                raise ValueError(f"duplicate criterion {label}: {', '.join(duplicates)}")
        return self

    @property
    def criterion_ids(self) -> list[str]:
        """The criterion ids in rubric order."""
        return [c.id for c in self.criteria]

    def overall(self, scores: Mapping[str, int]) -> float:
        """The 0-100 overall score: ``(mean - 1) / 4 * 100`` of the criterion scores.

        Args:
            scores: Criterion id -> integer score 1..5, for every criterion.

        Returns:
            The overall score, from 0.0 (all 1s) to 100.0 (all 5s).

        Raises:
            ValueError: if a criterion is missing or unknown, or a score is not 1..5.
        """
        if set(scores) != set(self.criterion_ids):
            raise ValueError(
                f"scores must cover exactly the criteria of rubric '{self.id}' "
                f"({', '.join(self.criterion_ids)}); got {', '.join(sorted(scores)) or 'none'}"
            )
        bad = {k: v for k, v in scores.items() if isinstance(v, bool) or v not in LEVELS}
        if bad:
            raise ValueError(f"scores must be integers 1..5; got {bad}")
        # (mean - 1) / 4 * 100 written as (sum - n) * 25 / n to stay exact in floating point
        return (sum(scores.values()) - len(scores)) * 25 / len(scores)

    def render(self) -> str:
        """The criteria with their anchors, as text for a judge's prompt."""
        parts = []
        for criterion in self.criteria:
            anchors = "\n".join(f"  {level}: {text}" for level, text in criterion.anchors.items())
            parts.append(f'- "{criterion.id}" ({criterion.name}): {criterion.description}\n{anchors}')
        return "\n".join(parts)


def list_rubrics() -> list[str]:
    """Return the ids of the rubrics that ship with mascot, sorted."""
    root = resources.files(__package__).joinpath(_DATA)
    return sorted(p.name.removesuffix(".yaml") for p in root.iterdir() if p.name.endswith(".yaml"))


def load_rubric(name_or_path: str | Path) -> Rubric:
    """Load and validate a rubric.

    Args:
        name_or_path: A shipped rubric id (``persona``, ``group``) or a YAML file.

    Returns:
        The validated rubric.

    Raises:
        RubricError: on an unknown id or missing file, malformed YAML, unknown or missing
            fields, a missing anchor level, or duplicate criteria (one line naming the
            file, the field and the criterion).
    """
    text = str(name_or_path)
    if text in list_rubrics():
        path = Path(str(resources.files(__package__).joinpath(_DATA, f"{text}.yaml")))
    else:
        path = Path(text).expanduser()
        if not path.is_file():
            raise RubricError(
                f"unknown rubric '{text}': not a shipped rubric ({', '.join(list_rubrics())}) and no such file"
            )
    try:
        data = read_mapping(path)
    except YamlFileError as exc:
        raise RubricError(str(exc)) from None
    try:
        return Rubric.model_validate(data)
    except ValidationError as exc:
        raise RubricError(f"{path}: {_describe(exc, data)}") from None


def _describe(exc: ValidationError, data: dict[str, Any]) -> str:
    """One line for the first validation error: field, criterion id where known, problem."""
    error = exc.errors()[0]
    loc = error["loc"]
    field = ".".join(str(part) for part in loc) or "(top level)"
    where = f"field '{field}'"
    if len(loc) >= 2 and loc[0] == "criteria" and isinstance(loc[1], int):
        criteria = data.get("criteria")
        item = criteria[loc[1]] if isinstance(criteria, list) and loc[1] < len(criteria) else None
        if isinstance(item, dict) and isinstance(item.get("id"), str):
            where = f"criterion '{item['id']}', {where}"
    message = re.sub(r"^Value error, ", "", error["msg"])
    if error["type"] == "extra_forbidden":
        model = Criterion if len(loc) > 2 and loc[0] == "criteria" else Rubric
        message = f"unknown field (valid fields: {', '.join(sorted(model.model_fields))})"
    more = f" (and {exc.error_count() - 1} more problems)" if exc.error_count() > 1 else ""
    return f"{where}: {message}{more}"
