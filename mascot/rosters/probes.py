"""Groupthink probes of a roster, and replies to them labelled by hand for sycophancy.

Each shipped roster has a probe set (``data/<id>/groupthink.yaml``): a person states a plan,
belief or self-judgement that a good ensemble should not simply endorse, with the concerns a
good voice could raise and a scripted *confederate*, a first voice that warmly endorses the
flawed view. Probes are split into ``dev`` (for choosing settings) and ``test`` (held out).
Beside it, ``groupthink_labels.yaml`` holds replies a persona could give to those probes,
labelled: does the reply only endorse, which listed concern does it raise, and, after the
confederate, does it conform. Detectors of social sycophancy are checked against these labels.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from mascot.rosters.loader import RosterError, list_rosters, load_roster, roster_path
from mascot.rosters.models import Roster
from mascot.rosters.yaml_file import YamlFileError, read_mapping

PROBE_FILE = "groupthink.yaml"
LABEL_FILE = "groupthink_labels.yaml"
SPLITS = ("dev", "test")
PROBE_ID_PATTERN = r"^[a-z][a-z0-9]*-gt-[0-9]{2,3}$"
_MAX_TEXT = 1000


class ProbeSetError(ValueError):
    """A probe set or labelled-reply file is missing or does not validate; the message is
    one line naming the file (and the item at fault)."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)


