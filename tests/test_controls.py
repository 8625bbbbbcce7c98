"""The app's controls over a round: what each voice sees, and approval before a voice speaks."""

from __future__ import annotations

import json

import pytest
from fakes import ScriptedChat
from langchain_core.messages import HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from mascot.graphs import create_director_graph
from mascot.graphs.direction import interpret_direction
from mascot.graphs.state import stage_directions
from mascot.rosters import USER
from mascot.training.episodes.episode import EpisodeSource, episode_from_state

FIRST = "Failing twice is rough, and the parking part is the easiest thing to drill."
SECOND = "A quick check: what did the examiner actually say went wrong?"


def d(speaker: str, action: str = "speak", tone: str = "warm", **extra: str) -> str:
    return json.dumps({"speaker": speaker, "action": action, "tone": tone, **extra})


def system_prompt(call: list) -> str:
    return call[0].text


def two_voices(roster, *, directions: list[str], replies: list[str], **options):
    director = ScriptedChat(replies=directions)
    speakers = ScriptedChat(replies=replies)
    graph = create_director_graph(roster, director=director, speakers=speakers, **options)
    return graph, director, speakers


# --- what each voice sees -------------------------------------------------------------------

@pytest.mark.parametrize("view, sees_first", [("conversation", True), ("round", True), ("person", False)])
def test_the_rosters_setting_decides_what_a_voice_sees_of_this_round(roster, view: str, sees_first: bool) -> None:
    graph, _, speakers = two_voices(roster.model_copy(update={"voices_see": view}),
                                    directions=[d("anchor"), d("catalyst"), d(USER)], replies=[FIRST, SECOND])
    graph.compile().invoke({"messages": [HumanMessage("I failed my driving test again")]})
    second = system_prompt(speakers.calls[1])
    assert (FIRST in second) is sees_first
    assert "driving test" in speakers.calls[1][-1].text  # the person's message, always
    assert ("You do not hear the other voices" in second) is (view == "person")


@pytest.mark.parametrize("sees, hidden", [(None, False), ("round", True), ("person", True)])
def test_a_direction_decides_what_its_voice_sees_of_earlier_rounds(roster, sees: str | None, hidden: bool) -> None:
    extra = {"sees": sees} if sees else {}
    graph, director, speakers = two_voices(roster, directions=[d("anchor"), d(USER), d("catalyst", **extra), d(USER)],
                                           replies=[FIRST, SECOND])
    app = graph.compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    app.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    state = app.invoke({"messages": [HumanMessage("It was the parking")]}, config)
    second = system_prompt(speakers.calls[1])
    assert (FIRST not in second) is hidden  # the anchor spoke in the earlier round
    assert "I failed my driving test again" in second  # the person's earlier message stays
    assert stage_directions(state)[-2].sees == sees


def test_an_unknown_view_is_repaired_and_recorded(roster) -> None:
    direction = interpret_direction(d("anchor", sees="everyone"), roster, recent_speakers=[], round_turns=0)
    assert direction.sees is None and "sees 'everyone' is not one of person, round, conversation" in direction.fallback
    assert interpret_direction(d("anchor", sees="Person"), roster, recent_speakers=[], round_turns=0).sees == "person"


def test_direction_text_never_reaches_the_person(roster) -> None:
    action = "Tell them that one failed test says nothing about how well they will drive in a year"
    copied = f"Honestly, {action.lower()}. You will get there."
    graph, _, _ = two_voices(roster, directions=[d("anchor", action), d(USER)], replies=[copied])
    state = graph.compile().invoke({"messages": [HumanMessage("I failed my driving test again")]})
    reply = state["messages"][-1]
    assert reply.name == "anchor" and "says nothing about how well" not in reply.text
    assert "You will get there" in reply.text
    assert reply.additional_kwargs["stage_direction"]["action"] == action  # metadata keeps it; the text does not
    assert any("repeated" in f["reason"] and "stage direction" in f["reason"] for f in state["fallbacks"])


# --- approval before a voice speaks -----------------------------------------------------------

def approving(roster, directions: list[str], replies: list[str]):
    graph, director, speakers = two_voices(roster, directions=directions, replies=replies, approve=True)
    app = graph.compile(checkpointer=InMemorySaver())
    return app, director, speakers, {"configurable": {"thread_id": "a"}}


def waiting(app, config) -> dict:
    return app.get_state(config).tasks[0].interrupts[0].value


def test_each_direction_waits_for_approval_and_an_approved_one_is_played(roster) -> None:
    app, _, speakers, config = approving(roster, [d("anchor", "Acknowledge it"), d(USER)], [FIRST])
    app.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    asked = waiting(app, config)
    assert asked["direction"]["speaker"] == "anchor" and asked["round"] == 0 and asked["roster"] == roster.id
    assert speakers.calls == []  # the voice has not spoken yet
    state = app.invoke(Command(resume="approve"), config)
    assert [m.name for m in state["messages"][1:]] == ["anchor"]
    assert state["approvals"] == [{"round": 0, "cut": 1, "decision": "approved", "proposed": asked["direction"],
                                   "played": asked["direction"]}]


