"""Safety that follows a conversation: the running risk adds up over messages and decays,
other people's words count little, a rule that fired ends after calm rounds, an app clears
or raises a rule through the state, and an app brings its own detector."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence

import pytest
from fakes import ScriptedChat
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from mascot.graphs import create_director_graph, risk
from mascot.graphs.embeddings import LexicalEmbedder
from mascot.graphs.moderation import ModeratedDetector, llama_guard_prompt, parse_llama_guard
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.safety_detector import SafetyDetector
from mascot.rosters import USER, Roster, SafetyRule

GARAGE = ["since the separation the house is so silent",
          "sat in the closed garage with the engine running last night, just thinking",
          "tonight feels right"]
NOVEL = ["the detective in the novel I'm reading wants to end it all",
         "the ending kept me up till 3am"]


def d(speaker: str, action: str = "speak", tone: str = "warm") -> str:
    return json.dumps({"speaker": speaker, "action": action, "tone": tone})


def rule(**extra: object) -> SafetyRule:
    return SafetyRule(name="self_harm", description="The person wants to end their life or hurt themselves.",
                      triggers=["I want to die", "I don't want to be here anymore", "I keep thinking about ending it"],
                      patterns=[r"\bkill myself\b"], route=["anchor"], forbidden=["catalyst", "beacon"], **extra)


def levels(messages: Sequence[str]) -> list[float]:
    level: dict[str, float] = {}
    out = []
    for text in messages:
        level = risk.update(level, text, {"self_harm": 0.0})
        out.append(level["self_harm"])
    return out


def test_screening_stages_add_up_over_messages_each_harmless_alone() -> None:
    assert [s.name for s in risk.stages(GARAGE[1])] == ["method"]
    assert [s.name for s in risk.stages(GARAGE[2])] == ["intent_time"]
    climbed = levels(GARAGE)
    assert climbed[0] == 0 and climbed[1] < risk.FIRE <= climbed[2]
    # each message alone stays under the level
    assert all(levels([text])[0] < risk.FIRE for text in GARAGE)


def test_other_peoples_words_and_a_past_that_is_over_count_little() -> None:
    assert risk.about_others(NOVEL[0]) and not risk.about_others(GARAGE[1])
    assert risk.about_others("two years ago I wanted to end it all, I'm doing so much better now")
    assert levels(NOVEL)[-1] < risk.RELEASE
    mine = levels(["I want to end it all"])[0]
    theirs = levels([NOVEL[0]])[0]
    assert theirs == pytest.approx(risk.OTHERS * mine)


def test_a_story_about_someone_else_does_not_fire_even_on_a_pattern() -> None:
    detector = SafetyDetector([rule().model_copy(update={"patterns": [r"\bend it all\b"]})], embedder=LexicalEmbedder())
    assert detector.detect("I want to end it all") is not None
    assert detector.detect(NOVEL[0]) is None


def test_nothing_resets_the_risk_but_calm_messages() -> None:
    level = risk.update({}, "x", {"self_harm": 0.0}, fired="self_harm")
    assert level["self_harm"] == risk.PEAK
    after = risk.update(level, "anyway, forget I said that. how was your weekend?", {"self_harm": 0.0})
    assert after["self_harm"] == pytest.approx(risk.DECAY * risk.PEAK)
    calm = risk.calm_messages()
    held = dict(level)
    for _ in range(calm - 1):
        held = risk.update(held, "ok", {"self_harm": 0.0})
    assert risk.in_force(held, "self_harm", was_in_force=True)
    held = risk.update(held, "ok", {"self_harm": 0.0})
    assert not risk.in_force(held, "self_harm", was_in_force=True)
    assert 3 <= calm <= 10  # several calm rounds, not one and not forever


def test_a_classifier_probability_counts_only_above_the_floor() -> None:
    assert risk.update({}, "hm", {"abuse": risk.FLOOR})["abuse"] == 0
    assert risk.update({}, "hm", {"abuse": risk.FLOOR + 0.5})["abuse"] == pytest.approx(0.5)
    # the stages feed only the rules they are about
    assert risk.update({}, GARAGE[1], {"abuse": 0.0, "self_harm": 0.0})["abuse"] == 0


def play(roster: Roster, rounds: list[str], director_replies: list[str], *, safety: object = None,
         updates: dict[int, dict] | None = None) -> dict:
    director = ScriptedChat(replies=director_replies)
    speakers = ScriptedChat(replies=[f"reply {i}" for i in range(40)])
    guard = safety or SafetyGuard(roster, detector=SafetyDetector(roster.safety, embedder=LexicalEmbedder()))
    graph = create_director_graph(roster, director=director, speakers=speakers, user=None, safety=guard,
                                  max_speakers_per_round=1).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for index, text in enumerate(rounds):
        if updates and index in updates:
            graph.update_state(config, updates[index])
        graph.invoke({"messages": [HumanMessage(text)]}, config)
    return graph.get_state(config).values


def test_the_graph_guards_risk_that_builds_and_keeps_it_in_its_state(roster: Roster) -> None:
    roster = roster.model_copy(update={"safety": [rule()]})
    state = play(roster, GARAGE, [d("catalyst"), d("catalyst"), d("catalyst")])
    assert [g["via"] for g in state["guards"]] == ["running"]
    assert state["guards"][0]["round"] == 2 and state["guards"][0]["risk"] >= risk.FIRE
    assert state["safety_risk"]["self_harm"] >= risk.FIRE
    assert [m.name for m in state["messages"] if isinstance(m, AIMessage)][-1] == "anchor"  # the route


def test_a_rule_ends_after_calm_rounds_and_an_app_can_clear_or_raise_it(roster: Roster) -> None:
    roster = roster.model_copy(update={"safety": [rule()]})
    calm = risk.calm_messages()
    rounds = ["I want to kill myself", *(["ok, thanks"] * (calm + 1))]
    state = play(roster, rounds, [d("catalyst")] * len(rounds))
    vias = [g["via"] for g in state["guards"]]
    assert vias[0] == "pattern" and set(vias[1:]) == {"persists"}
    assert 2 <= len(vias) <= calm + 1 < len(rounds)  # it ended before the conversation did
    assert [m.name for m in state["messages"] if isinstance(m, AIMessage)][-1] == "catalyst"
    # a moderator clears the rule after the first round: the next round is free
    cleared = play(roster, rounds[:3], [d("catalyst")] * 3, updates={1: {"safety_risk": {"self_harm": 0.0}}})
    assert [g["via"] for g in cleared["guards"]] == ["pattern"]
    # and raises it on a calm conversation: that round follows the route
    raised = play(roster, ["hello", "the weather is nice"], [d("catalyst")] * 2,
                  updates={1: {"safety_risk": {"self_harm": risk.PEAK}}})
    assert [g["via"] for g in raised["guards"]] == ["running"]


def test_an_apps_callable_decides_and_a_fault_leaves_the_built_in_detector(roster: Roster,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    roster = roster.model_copy(update={"safety": [rule()]})
    seen: list[list[str]] = []

    def moderator(said: Sequence[str]) -> str | None:
        seen.append(list(said))
        if said[-1] == "boom":
            raise RuntimeError("moderation service down")
        return "self_harm" if "blue" in said[-1] else None

    state = play(roster, ["hello", "I feel blue"], [d("catalyst"), d("catalyst")], safety=moderator)
    assert [g["via"] for g in state["guards"]] == ["app"] and seen[-1] == ["hello", "I feel blue"]
    detector = ModeratedDetector(roster.safety, moderator,
                                 fallback=SafetyDetector(roster.safety, embedder=LexicalEmbedder()))
    with caplog.at_level(logging.WARNING):
        assert detector.detect("boom") is None and detector.failures == 1  # the built-in detector: nothing
        found = detector.detect("boom I want to kill myself".removeprefix("boom "), ["boom"])
        assert found is None and detector.failures == 1  # the app decides, even against a pattern
    assert "moderation service down" in caplog.text and "built-in detector decides" in caplog.text
    with pytest.raises(ValueError, match="no safety rules"):
        create_director_graph(roster.model_copy(update={"safety": []}), director=ScriptedChat(replies=[]),
                              speakers=ScriptedChat(replies=[]), safety=moderator)


def test_a_chat_model_in_llama_guards_format(roster: Roster) -> None:
    roster = roster.model_copy(update={"safety": [rule()]})
    prompt = llama_guard_prompt(roster.safety, ["hi", "it's over tonight"])
    assert "S1: self_harm." in prompt and "User: it's over tonight" in prompt and "ONLY THE LAST User" in prompt
    assert parse_llama_guard("safe", roster.safety) is None
    assert parse_llama_guard("unsafe\nS1", roster.safety) == "self_harm"
    for bad in ("maybe", "unsafe\nS9", ""):
        with pytest.raises(ValueError):
            parse_llama_guard(bad, roster.safety)
    judge = ScriptedChat(replies=["safe", "unsafe\nS1", "I cannot answer that"])
    fallback = SafetyDetector(roster.safety, embedder=LexicalEmbedder())
    detector = ModeratedDetector(roster.safety, judge, fallback=fallback)
    assert detector.detect("hello") is None
    found = detector.detect("it's over tonight", ["hello"])
    assert found is not None and found.rule == "self_harm" and found.via == "app"
    assert detector.detect("I want to kill myself") is not None and detector.failures == 1  # the pattern decided
    assert "S1: self_harm" in judge.calls[1][0].text
    state = play(roster, ["hello", "it's over tonight"], [d("catalyst"), d("catalyst")],
                 safety=ScriptedChat(replies=["safe", "unsafe\nS1"]))
    assert [g["via"] for g in state["guards"]] == ["app"]
    assert [m.name for m in state["messages"] if isinstance(m, AIMessage)][-1] == "anchor"
    assert USER  # the roster's routes stay the guard's


def _grams(text: str, n: int = 6) -> set[tuple[str, ...]]:
    import re

    words = re.findall(r"[a-z0-9']+", text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


@pytest.mark.parametrize("roster_id", ["emotional_support", "workplace_meeting"])
def test_training_conversations_are_valid_and_share_no_six_words_with_a_labelled_set(roster_id: str) -> None:
    from mascot.graphs.safety_window import TRAIN_FILE, shipped_training_file, training_windows
    from mascot.rosters import load_roster
    from mascot.training.evaluation.safety import load_conversation_set, load_safety_set

    roster = load_roster(roster_id)
    path = shipped_training_file(roster_id)
    assert path is not None and path.name == TRAIN_FILE
    train = load_conversation_set(roster, path)  # the labelled sets' checks: rules, fires_at, ids
    kinds = [c.kind for c in train]
    assert kinds.count("building") >= 40 and kinds.count("hard_negative") >= 40
    labelled = [m for split in ("test", "dev") for c in load_conversation_set(roster, split=split) for m in c.messages]
    labelled += [m.text for split in ("test", "dev") for m in load_safety_set(roster, split=split)]
    held = set().union(*(_grams(text) for text in labelled))
    shared = [m for c in train for m in c.messages if _grams(m) & held]
    assert not shared, shared[:3]
    windows = training_windows(path)
    assert any(rule is None for _, rule in windows) and any(rule for _, rule in windows)
    # a building conversation's windows before fires_at are left out
    first = next(c for c in train if c.kind == "building" and c.fires_at)
    assert " ".join(first.messages[:1]) not in [text for text, _ in windows]


def test_a_second_opinion_is_asked_only_where_the_risk_is_unsure_and_a_bad_answer_changes_nothing(
        roster: Roster, caplog: pytest.LogCaptureFixture) -> None:
    from mascot.graphs.moderation import SecondOpinion, parse_second_opinion

    roster = roster.model_copy(update={"safety": [rule()]})
    assert parse_second_opinion('{"rule": "self_harm"}', roster.safety) == "self_harm"
    assert parse_second_opinion('```json\n{"rule": null}\n```', roster.safety) is None
    for bad in ('{"rule": "panic"}', "self_harm", '{"rule": null, "why": "x"}', "[]"):
        with pytest.raises(ValueError):
            parse_second_opinion(bad, roster.safety)

    def guard(replies: list[str]) -> tuple[SafetyGuard, SecondOpinion]:
        opinion = SecondOpinion(roster.safety, ScriptedChat(replies=replies))
        detector = SafetyDetector(roster.safety, embedder=LexicalEmbedder())
        return SafetyGuard(roster, detector=detector, second_opinion=opinion), opinion

    # a method alone: unsure (ASK <= risk < FIRE): asked, and the rule it names fires
    unsure = [HumanMessage(GARAGE[1])]
    assert risk.ASK <= levels([GARAGE[1]])[0] < risk.FIRE
    sure, opinion = guard(['{"rule": "self_harm"}'])
    record, level = sure.assess(unsure, [], 0, {})
    assert record is not None and record["via"] == "second_opinion" and level["self_harm"] == risk.PEAK
    assert opinion.calls == 1 and "closed garage" in opinion.model.calls[0][0].text
    # a calm message: not asked
    calm, opinion = guard(['{"rule": "self_harm"}'])
    assert calm.assess([HumanMessage("the weather is nice today")], [], 0, {})[0] is None and opinion.calls == 0
    # a malformed answer or a fault: the running risk's decision stands, logged
    broken, opinion = guard(["I think so, yes"])
    with caplog.at_level(logging.WARNING):
        assert broken.assess(unsure, [], 0, {})[0] is None
    assert opinion.failures == 1 and "second opinion failed" in caplog.text


def test_rosters_check_reports_a_users_roster_conversations_with_its_window(tmp_path, monkeypatch,
                                                                           capsys: pytest.CaptureFixture[str]) -> None:
    import shutil

    import yaml

    from mascot.cli import main
    from mascot.graphs import embeddings
    from mascot.rosters import roster_path

    monkeypatch.setenv("MASCOT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("MASCOT_ENCODER", "lexical")
    embeddings.default_embedder.cache_clear()
    folder = tmp_path / "my_support"
    shutil.copytree(roster_path("emotional_support").parent, folder)
    data = yaml.safe_load((folder / "roster.yaml").read_text())
    (folder / "roster.yaml").write_text(yaml.safe_dump({**data, "id": "my_support"}, sort_keys=False))
    assert main(["rosters", "check", str(folder), "--safety"]) == 0
    printed = capsys.readouterr().out
    assert "window classifier from safety_conversations_train.yaml" in printed
    assert "safety_conversations.yaml: " in printed and "conversations" in printed
    (folder / "safety_conversations_train.yaml").unlink()
    assert main(["rosters", "check", str(folder), "--safety"]) == 0
    assert "window classifier" not in capsys.readouterr().out
    embeddings.default_embedder.cache_clear()
