"""A new roster folder to start from: a commented ``roster.yaml`` and a few scenarios.

The comments are the models' own field descriptions and constraints, so the file explains
exactly what ``load_roster`` checks. The placeholder content is valid as written: the
folder passes ``mascot rosters check`` and runs in ``mascot chat`` before it is edited.
"""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import yaml
from pydantic import BaseModel

from mascot.rosters.loader import RosterError
from mascot.rosters.models import (
    ID_PATTERN,
    DirectorGuidance,
    Ocean,
    Persona,
    Roster,
    Scenario,
    UserProfile,
)
from mascot.rosters.reference import field_summary

_WIDTH = 88


def scaffold_roster(roster_id: str, out: str | Path) -> list[Path]:
    """Write a new roster folder: ``roster.yaml`` (every field commented) and ``scenarios.jsonl``.

    Args:
        roster_id: The new roster's id (a lower-case letter, then lower-case letters,
            digits or ``_``).
        out: The folder to create; it may exist if it is empty.

    Returns:
        The two files written.

    Raises:
        RosterError: if ``roster_id`` is not a valid id, or ``out`` is a file or a
            folder that is not empty.
    """
    if not re.fullmatch(ID_PATTERN, roster_id):
        raise RosterError(f"roster id '{roster_id}' is not valid: it must match {ID_PATTERN} "
                          "(a lower-case letter, then lower-case letters, digits or _)")
    folder = Path(out).expanduser()
    if folder.exists() and not folder.is_dir():
        raise RosterError(f"{folder}: exists and is not a folder; give a new or empty folder")
    if folder.is_dir() and any(folder.iterdir()):
        raise RosterError(f"{folder}: folder exists and is not empty; give a new or empty folder")
    folder.mkdir(parents=True, exist_ok=True)
    roster_file, scenario_file = folder / "roster.yaml", folder / "scenarios.jsonl"
    roster_file.write_text(roster_yaml(placeholder_roster(roster_id)), encoding="utf-8")
    scenario_file.write_text("".join(s.model_dump_json() + "\n" for s in placeholder_scenarios()), encoding="utf-8")
    return [roster_file, scenario_file]


def roster_yaml(roster: Roster) -> str:
    """Render a roster as YAML with a comment above every field (above the first item's
    fields in a list), and the scenario file's fields described at the end.

    Args:
        roster: The roster to write.

    Returns:
        YAML text that ``load_roster`` reads back as ``roster``.
    """
    header = [
        f"# Roster '{roster.id}'. Replace the placeholder texts with your domain's; each field is",
        "# explained in the comment above it. Check the folder with: mascot rosters check FOLDER",
        "",
    ]
    footer = ["", "# scenarios.jsonl, beside this file, holds the opening situations: one JSON object",
              "# per line (rollout needs it; chat does not), with these fields:"]
    for name in Scenario.model_fields:
        footer += _comment(f"{name}: {field_summary(Scenario, name)}", 0)
    return "\n".join([*header, *_mapping(roster, 0, comments=True), *footer]) + "\n"