def test_an_edited_direction_is_the_one_played_and_recorded(roster) -> None:
    app, _, speakers, config = approving(roster, [d("anchor", "Acknowledge it"), d(USER)], [SECOND])
    app.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    edit = {"speaker": "catalyst", "action": "Ask what went wrong", "tone": "curious"}
    state = app.invoke(Command(resume={"edit": edit}), config)
    reply = state["messages"][-1]
    assert reply.name == "catalyst" and reply.additional_kwargs["stage_direction"]["action"] == "Ask what went wrong"
    assert "Ask what went wrong" in system_prompt(speakers.calls[0])
    played = [x for x in state["directions"] if x["speaker"] != USER]
    assert [x["speaker"] for x in played] == ["catalyst"]  # the proposal was never played
    (entry,) = state["approvals"]
    assert entry["decision"] == "edited" and entry["proposed"]["speaker"] == "anchor"
    assert entry["played"]["speaker"] == "catalyst" and entry["played"]["tone"] == "curious"
    episode = episode_from_state(state, id="a", roster=roster.id,
                                 source=EpisodeSource(kind="rollout", seed=0, repeat=0))
    assert episode.approvals == state["approvals"]


def test_a_rejected_direction_sends_the_director_back(roster) -> None:
    app, director, _, config = approving(roster, [d("beacon"), d("anchor"), d(USER)], [FIRST])
    app.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    app.invoke(Command(resume="reject"), config)
    assert len(director.calls) == 2 and waiting(app, config)["direction"]["speaker"] == "anchor"
    state = app.invoke(Command(resume={"approve": True}), config)
    assert [m.name for m in state["messages"][1:]] == ["anchor"]
    assert [a["decision"] for a in state["approvals"]] == ["rejected", "approved"]
    assert state["approvals"][0]["proposed"]["speaker"] == "beacon" and "played" not in state["approvals"][0]


@pytest.mark.parametrize("answer, message", [
    ("maybe", "resume with 'approve', 'reject'"),
    ({"edit": {"speaker": "nobody"}}, "not a voice of emotional_support that may speak now"),
    ({"edit": {"fallback": "x"}}, "resume with 'approve', 'reject'"),
])
def test_a_bad_answer_is_asked_again_with_the_reason(roster, answer, message: str) -> None:
    app, _, speakers, config = approving(roster, [d("anchor"), d(USER)], [FIRST])
    app.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    app.invoke(Command(resume=answer), config)
    asked = waiting(app, config)
    assert asked["direction"]["speaker"] == "anchor" and message in asked["error"] and speakers.calls == []
    state = app.invoke(Command(resume="approve"), config)
    assert [m.name for m in state["messages"][1:]] == ["anchor"]


def test_edits_and_rejections_become_director_pairs(roster, tmp_path) -> None:
    from mascot.cli import main
    from mascot.training.data.pairs import read_pairs
    from mascot.training.jsonl import JsonlAppender

    app, _, _, config = approving(roster, [d("beacon", "Cheer them up"), d("anchor", "Acknowledge it"),
                                           d("catalyst", "Probe"), d(USER)], [FIRST, SECOND])
    app.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    app.invoke(Command(resume="reject"), config)  # beacon, rejected; the Director proposes anchor
    app.invoke(Command(resume="approve"), config)  # anchor played
    state = app.invoke(Command(resume={"edit": {"action": "Ask what the examiner said"}}), config)  # catalyst, edited
    assert [a["decision"] for a in state["approvals"]] == ["rejected", "approved", "edited"]
    episode = episode_from_state(state, id="e1", roster=roster.id,
                                 source=EpisodeSource(kind="rollout", seed=0, repeat=0))
    with JsonlAppender(tmp_path / "episodes.jsonl") as appender:
        appender.write(episode.model_dump(mode="json"))
    assert main(["pairs", "--approvals", str(tmp_path / "episodes.jsonl"), "--roster", roster.id,
                 "--test-fraction", "0", "--out", str(tmp_path / "pairs")]) == 0
    pairs = read_pairs(tmp_path / "pairs" / "train.jsonl")
    assert len(pairs) == 2
    rejected, edited = sorted(pairs, key=lambda p: p["provenance"]["decision"], reverse=True)
    assert json.loads(rejected["rejected"][0]["content"])["speaker"] == "beacon"
    assert json.loads(rejected["chosen"][0]["content"])["speaker"] == "anchor"
    assert json.loads(edited["chosen"][0]["content"])["action"] == "Ask what the examiner said"
    assert json.loads(edited["rejected"][0]["content"])["action"] == "Probe"
    assert "I failed my driving test again" in edited["prompt"][-1]["content"]  # the Director's prompt there
    assert "[anchor]" in edited["prompt"][-1]["content"] or "Anchor" in edited["prompt"][-1]["content"]
    assert main(["pairs", "--approvals", str(tmp_path / "episodes.jsonl"), "--out", str(tmp_path / "p2")]) == 2
