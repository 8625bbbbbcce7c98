"""Routing sets: decision points where the roster's guidance says who fits; a Director that
names the first voice it is offered scores about chance, one that follows the guidance 100 %."""

from __future__ import annotations

import asyncio
import json
import re
from pathlib import Path

import pytest
from fakes import PromptChat

from mascot.rosters import load_roster
from mascot.training.evaluation.routing import (
    RoutingError,
    load_routing_set,
    point_messages,
    routing_results,
)


def _first_offered(prompt: str) -> str:
    offered = re.search(r"Voices who may speak now:\n- (\w+):", prompt)
    return json.dumps({"speaker": offered.group(1), "action": "speak", "tone": "warm"})


@pytest.mark.parametrize("roster_id", ["emotional_support", "workplace_meeting"])
def test_the_shipped_routing_sets_load(roster_id: str) -> None:
    roster = load_roster(roster_id)
    points = load_routing_set(roster)
    assert len(points) >= 10 and len({p.id for p in points}) == len(points)
    assert all(point_messages(p)[0].type == "human" for p in points)


def test_position_is_chance_and_the_guidance_is_right(roster) -> None:
    points = load_routing_set(roster)
    by_position = asyncio.run(routing_results(PromptChat(reply=_first_offered), roster, points,
                                              structured_output=False))
    share = sum(r["right"] for r in by_position.values()) / len(points)
    assert share < 0.75, by_position  # the shuffled offer makes the first voice a random one
    assert len({r["offered"][0] for r in by_position.values()}) >= 3  # first offered varies by point
    oracle = PromptChat(reply=lambda prompt: json.dumps({"speaker": _oracle(prompt, points), "action": "speak",
                                                         "tone": "warm"}))
    right = asyncio.run(routing_results(oracle, roster, points, structured_output=False))
    assert all(r["right"] and not r["misfit"] for r in right.values()), right


def _oracle(prompt: str, points: list) -> str:
    """The fitting voice of the point whose conversation the prompt shows (the longest match)."""
    shown = [p for p in points if all(next(iter(t.values())) in prompt for t in p.conversation)]
    return max(shown, key=lambda p: len(p.conversation)).fits[0]


def test_a_bad_routing_set_is_one_line(roster, tmp_path: Path) -> None:
    path = tmp_path / "routing.yaml"
    path.write_text("roster: emotional_support\npoints:\n  - id: x\n    conversation: [{person: hi}]\n"
                    "    fits: [socrates]\n")
    with pytest.raises(RoutingError, match="point 'x': unknown speaker socrates"):
        load_routing_set(roster, path)
    path.write_text("roster: workplace_meeting\npoints:\n  - id: x\n    conversation: [{person: hi}]\n"
                    "    fits: [anchor]\n")
    with pytest.raises(RoutingError, match="of roster 'workplace_meeting'"):
        load_routing_set(roster, path)
