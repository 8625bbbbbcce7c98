"""Director preference pairs from an app's approvals: each direction the app edited or
rejected (``create_director_graph(approve=True)``), against the one it played instead."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from mascot.rosters import Roster
from mascot.training.data.block_rollout import decision_points
from mascot.training.data.pairs import PairSet, PairsReport, PreferencePair, split_value
from mascot.training.episodes.episode import Episode
from mascot.training.judging.judgement import Message

#: The fields of a direction a pair shows: what the Director's model writes.
DIRECTION_FIELDS = ("speaker", "action", "tone", "addressee", "sees")


def approval_pairs(episodes: Sequence[Episode], roster: Roster, *, test_fraction: float = 0.1,
                   seed: int = 0) -> PairSet:
    """One pair per edited or rejected direction: at the decision point where the app answered,
    the direction it played is ``chosen`` and the one the Director proposed is ``rejected``
    (a rejection pairs with the direction played after it at the same point; one never
    followed by a played direction makes no pair). The prompt is the Director's prompt
    there, as in the Director's other training data; whole decision points go to the test
    split (``test_fraction``).

    Raises:
        ValueError: if an episode belongs to another roster, or an approval names no
            decision point of its episode.
    """
    train: list[dict[str, Any]] = []
    test: list[dict[str, Any]] = []
    train_points: set[str] = set()
    test_points: set[str] = set()
    answers = 0
    for episode in episodes:
        if not episode.approvals:
            continue
        points = {point.cut: point for point in decision_points([episode], roster)}
        answers += len(episode.approvals)
        for index, entry in enumerate(episode.approvals):
            if entry.get("decision") not in ("edited", "rejected"):
                continue
            played = entry.get("played") if entry["decision"] == "edited" else _played_after(episode.approvals, index)
            if played is None:
                continue
            point = points.get(entry.get("cut"))
            if point is None:
                raise ValueError(f"episode {episode.id}: approval {index} is at no decision point of the Director "
                                 f"(message {entry.get('cut')})")
            pair = PreferencePair(
                prompt=[Message(**message) for message in point.prompt],
                chosen=[Message(role="assistant", content=_direction_json(played))],
                rejected=[Message(role="assistant", content=_direction_json(entry["proposed"]))],
                margin=1.0, context_id=point.context_id, persona="director", chosen_overall=1.0,
                rejected_overall=0.0,
                provenance={"source": "approval", "episode": episode.id, "round": entry.get("round"),
                            "decision": entry["decision"]},
            ).model_dump(mode="json")
            held_out = split_value(point.context_id, seed) < test_fraction
            (test if held_out else train).append(pair)
            (test_points if held_out else train_points).add(point.context_id)
    report = PairsReport(contexts=len(train_points | test_points), candidates=answers, failed_judgements=0,
                         pairs_kept=len(train) + len(test), dropped_by_margin=0, dropped_identical=0,
                         train_pairs=len(train), test_pairs=len(test), train_contexts=len(train_points),
                         test_contexts=len(test_points), min_margin=1.0)
    return PairSet(train=train, test=test, report=report)


def _played_after(approvals: Sequence[dict[str, Any]], index: int) -> dict[str, Any] | None:
    """The direction played at the same decision point after the rejection at ``index``."""
    cut = approvals[index].get("cut")
    for later in approvals[index + 1:]:
        if later.get("cut") != cut:
            return None
        if later.get("decision") in ("approved", "edited"):
            return later.get("played")
    return None


def _direction_json(direction: dict[str, Any]) -> str:
    return json.dumps({k: direction[k] for k in DIRECTION_FIELDS if direction.get(k) is not None})
