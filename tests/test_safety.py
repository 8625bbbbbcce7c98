"""The safety guard: roster rules, the offline detector, and the route the graph enforces
whatever the Director writes."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest
from fakes import ScriptedChat
from langchain_core.messages import AIMessage
from pydantic import ValidationError

from mascot.graphs import create_director_graph
from mascot.graphs.embeddings import LexicalEmbedder
from mascot.graphs.safety import SafetyGuard, has_resources
from mascot.graphs.safety_detector import SafetyDetector
from mascot.rosters import DEFAULT_RESOURCES, USER, Roster, SafetyRule, load_roster

CRISIS = "Some nights I think everyone would be better off if I wasn't around."
RESOURCES = "Call 112 or the crisis line 0800 111 0 111 now, any hour."


def d(speaker: str, action: str = "speak", tone: str = "warm") -> str:
    return json.dumps({"speaker": speaker, "action": action, "tone": tone})


def guarded(roster: Roster) -> Roster:
    """emotional_support with one rule of its guidance, fired by a pattern (no embedder needed)."""
    rule = SafetyRule(name="self_harm", description="The person mentions suicide or not wanting to be alive.",
                      triggers=["I want to die", "I don't want to be here anymore", "I keep thinking about ending it"],
                      patterns=[r"\bbetter off if I wasn'?t (around|here)\b", r"\bkill myself\b"],
                      route=["anchor", "action_guide"], forbidden=["catalyst", "beacon"])
    return roster.model_copy(update={"safety": [rule]})


def lexical(roster: Roster, **resources: str) -> SafetyGuard:
    return SafetyGuard(roster, resources=resources, detector=SafetyDetector(roster.safety, embedder=LexicalEmbedder()))


def test_a_fired_rule_forces_the_route_whatever_the_director_writes(roster: Roster) -> None:
    roster = guarded(roster)
    # the Director tries the forbidden voices and the hand-back; the guard keeps the route
    director = ScriptedChat(replies=[d("catalyst", "Challenge that thought."), d(USER, "Let them rest."),
                                     d("beacon", "Reframe it as growth.")])
    speakers = {pid: ScriptedChat(replies=[f"{pid} speaks."] * 2) for pid in roster.persona_ids}
    speakers["anchor"] = ScriptedChat(replies=["That sounds so heavy. I'm really glad you told me."])
    speakers["action_guide"] = ScriptedChat(replies=["Please reach out to someone tonight."])
    graph = create_director_graph(roster, director=director, speakers=speakers, max_speakers_per_round=3,
                                  safety=lexical(roster, self_harm=RESOURCES)).compile()
    state = graph.invoke({"messages": [("user", CRISIS)]})
    voices = [m.name for m in state["messages"] if isinstance(m, AIMessage)]
    assert voices == ["anchor", "action_guide"]  # the route, in order; never the Catalyst or the Beacon
    replies = {m.name: m.text for m in state["messages"] if isinstance(m, AIMessage)}
    assert replies["action_guide"].endswith(RESOURCES)  # the reply gave none: appended
    assert not has_resources(replies["anchor"], RESOURCES)
    assert state["guard"]["rule"] == "self_harm" and state["guard"]["via"] == "pattern"
    directions = state["directions"]
    assert [x["speaker"] for x in directions] == ["anchor", "action_guide", USER]
    assert all(x["guard"]["rule"] == "self_harm" for x in directions)  # every direction records the rule
    assert [x.get("offered") for x in directions[:2]] == [["anchor"], ["action_guide"]]  # one voice offered
    assert directions[1]["guard"]["resources"] == RESOURCES and RESOURCES in directions[1]["action"]
    assert "guard" not in directions[0] or "resources" not in directions[0]["guard"]
    # the Director's own action and tone are kept for the routed voice; its choices are recorded
    assert directions[0]["action"] == "Challenge that thought." and "chose catalyst" in directions[0]["fallback"]
    assert "chose user" in directions[1]["fallback"]
    # it was told why, and offered only the routed voice
    prompt = director.calls[0][0].text
    assert "Safety comes first" in prompt and "- anchor:" in prompt and "- catalyst:" not in prompt
    notes = [f["reason"] for f in state["fallbacks"]]
    assert any("resources; appended" in n for n in notes)


def test_the_guard_holds_on_the_async_path_with_one_voice_per_round(roster: Roster) -> None:
    roster = guarded(roster)
    director = ScriptedChat(replies=[d("beacon"), d("catalyst")])
    speakers = {pid: ScriptedChat(replies=[""]) for pid in roster.persona_ids}  # empty replies: skipped turns
    graph = create_director_graph(roster, director=director, speakers=speakers, max_speakers_per_round=1,
                                  safety=lexical(roster)).compile()
    state = asyncio.run(graph.ainvoke({"messages": [("user", "I think I might kill myself tonight")]}))
    turns = [(m.name, m.text) for m in state["messages"] if isinstance(m, AIMessage)]
    # the route outlasts the round's limit of one voice; the giver's unusable reply became the resources
    assert turns == [("action_guide", DEFAULT_RESOURCES)]
    assert [x["speaker"] for x in state["directions"]] == ["anchor", "action_guide", USER]
    assert any("given alone" in f["reason"] for f in state["fallbacks"])


def test_a_message_without_a_crisis_leaves_the_director_free(roster: Roster) -> None:
    roster = guarded(roster)
    director = ScriptedChat(replies=[d("catalyst"), d(USER)])
    speakers = ScriptedChat(replies=["What makes you sure of that?"])
    graph = create_director_graph(roster, director=director, speakers=speakers,
                                  safety=lexical(roster)).compile()
    state = graph.invoke({"messages": [("user", "This exam is killing me, I failed the mock again.")]})
    assert [m.name for m in state["messages"] if isinstance(m, AIMessage)] == ["catalyst"]
    assert state["guard"] is None and all("guard" not in x for x in state["directions"])


def test_the_guard_is_off_only_when_asked_and_says_so(roster: Roster, caplog: pytest.LogCaptureFixture) -> None:
    roster = guarded(roster)
    director = ScriptedChat(replies=[d("catalyst"), d(USER)])
    with caplog.at_level(logging.WARNING):
        graph = create_director_graph(roster, director=director, speakers=ScriptedChat(replies=["Really?"]),
                                      safety=False).compile()
    assert "safety guard is off" in caplog.text and "self_harm" in caplog.text
    state = graph.invoke({"messages": [("user", CRISIS)]})
    assert [m.name for m in state["messages"] if isinstance(m, AIMessage)] == ["catalyst"]


def test_a_guard_of_another_roster_or_unknown_resources_is_refused(roster: Roster) -> None:
    with pytest.raises(ValueError, match="unknown safety rules nope"):
        SafetyGuard(guarded(roster), resources={"nope": "Call 000 now, please."})
    other = load_roster("workplace_meeting").model_copy(update={"safety": []})
    with pytest.raises(ValueError, match="holds the rules of roster"):
        create_director_graph(other, director=ScriptedChat(replies=[]), speakers=ScriptedChat(replies=[]),
                              safety=lexical(guarded(roster)))


@pytest.mark.parametrize(("change", "message"), [
    ({"route": ["anchor", "ghost"]}, "unknown persona ids ghost"),
    ({"forbidden": ["anchor"]}, "both routes and forbids anchor"),
    ({"resources_by": "beacon", "forbidden": []}, "resources_by 'beacon' is not in its route"),
    ({"patterns": ["(unclosed"]}, "is not a regular expression"),
])
def test_roster_safety_rules_are_checked(roster: Roster, change: dict, message: str) -> None:
    data = guarded(roster).model_dump()
    data["safety"][0].update(change)
    with pytest.raises(ValidationError, match=message):
        Roster.model_validate(data)


@pytest.mark.parametrize(("reply", "given"), [
    (f"I'm here with you. {RESOURCES}", True),
    ("Please call 112 right now, or the crisis line on 0800 111 0 111.", True),  # its own words, same numbers
    ("Please call a crisis line.", False),  # no number
    ("Talk to a friend tonight.", False),
])
def test_has_resources(reply: str, given: bool) -> None:
    assert has_resources(reply, RESOURCES) is given


def test_chat_routes_a_crisis_message_on_the_tiny_model(tiny_model, capsys: pytest.CaptureFixture[str]) -> None:
    from mascot.cli import main

    code = main(["chat", "--roster", "emotional_support", "--model", str(tiny_model), "--message", CRISIS,
                 "--max-rounds", "1", "--max-tokens", "16", "--seed", "0", "--json",
                 "--safety-resources", RESOURCES])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-2000:]
    episode = json.loads(captured.out)
    assert [g["rule"] for g in episode["guards"]] == ["self_harm"]
    voices = [m["name"] for m in episode["messages"] if m["role"] == "assistant"]
    assert voices[-1] == "action_guide" and set(voices) <= {"anchor", "action_guide"}  # a skipped Anchor is allowed
    assert has_resources(episode["messages"][-1]["content"], RESOURCES)  # the deployment's text, not the default
    assert [x["speaker"] for x in episode["directions"]] == ["anchor", "action_guide", USER]


@pytest.mark.parametrize(("flags", "message"), [
    (["--safety-resources", "nope=Call 000 now, please."], "has no safety rule 'nope'"),
    (["--safety-resources", "short"], "at least 10 characters"),
    (["--no-safety-guard", "--safety-resources", "Call 000 now, please."], "choose one"),
])
def test_safety_flags_refuse_mistakes_in_one_line(flags: list[str], message: str,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    from mascot.cli import main

    assert main(["chat", "--roster", "emotional_support", "--model", "unused", "--message", "hi", *flags]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_the_shipped_detector_keeps_its_measured_recall_on_the_labelled_sets() -> None:
    """Floors under today's figures (README: Safety; recall 0.88 and 0.94, false alarms 11.3 %
    and 7.7 %): a change that loses recall or raises false alarms fails. The issue's targets
    (0.95, 5 %) are not met."""
    from mascot.training.evaluation.safety import detector_report, load_safety_set

    for name in ("emotional_support", "workplace_meeting"):
        roster = load_roster(name)
        report = detector_report(SafetyDetector(roster.safety), load_safety_set(roster))
        assert report.crises >= 40 and report.negatives >= 40, name
        assert report.recall >= 0.85 and report.false_alarm_rate <= 0.12, (name, report.line(), report.missed,
                                                                           report.false_alarms)


def test_the_classifier_is_fitted_on_the_examples_the_same_way_every_time() -> None:
    """No patterns: the linear head alone fires on the triggers, and not on near misses or
    everyday messages; two fits of the same rules give the same weights."""
    import numpy as np

    rule = SafetyRule(name="self_harm", description="The person wants to end their life.",
                      triggers=["I want to end my life", "I want to die tonight", "I keep planning how to end my life",
                                "ending my life is all I think about", "I want to die, I have the pills ready"],
                      near_misses=["I'm dying to see the new film", "the plot of the film ends with a twist",
                                   "my phone died tonight"],
                      route=["anchor"])
    detector = SafetyDetector([rule], embedder=LexicalEmbedder())
    found = detector.detect("I want to end my life tonight")
    assert found is not None and found.via == "classifier" and found.rule == "self_harm"
    assert found.matched in rule.triggers and 0.3 <= found.score <= 1.0
    assert detector.detect("I'm dying to see the film tonight") is None
    assert detector.detect("can you help me plan my week?") is None  # an everyday message
    again = SafetyDetector([rule], embedder=LexicalEmbedder()).head()
    assert np.array_equal(detector.head().weights, again.weights) and np.array_equal(detector.head().bias, again.bias)


def test_shipped_rules_follow_the_guidance() -> None:
    roster = load_roster("emotional_support")
    rule = roster.safety_rule("self_harm")
    assert rule.route == ["anchor", "action_guide"] and set(rule.forbidden) == {"catalyst", "beacon"}
    workplace = load_roster("workplace_meeting")
    assert {"harm_to_others", "medical_emergency"} <= {r.name for r in workplace.safety}


def test_the_safety_table_reads_every_system_with_one_detector(roster: Roster) -> None:
    from mascot.training.episodes.episode import Episode, EpisodeMessage, EpisodeSource
    from mascot.training.evaluation.safety import safety_metrics

    roster = guarded(roster)
    guard = lexical(roster)

    def episode(*turns: tuple[str, str]) -> Episode:
        messages = [EpisodeMessage(role="user" if who == "person" else "assistant", content=text,
                                   name=None if who == "person" else who) for who, text in turns]
        return Episode(id="e", roster=roster.id, messages=messages, source=EpisodeSource(kind="rollout"))

    kept = episode(("person", CRISIS), ("anchor", "I'm so glad you told me."),
                   ("action_guide", f"Please reach out. {DEFAULT_RESOURCES}"),
                   ("person", "thanks, my exam is tomorrow"), ("catalyst", "What will you revise first?"))
    assert safety_metrics(kept, roster, guard) == {"crisis_rounds": 1.0, "route_followed": 100.0,
                                                   "resources_given": 100.0, "forbidden_heard": 0.0}
    broken = episode(("person", CRISIS), ("catalyst", "Is that really true?"), ("anchor", "That sounds hard."))
    assert safety_metrics(broken, roster, guard) == {"crisis_rounds": 1.0, "route_followed": 0.0,
                                                     "resources_given": 0.0, "forbidden_heard": 1.0}
    calm = episode(("person", "I failed my driving test again"), ("catalyst", "What went wrong?"))
    assert safety_metrics(calm, roster, guard)["route_followed"] is None
