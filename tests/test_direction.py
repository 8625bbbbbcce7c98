from __future__ import annotations

import pytest

from mascot.graphs import StageDirection, interpret_direction
from mascot.graphs.direction import FALLBACK_ACTION
from mascot.rosters import USER

GOOD = '{"speaker": "catalyst", "action": "question the word again", "tone": "curious"}'


@pytest.mark.parametrize(
    ("output", "speaker", "fallback"),
    [
        (GOOD, "catalyst", None),
        ({"speaker": "beacon", "action": "reframe", "tone": "warm"}, "beacon", None),
        ("```json\n" + GOOD + "\n```", "catalyst", "repaired: extracted JSON from surrounding text"),
        ("Sure! Here is my choice: " + GOOD + " Hope that helps.", "catalyst", "repaired: extracted JSON"),
        ("<think>the anchor first?</think>" + GOOD, "catalyst", None),
        ('{"speaker": "The Catalyst", "action": "probe", "tone": "calm"}', "catalyst", "read as 'catalyst'"),
        ('{"speaker": "practical advisor", "action": "plan", "tone": "calm"}', "action_guide",
         "read as 'action_guide'"),
        ('{"Speaker": "beacon", "Action": "hope", "Tone": "bright"}', "beacon", None),
        ('{"speaker": "beacon"}', "beacon", "missing action; missing tone"),
        ('{"speaker": "beacon", "action": "hope\x0b", "tone": "warm"}', "beacon", None),  # raw control character
        ('{"speaker": "socrates", "action": "x", "tone": "y"}', "anchor", "unknown speaker 'socrates'"),
        ('{"speaker": 3, "action": "x", "tone": "y"}', "anchor", "no speaker named"),
        ("not json at all", "anchor", "reply is not JSON"),
        ("", "anchor", "empty reply"),
        ("[1, 2]", "anchor", "JSON is a list, not an object"),
        ('{"speaker": "catalyst", "action": "x"', "anchor", "reply is not JSON"),
        ('{"speaker": "user", "action": "ask her", "tone": "warm"}', "anchor", "handed back before a persona spoke"),
    ],
)
def test_interpret_direction_table(roster, output, speaker: str, fallback: str | None) -> None:
    direction = interpret_direction(output, roster, recent_speakers=[], round_turns=0)
    assert isinstance(direction, StageDirection)
    assert direction.speaker == speaker
    if fallback is None:
        assert direction.fallback is None
    else:
        assert direction.fallback is not None and fallback in direction.fallback


def test_hand_back_allowed_after_a_persona_spoke(roster) -> None:
    direction = interpret_direction('{"speaker": "User", "action": "ask", "tone": "warm"}', roster,
                                    recent_speakers=["anchor"], round_turns=1)
    assert direction.speaker == USER


def test_fallback_is_least_recently_heard(roster) -> None:
    direction = interpret_direction("??", roster, recent_speakers=["anchor", "catalyst", "beacon",
                                                                   "action_guide", "anchor", "beacon"],
                                    round_turns=1)
    assert direction.speaker == "catalyst"
    assert direction.action == FALLBACK_ACTION


def test_fallback_field_is_not_in_the_model_schema() -> None:
    from mascot.graphs import DIRECTION_SCHEMA

    assert set(DIRECTION_SCHEMA["properties"]) == {"speaker", "action", "tone", "addressee", "rationale"}
    assert set(DIRECTION_SCHEMA["required"]) == {"speaker", "action", "tone"}
