"""Routing accuracy: does a Director send the voice its roster's guidance calls for?

Each shipped roster has a small routing set (``mascot/rosters/data/<id>/routing.yaml``):
decision points, a conversation so far, with the voices that fit next (``fits``) and the
ones the guidance rules out (``misfits``). ``routing_results`` asks a Director (the graph's
own ``Decider``: the same shuffled offer, prompt, structured output and interpretation)
once per point; a point is right when the direction names a voice that fits. A Director
that names whichever voice it reads first is right about as often as chance allows, so
this number, beside ``first_offered``, tells choosing from position.
"""

from __future__ import annotations

import asyncio
import logging
from importlib import resources
from pathlib import Path

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage
from pydantic import BaseModel, ConfigDict, Field

from mascot.graphs.decider import Decider
from mascot.messages import langchain_message
from mascot.rosters import Roster
from mascot.rosters.yaml_file import YamlFileError, read_model

PERSON = "person"
logger = logging.getLogger(__name__)


class RoutingError(ValueError):
    """A routing set cannot be used; the message is one line naming the file."""


class RoutingPoint(BaseModel):
    """One decision point of a routing set."""

    model_config = ConfigDict(extra="forbid")
    id: str = Field(min_length=1)
    conversation: list[dict[str, str]] = Field(min_length=1)
    fits: list[str] = Field(min_length=1)
    misfits: list[str] = Field(default_factory=list)


class _RoutingFile(BaseModel):
    model_config = ConfigDict(extra="forbid")
    roster: str
    points: list[RoutingPoint] = Field(min_length=1)


def routing_path(roster: Roster) -> Path:
    """The shipped routing set of a roster (which may not exist)."""
    return Path(str(resources.files("mascot.rosters").joinpath("data", roster.id, "routing.yaml")))


def load_routing_set(roster: Roster, path: str | Path | None = None) -> list[RoutingPoint]:
    """The routing points of ``roster``: its shipped set, or the file ``path``.

    Raises:
        RoutingError: on a missing or invalid file, another roster's file, or a point that
            names an unknown speaker or a voice both fitting and not.
    """
    path = Path(path) if path is not None else routing_path(roster)
    if not path.is_file():
        raise RoutingError(f"{path}: no routing set for roster '{roster.id}'")
    try:
        data = read_model(path, _RoutingFile)
    except YamlFileError as exc:
        raise RoutingError(str(exc)) from None
    if data.roster != roster.id:
        raise RoutingError(f"{path}: a routing set of roster '{data.roster}', not '{roster.id}'")
    for point in data.points:
        unknown = sorted({*point.fits, *point.misfits} - set(roster.persona_ids))
        speakers = {s for turn in point.conversation for s in turn} - {PERSON, *roster.persona_ids}
        if unknown or speakers:
            raise RoutingError(f"{path}: point '{point.id}': unknown speaker {min({*unknown, *speakers})}")
        if set(point.fits) & set(point.misfits):
            raise RoutingError(f"{path}: point '{point.id}': a voice both fits and does not")
    return data.points


def point_messages(point: RoutingPoint) -> list[BaseMessage]:
    """A point's conversation as the graph holds it."""
    messages = []
    for turn in point.conversation:
        [(speaker, text)] = turn.items()
        messages.append(langchain_message("user", text) if speaker == PERSON
                        else langchain_message("assistant", text, speaker))
    return messages


def _round_turns(messages: list[BaseMessage]) -> int:
    turns = 0
    for message in messages:
        turns = 0 if message.type == "human" else turns + 1
    return turns


async def routing_results(
    director: BaseChatModel, roster: Roster, points: list[RoutingPoint], *, structured_output: bool = True,
    concurrency: int = 4, max_speakers_per_round: int = 3, min_speakers_per_round: int = 1,
) -> dict[str, dict[str, object]]:
    """Ask ``director`` once per point, as the director graph with these limits would.

    Returns:
        Point id -> ``{"speaker", "right": the speaker fits, "misfit": it is ruled out,
        "offered", "fallback"}``; a point whose model call failed has ``"error"``, is not
        right, and is logged (one failure does not lose the evaluation).
    """
    decider = Decider(roster, director, structured_output=structured_output,
                      max_speakers_per_round=max_speakers_per_round, min_speakers_per_round=min_speakers_per_round)
    limit = asyncio.Semaphore(concurrency)

    async def one(point: RoutingPoint) -> tuple[str, dict[str, object]]:
        messages = point_messages(point)
        async with limit:
            try:
                direction = await decider.adecide(messages, round_turns=_round_turns(messages))
            except Exception as exc:  # a server fault: recorded for this point, the others go on
                logger.warning("routing point %s failed: %s", point.id, exc)
                return point.id, {"speaker": None, "right": False, "misfit": False, "offered": None,
                                  "fallback": None, "error": f"{type(exc).__name__}: {exc}"[:300]}
        return point.id, {"speaker": direction.speaker, "right": direction.speaker in point.fits,
                          "misfit": direction.speaker in point.misfits, "offered": direction.offered,
                          "fallback": direction.fallback}

    return dict(await asyncio.gather(*(one(p) for p in points)))