class GroupthinkProbe(_Strict):
    """A message a good ensemble should not simply endorse: an item of ``groupthink.yaml``'s `probes`."""

    id: str = Field(pattern=PROBE_ID_PATTERN,
                    description="Stable identifier: the roster's prefix, `-gt-` and a number, e.g. `es-gt-01`; "
                                "unique in the file.")
    kind: Literal["plan", "belief", "self_judgement", "proposal"] = Field(
        description="What the person states: a plan, a belief, a judgement of themselves, or a proposal to a group.")
    message: str = Field(min_length=10, max_length=_MAX_TEXT,
                         description="What the person says (1-3 sentences, first person).")
    concerns: list[str] = Field(min_length=2, max_length=4,
                                description="Concerns or alternatives a good voice could raise, one short "
                                            "sentence each; labelled replies point into this list by index.")
    confederate: str = Field(min_length=10, max_length=_MAX_TEXT,
                             description="A scripted first voice that warmly endorses the flawed view, "
                                         "raising no concern.")
    split: Literal["dev", "test"] = Field(description="`dev` for choosing settings, `test` held out for reporting.")

    @field_validator("concerns")
    @classmethod
    def _non_empty(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("concerns must be non-empty text")
        return [item.strip() for item in value]


class ProbeSet(_Strict):
    """All of ``groupthink.yaml``."""

    version: Literal[1] = Field(description="Version of the file format: 1.")
    probes: list[GroupthinkProbe] = Field(min_length=1, description="The probes; ids unique.")

    @field_validator("probes")
    @classmethod
    def _unique(cls, probes: list[GroupthinkProbe]) -> list[GroupthinkProbe]:
        ids = [p.id for p in probes]
        duplicates = sorted({i for i in ids if ids.count(i) > 1})
        if duplicates:
            raise ValueError(f"duplicate probe id: {', '.join(duplicates)}")
        return probes


class LabelledReply(_Strict):
    """A reply a persona could give to a probe, labelled by hand: an item of ``groupthink_labels.yaml``."""

    probe: str = Field(pattern=PROBE_ID_PATTERN, description="The id of the probe the reply answers.")
    voice: str = Field(min_length=1, max_length=40, description="The persona id of the voice that replies.")
    after_confederate: bool = Field(description="True when the reply follows the probe's confederate voice.")
    text: str = Field(min_length=5, max_length=_MAX_TEXT, description="The reply, as the voice says it.")
    endorses_only: bool = Field(description="The reply validates or agrees without adding any concern or "
                                            "alternative.")
    concern: int | None = Field(ge=0, description="Index (0-based) of the probe's concern the reply raises, "
                                                  "or null when it raises none of them.")
    conforms: bool = Field(description="After the confederate: the reply follows its endorsement without adding "
                                       "a concern (false when `after_confederate` is false).")

    @model_validator(mode="after")
    def _consistent(self) -> LabelledReply:
        if self.endorses_only and self.concern is not None:
            raise ValueError("endorses_only is true but a concern is raised; an endorsing-only reply has "
                             "concern: null")
        if self.conforms and not self.after_confederate:
            raise ValueError("conforms is true but after_confederate is false; only a reply after the "
                             "confederate can conform")
        if self.after_confederate and self.conforms != self.endorses_only:
            raise ValueError(f"after the confederate, conforms ({str(self.conforms).lower()}) must equal "
                             f"endorses_only ({str(self.endorses_only).lower()})")
        return self


class LabelledReplies(_Strict):
    """All of ``groupthink_labels.yaml``."""

    version: Literal[1] = Field(description="Version of the file format: 1.")
    replies: list[LabelledReply] = Field(min_length=1, description="The labelled replies.")


def probe_path(roster: Roster | str | Path) -> Path:
    """Return where a roster's probe set is read from (it need not exist).

    Args:
        roster: A roster (shipped ones only), a shipped roster id, a roster YAML file or
            its directory.
    """
    return _beside(roster, PROBE_FILE)


def label_path(roster: Roster | str | Path) -> Path:
    """Return where a roster's labelled replies are read from (it need not exist)."""
    return _beside(roster, LABEL_FILE)


def load_probes(roster: Roster | str | Path, path: Path | str | None = None, *,
                split: str | None = None) -> list[GroupthinkProbe]:
    """Load and validate a roster's groupthink probes.

    Args:
        roster: A roster, a shipped roster id, a roster YAML file or its directory.
        path: The probe file; default ``groupthink.yaml`` beside the roster's ``roster.yaml``.
        split: ``dev`` or ``test`` for that split only; ``None`` for all.

    Returns:
        The probes in file order.

    Raises:
        ProbeSetError: on a missing, malformed or invalid file (one line naming the file).
        ValueError: on an unknown ``split``.
    """
    if split is not None and split not in SPLITS:
        raise ValueError(f"unknown split '{split}'; valid: {', '.join(SPLITS)}")
    path = Path(path).expanduser() if path is not None else probe_path(roster)
    data = _read(path, "probe set")
    try:
        probes = ProbeSet.model_validate(data).probes
    except ValidationError as exc:
        raise ProbeSetError(f"{path}: {_describe(exc, data, 'probes', 'probe', 'id')}") from None
    return [p for p in probes if split is None or p.split == split]


def load_labelled_replies(roster: Roster | str | Path, path: Path | str | None = None, *,
                          probes: list[GroupthinkProbe] | None = None) -> list[LabelledReply]:
    """Load and validate the labelled replies to a roster's probes.

    Args:
        roster: A roster, a shipped roster id, a roster YAML file or its directory; every
            reply's voice must be one of its personas.
        path: The label file; default ``groupthink_labels.yaml`` beside the roster's file.
        probes: The probes the replies answer; default the probe set beside the label file.

    Returns:
        The replies in file order.

    Raises:
        ProbeSetError: on a missing, malformed or invalid file, an unknown probe id or
            voice, or a concern index out of the probe's range (one line naming the file
            and the reply).
    """
    resolved = _roster(roster)
    path = Path(path).expanduser() if path is not None else label_path(roster)
    if probes is None:
        probes = load_probes(resolved, path.parent / PROBE_FILE)
    data = _read(path, "labelled-reply file")
    try:
        replies = LabelledReplies.model_validate(data).replies
    except ValidationError as exc:
        raise ProbeSetError(f"{path}: {_describe(exc, data, 'replies', 'reply', 'probe')}") from None
    by_id = {p.id: p for p in probes}
    voices = resolved.persona_ids
    for number, reply in enumerate(replies, start=1):
        where = f"{path}: reply {number} (probe '{reply.probe}')"
        probe = by_id.get(reply.probe)
        if probe is None:
            raise ProbeSetError(f"{where}: unknown probe id; not in the probe set")
        if reply.voice not in voices:
            raise ProbeSetError(f"{where}: unknown voice '{reply.voice}'; valid: {', '.join(voices)}")
        if reply.concern is not None and reply.concern >= len(probe.concerns):
            raise ProbeSetError(f"{where}: concern {reply.concern} out of range (the probe has "
                                f"{len(probe.concerns)} concerns, 0-{len(probe.concerns) - 1})")
    return replies


def _roster(roster: Roster | str | Path) -> Roster:
    if isinstance(roster, Roster):
        return roster
    try:
        return load_roster(roster)
    except RosterError as exc:
        raise ProbeSetError(str(exc).splitlines()[0]) from None


def _beside(roster: Roster | str | Path, name: str) -> Path:
    if isinstance(roster, Roster):
        if roster.id not in list_rosters():
            raise ProbeSetError(f"roster '{roster.id}' is not shipped: pass the path of its {name}")
        roster = roster.id
    try:
        return roster_path(roster).parent / name
    except RosterError as exc:
        raise ProbeSetError(str(exc)) from None


def _read(path: Path, what: str) -> object:
    if not path.is_file():
        raise ProbeSetError(f"{path}: no such {what}")
    try:
        return read_mapping(path)
    except YamlFileError as exc:
        raise ProbeSetError(str(exc)) from None


def _describe(exc: ValidationError, data: object, field: str, item: str, key: str) -> str:
    """A validation error on one line: the first problem, the item it is in, and how many more."""
    errors = exc.errors(include_url=False)
    error = errors[0]
    loc = list(error["loc"])
    where = ".".join(str(part) for part in loc) or "(top level)"
    if len(loc) >= 2 and loc[0] == field and isinstance(loc[1], int):
        items = data.get(field) if isinstance(data, dict) else None
        raw = items[loc[1]] if isinstance(items, list) and loc[1] < len(items) else None
        name = raw.get(key) if isinstance(raw, dict) else None
        where = f"{item} {loc[1] + 1}" + (f" ({key} '{name}')" if isinstance(name, str) else "")
        rest = [str(part) for part in loc[2:] if not str(part).startswith("function-")]
        if rest:
            where += f", field '{'.'.join(rest)}'"
    else:
        where = f"field '{where}'"
    message = str(error.get("ctx", {}).get("error", error["msg"])) if error["type"] == "value_error" else error["msg"]
    extra = len(errors) - 1
    more = f" (and {extra} more problem{'s' if extra > 1 else ''})" if extra else ""
    return f"{where}: {message}{more}".replace("\n", " ")
