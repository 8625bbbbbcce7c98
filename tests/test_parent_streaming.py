"""The compiled director graph as a node of a parent graph: what the parent's stream delivers.

Measured on langgraph 1.2 and pinned here (README, "Use the graph in your app"):

- ``stream_mode="messages"`` without ``subgraphs=True``: one whole ``AIMessage`` per persona
  turn, with ``metadata["langgraph_node"]`` the parent's node name, after that node finished;
  no tokens.
- with ``subgraphs=True``: ``(namespace, (chunk, metadata))`` items whose namespace is
  ``("<parent node>:<task id>",)`` and whose ``langgraph_node`` is the inner node: the
  Director's JSON tokens under ``director``, each persona's tokens under its id, then the
  persona's cleaned ``AIMessage`` (the one stored in state, ``name=<persona id>``).
- ``user="human"``: without ``subgraphs=True`` nothing of the round reaches the parent
  before the interrupt, and the parent's state holds none of the round while it waits; the
  round is in the subgraph's state (``get_state(config, subgraphs=True)``). The interrupt's
  value is ``{"round", "roster"}``, not the round's messages.
"""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, AnyMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command

from mascot.graphs import create_director_graph
from mascot.rosters import USER, Roster

REPLIES = {"anchor": "I hear you, that really hurts", "catalyst": "What makes you sure it was your fault"}


class Parent(TypedDict):
    messages: Annotated[list[AnyMessage], add_messages]


def streaming_model(*texts: str) -> GenericFakeChatModel:
    """A chat model that streams each reply word by word."""
    return GenericFakeChatModel(messages=iter([AIMessage(text) for text in texts]))


def direction(speaker: str) -> str:
    return json.dumps({"speaker": speaker, "action": "speak", "tone": "warm"})


def parent_app(roster: Roster, *, user: str | None = None):
    """A parent graph whose node ``ensemble`` is the compiled director graph: anchor, then
    catalyst, then the turn returns to the person."""
    director = streaming_model(direction("anchor"), direction("catalyst"), direction(USER))
    speakers = {pid: streaming_model(REPLIES.get(pid, "unused")) for pid in roster.persona_ids}
    ensemble = create_director_graph(roster, director=director, speakers=speakers, user=user,
                                     max_rounds=2).compile()
    parent = StateGraph(Parent)
    parent.add_node("ensemble", ensemble)
    parent.add_edge(START, "ensemble")
    parent.add_edge("ensemble", END)
    return parent.compile(checkpointer=InMemorySaver())


def tokens_by_node(items: list[tuple[tuple[str, ...], tuple[Any, dict]]]) -> dict[str, str]:
    """The streamed token text per inner node, from ``subgraphs=True`` message items."""
    text: dict[str, str] = {}
    for _, (chunk, meta) in items:
        if isinstance(chunk, AIMessageChunk):
            text[meta["langgraph_node"]] = text.get(meta["langgraph_node"], "") + chunk.text
    return text


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_persona_tokens_reach_the_parent_with_subgraphs(roster: Roster, mode: str) -> None:
    app = parent_app(roster)
    config = {"configurable": {"thread_id": mode}}
    request = ({"messages": [HumanMessage("I failed my driving test again")]}, config)

    async def collect() -> list:
        return [item async for item in app.astream(*request, stream_mode="messages", subgraphs=True)]

    items = list(app.stream(*request, stream_mode="messages", subgraphs=True)) if mode == "sync" \
        else asyncio.run(collect())

    assert {ns for ns, _ in items} and all(len(ns) == 1 and ns[0].startswith("ensemble:") for ns, _ in items)
    chunks = [(meta["langgraph_node"], chunk.text) for _, (chunk, meta) in items if isinstance(chunk, AIMessageChunk)]
    assert sum(node == "anchor" for node, _ in chunks) >= 5  # tokens, not one piece
    streamed = tokens_by_node(items)
    assert {node: streamed[node] for node in REPLIES} == REPLIES
    assert json.loads(streamed["director"].split("}")[0] + "}")["speaker"] == "anchor"  # the Director's tokens too
    # after its tokens, each persona's cleaned message, as stored in state
    whole = [(meta["langgraph_node"], m.name, m.text) for _, (m, meta) in items
             if isinstance(m, AIMessage) and not isinstance(m, AIMessageChunk)]
    assert whole == [(pid, pid, text) for pid, text in REPLIES.items()]


def test_parent_gets_whole_messages_without_subgraphs(roster: Roster) -> None:
    app = parent_app(roster)
    items = list(app.stream({"messages": [HumanMessage("I failed again")]},
                            {"configurable": {"thread_id": "whole"}}, stream_mode="messages"))
    assert [(type(m).__name__, meta["langgraph_node"], m.name, m.text) for m, meta in items] == [
        ("AIMessage", "ensemble", pid, text) for pid, text in REPLIES.items()]


def test_human_round_reaches_the_parent_before_the_interrupt_with_subgraphs(roster: Roster) -> None:
    app = parent_app(roster, user="human")
    config = {"configurable": {"thread_id": "human-sub"}}
    events = []
    for ns, mode, chunk in app.stream({"messages": [HumanMessage("I failed again")]}, config,
                                      stream_mode=["messages", "updates"], subgraphs=True):
        if mode == "messages" and isinstance(chunk[0], AIMessageChunk):
            events.append(("token", chunk[1]["langgraph_node"]))
        elif mode == "updates":
            events.append(("update", next(iter(chunk)), ns[0].split(":")[0] if ns else "parent"))
    interrupt_at = events.index(("update", "__interrupt__", "ensemble"))
    before = events[:interrupt_at]
    assert ("token", "anchor") in before and ("token", "catalyst") in before
    updates = [e[1] for e in before if e[0] == "update"]
    assert updates == ["director", "anchor", "director", "catalyst", "director"]
    assert events[-1] == ("update", "__interrupt__", "parent")


def test_parent_reads_the_round_it_waits_on(roster: Roster) -> None:
    app = parent_app(roster, user="human")
    config = {"configurable": {"thread_id": "human"}}
    items = list(app.stream({"messages": [HumanMessage("I failed again")]}, config,
                            stream_mode=["messages", "updates"]))
    # nothing of the round reaches the parent before the interrupt ...
    assert [(mode, list(chunk)) for mode, chunk in items] == [("updates", ["__interrupt__"])]
    interrupt = items[0][1]["__interrupt__"][0]
    assert interrupt.value == {"round": 1, "roster": "emotional_support"}
    # ... and the parent's state holds none of it while it waits
    state = app.get_state(config)
    assert state.next == ("ensemble",) and [m.type for m in state.values["messages"]] == ["human"]
    # the round is in the subgraph's state
    waiting = app.get_state(config, subgraphs=True).tasks[0].state.values
    assert [(m.name, m.text) for m in waiting["messages"] if isinstance(m, AIMessage)] == list(REPLIES.items())
    assert [d["speaker"] for d in waiting["directions"]] == ["anchor", "catalyst", USER]
    # resuming ends the node (an empty answer ends the conversation); then the parent has it all
    app.invoke(Command(resume=""), config)
    names = [m.name for m in app.get_state(config).values["messages"] if isinstance(m, AIMessage)]
    assert names == list(REPLIES)