def placeholder_roster(roster_id: str) -> Roster:
    """A valid two-persona roster for any domain, to be edited.

    Args:
        roster_id: The roster's id.

    Returns:
        The roster.
    """
    domain = roster_id.replace("_", " ")
    return Roster(
        id=roster_id,
        version=1,
        domain=domain,
        description=(f"A small ensemble for the {domain} domain. Two complementary voices share one conversation: one "
                     "makes the person feel understood, one tests their thinking, so the group does not "
                     "simply agree with itself."),
        personas=[
            Persona(
                id="supporter",
                name="The Supporter",
                role="supportive listener",
                persona=("Warm, steady and unhurried. The Supporter listens for what matters to the person and "
                         "says it back plainly before anything else happens, so the person feels understood."),
                goals=["Make the person feel accurately heard.", "Name what is hard about the situation."],
                style="Short, gentle sentences in everyday words; one to three sentences per reply.",
                boundaries=["Never gives advice or action steps.", "Never writes lines for another voice."],
            ),
            Persona(
                id="challenger",
                name="The Challenger",
                role="constructive critic",
                persona=("Curious, direct and kind. The Challenger notices assumptions and all-or-nothing "
                         "conclusions and asks one good question that lets the person test them."),
                goals=["Separate facts from interpretations.", "Ask one open question that opens a new angle."],
                style="Plain and direct, one question at most per reply, no lectures.",
                boundaries=["Never agrees just to be agreeable.", "Never mocks or dismisses the person."],
            ),
        ],
        director=DirectorGuidance(
            guidance=("Let the Supporter speak first when the person is upset, and the Challenger when the "
                      "person is stuck on a conclusion. Avoid two voices saying the same thing; hand the turn "
                      "back to the person after one or two replies."),
        ),
        user_profiles=[
            UserProfile(
                id="sam",
                name="Sam",
                ocean=Ocean(openness=0.6, conscientiousness=0.5, extraversion=0.4, agreeableness=0.7,
                            neuroticism=0.6),
                situation="Sam is in their thirties and has something on their mind to talk through.",
                style="Short messages, lower case, rarely more than two sentences.",
            ),
        ],
    )


def placeholder_scenarios() -> list[Scenario]:
    """Three valid opening scenarios, one per valence and difficulty, to be edited.

    Returns:
        The scenarios.
    """
    return [
        Scenario(id="s-001", opening="I have to decide something by Friday and I keep going back and forth.",
                 context="Two options, both reasonable; the person fears regretting either one.",
                 valence="mixed", difficulty="easy", topics=["decision", "doubt"]),
        Scenario(id="s-002", opening="It went badly again and I am starting to think I am just not good at this.",
                 context="A second setback in a month; the person generalises from it to their ability.",
                 valence="negative", difficulty="medium", topics=["setback", "self-doubt"]),
        Scenario(id="s-003", opening="Something finally worked today and I want to keep it going.",
                 context="A first clear success after weeks of effort; the person is unsure what made it work.",
                 valence="positive", difficulty="hard", topics=["progress", "habits"]),
    ]


def _mapping(item: BaseModel, indent: int, *, comments: bool) -> list[str]:
    """The fields of ``item`` as YAML lines at ``indent``, each after its comment if asked."""
    pad = " " * indent
    lines: list[str] = []
    for name in type(item).model_fields:
        value = getattr(item, name)
        if comments:
            lines += _comment(field_summary(type(item), name), indent)
        if isinstance(value, BaseModel):
            lines += [f"{pad}{name}:", *_mapping(value, indent + 2, comments=comments)]
        elif isinstance(value, list) and value and isinstance(value[0], BaseModel):
            lines.append(f"{pad}{name}:")
            for number, entry in enumerate(value):
                entry_lines = _mapping(entry, indent + 4, comments=comments and number == 0)
                first = next(i for i, line in enumerate(entry_lines) if not line.lstrip().startswith("#"))
                entry_lines[first] = f"{pad}  - {entry_lines[first].lstrip()}"
                lines += entry_lines
        elif isinstance(value, list):
            lines += [f"{pad}{name}:", *(f"{pad}  - {_scalar(entry)}" for entry in value)] if value else \
                [f"{pad}{name}: []"]
        elif isinstance(value, str) and len(value) > _WIDTH - indent - len(name) - 2:
            lines += [f"{pad}{name}: >-", *textwrap.wrap(value, _WIDTH, initial_indent=pad + "  ",
                                                         subsequent_indent=pad + "  ")]
        else:
            lines.append(f"{pad}{name}: {_scalar(value)}")
    return lines


def _scalar(value: object) -> str:
    """One YAML scalar, quoted where YAML would read it as something else."""
    return yaml.safe_dump(value, width=10**6, allow_unicode=True).removesuffix("\n...\n").strip()


def _comment(text: str, indent: int) -> list[str]:
    pad = " " * indent
    return textwrap.wrap(text, _WIDTH, initial_indent=pad + "# ", subsequent_indent=pad + "# ")
