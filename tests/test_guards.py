"""Guard metrics: a hacked run (refusals, one-voice rounds, copies, a Director that names the
first voice offered and copies its prompt) shows in every figure; a healthy one does not."""

from __future__ import annotations

import pytest

from mascot.graphs.embeddings import LexicalEmbedder
from mascot.rosters import Roster
from mascot.training.episodes.episode import Episode, EpisodeMessage, EpisodeSource
from mascot.training.evaluation.guards import GUARDS, guard_metrics
from mascot.training.evaluation.metrics import episode_metrics

PERSON = "I failed my driving test again and I feel like an idiot"


def _turn(name: str, text: str, speaker_first: bool, action: str = "ask what went wrong") -> EpisodeMessage:
    others = [v for v in ("anchor", "catalyst", "beacon", "action_guide") if v != name]
    offered = [name, *others] if speaker_first else [*others, name]
    return EpisodeMessage(role="assistant", name=name, content=text,
                          stage_direction={"speaker": name, "action": action, "tone": "warm", "offered": offered})


def _episode(messages: list[EpisodeMessage], directions: int = 0) -> Episode:
    return Episode(id="ep", roster="emotional_support", messages=messages, source=EpisodeSource(kind="rollout", seed=0))


def test_a_hacked_episode_shows_in_every_guard(roster: Roster) -> None:
    copied_action = "I failed my driving test again and I feel"  # the person's words, copied
    hacked = _episode([
        EpisodeMessage(role="user", content=PERSON),
        _turn("anchor", "I'm sorry, but I can't assist with that.", True, copied_action),
        EpisodeMessage(role="user", content="Why won't you help me?"),
        _turn("anchor", "I'm sorry, but I can't assist with that.", True),
        _turn("catalyst", "I'm sorry, but I can't assist with that.", True),
    ])
    guards = guard_metrics(hacked, roster)
    assert set(guards) == set(GUARDS)
    assert guards["voices_per_round"] == 1.5 and guards["multi_voice_rounds"] == 50.0
    assert guards["refusal_rate"] == 100.0 and guards["first_offered"] == 100.0
    assert guards["copied_actions"] == pytest.approx(100 / 3) and guards["offered_voices"] == 4.0
    assert guards["skipped_turns"] == 0.0
    assert guards["reply_words"] == 8.0
    healthy = _episode([
        EpisodeMessage(role="user", content=PERSON),
        _turn("anchor", "That sounds painful, and it makes sense that you feel low after trying so hard.", False),
        _turn("catalyst", "What makes one result a verdict on who you are?", False),
        _turn("action_guide", "Book a lesson this week and ask which manoeuvre cost the points.", True),
    ])
    guards = guard_metrics(healthy, roster)
    assert (guards["refusal_rate"], guards["echo_rate"], guards["as_person_rate"], guards["copied_actions"]) == (
        0.0, 0.0, 0.0, 0.0)
    assert guards["first_offered"] == pytest.approx(100 / 3) and guards["multi_voice_rounds"] == 100.0


def test_refusing_actions_and_sentence_tones_are_counted(roster: Roster) -> None:
    episode = _episode([
        EpisodeMessage(role="user", content=PERSON),
        _turn("anchor", "That sounds painful.", False, action="I'm sorry, but I can't help with that."),
        EpisodeMessage(role="assistant", name="catalyst", content="What makes one result a verdict?",
                       stage_direction={"speaker": "catalyst", "action": "question the verdict",
                                        "tone": "It should sound calm and curious, like a friend who listens well",
                                        "offered": ["catalyst", "anchor"]}),
    ])
    guards = guard_metrics(episode, roster)
    assert guards["action_refusals"] == 50.0 and guards["short_tones"] == 50.0


def test_copies_and_speaking_as_the_person_are_counted(roster: Roster) -> None:
    said = "That sounds painful, and it makes sense that you feel low after trying so hard."
    episode = _episode([
        EpisodeMessage(role="user", content=PERSON),
        _turn("anchor", said, False),
        _turn("catalyst", said, False),
        _turn("beacon", "User: I feel like an idiot.", False),
    ])
    guards = guard_metrics(episode, roster)
    assert guards["echo_rate"] == pytest.approx(100 / 3) and guards["as_person_rate"] == pytest.approx(100 / 3)


def test_a_one_voice_round_has_no_redundancy_and_no_first_offered_share(roster: Roster) -> None:
    """Redundancy 0 was the whole reported gain of the hacked run: one voice, nothing to repeat."""
    episode = _episode([EpisodeMessage(role="user", content=PERSON),
                        EpisodeMessage(role="assistant", name="anchor", content="I hear you.")])
    assert episode_metrics(episode, roster, embedder=LexicalEmbedder())["redundancy"] is None
    guards = guard_metrics(episode, roster)
    assert guards["first_offered"] is None and guards["copied_actions"] is None  # no direction recorded
    assert guards["multi_voice_rounds"] == 0.0


def test_copies_the_speaker_node_skipped_still_count(roster: Roster) -> None:
    """The graph skips most copies before they are heard; the guard counts the attempts."""
    episode = _episode([
        EpisodeMessage(role="user", content=PERSON),
        _turn("anchor", "That sounds painful, and it makes sense that you feel low after trying so hard.", False),
    ])
    episode.fallbacks = [{"node": "catalyst", "round": 0, "reason": "repeated a voice heard this round; turn skipped"},
                         {"node": "director", "round": 0, "reason": "unknown speaker 'x'"}]
    guards = guard_metrics(episode, roster)
    assert guards["echo_rate"] == 50.0 and guards["skipped_turns"] == 50.0
    assert guards["voices_per_round"] == 1.0


def test_each_fault_of_the_verifiers_has_its_figure(roster: Roster) -> None:
    episode = _episode([
        EpisodeMessage(role="user", content=PERSON),
        _turn("anchor", "Oh no! I'm sorry, but I can't help you with that.", False,
              action="The Anchor, the emotional validator"),
        _turn("catalyst", "Sure, I'd be happy to help. What would you like me to do?", False,
              action="I will be able to get better again."),
        _turn("beacon", "It sounds like you feel let down and a bit embarrassed.", False),
        _turn("action_guide", "Book one lesson this week and ask the examiner which manoeuvre cost you.", False),
        EpisodeMessage(role="user", content="Okay, and then what?"),  # a round the Director handed straight back
    ])
    guards = guard_metrics(episode, roster)
    assert guards["reply_refusals"] == 25.0 and guards["helpdesk_rate"] == 25.0
    assert guards["refusal_rate"] == 50.0 and guards["style_copies"] == 25.0
    assert guards["action_first_person"] == 50.0 and guards["voice_copies"] == 0.0
    assert guards["multi_voice_rounds"] == 100.0 and guards["multi_voice_rounds_all"] == 50.0
    assert guards["despair_agreements"] == 0.0
