"""OpenTelemetry spans of the real compiled director graph, recorded in memory: the tree reads
as the conversation (conversation -> round -> direction / voice turn -> chat), each direction
names the voice that speaks next, token counts land on the model calls, and no words of the
person or the voices leave the process unless ``record_content=True``."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import Iterator, Sequence

import pytest
from fakes import PromptChat, ScriptedChat
from langchain_core.messages import HumanMessage
from langgraph.graph import START, StateGraph
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from mascot.graphs import DirectorState, OpenTelemetryTracer, create_director_graph
from mascot.rosters import Roster, load_scenarios

PERSON = "I failed my driving test again"


def direction(speaker: str) -> str:
    return json.dumps({"speaker": speaker, "action": f"ACTION-{speaker}", "tone": f"TONE-{speaker}"})


def voices() -> PromptChat:
    """Replies that name the turn (``VOICE-REPLY-n``) and report token usage."""
    return PromptChat(reply=lambda prompt: f"VOICE-REPLY-{len(prompt) % 97} about it")


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> Iterator[TracerProvider]:
    provider = TracerProvider()  # local: the global provider stays untouched
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider
    provider.shutdown()


class Tree:
    """The finished spans, with their children in start order."""

    def __init__(self, spans: Sequence[ReadableSpan]) -> None:
        self.spans = sorted(spans, key=lambda s: s.start_time or 0)
        self.by_id = {s.context.span_id: s for s in self.spans}
        assert len(self.by_id) == len(self.spans)

    def children(self, span: ReadableSpan) -> list[ReadableSpan]:
        return [s for s in self.spans if s.parent is not None and s.parent.span_id == span.context.span_id]

    def named(self, name: str) -> list[ReadableSpan]:
        return [s for s in self.spans if s.name == name]

    def roots(self) -> list[ReadableSpan]:
        return [s for s in self.spans if s.parent is None or s.parent.span_id not in self.by_id]

    def outline(self, span: ReadableSpan) -> list[object]:
        """``[name, [children's outlines]]``, leaves as bare names."""
        kids = self.children(span)
        return [span.name, [self.outline(k) for k in kids]] if kids else [span.name]  # type: ignore[list-item]


def one_round_graph(roster: Roster, director_replies: list[str], speakers: PromptChat | None = None):
    director = ScriptedChat(replies=list(director_replies))
    return create_director_graph(roster, director=director, speakers=speakers or voices(), safety=False).compile()


ROUND = ["mascot.round", [
    ["invoke_agent director", [["chat"]]],
    ["invoke_agent anchor", [["chat"]]],
    ["invoke_agent director", [["chat"]]],
    ["invoke_agent user"],
]]


def test_spans_nest_as_the_conversation(roster: Roster, provider: TracerProvider,
                                        exporter: InMemorySpanExporter) -> None:
    graph = one_round_graph(roster, [direction("anchor"), direction("user")])
    graph.invoke({"messages": [HumanMessage(PERSON)]},
                 {"callbacks": [OpenTelemetryTracer(provider, roster=roster.id)],
                  "configurable": {"thread_id": "alice"}})
    tree = Tree(exporter.get_finished_spans())
    [root] = tree.roots()
    assert tree.outline(root) == ["mascot.conversation", [ROUND]]
    assert root.attributes["gen_ai.conversation.id"] == "alice"
    assert root.attributes["mascot.roster"] == "emotional_support" and root.attributes["mascot.rounds"] == 1
    assert len({s.context.trace_id for s in tree.spans}) == 1
    [round_span] = tree.named("mascot.round")
    assert round_span.attributes["mascot.round"] == 0 and round_span.attributes["mascot.roster"] == "emotional_support"

    first, turn, second, back = tree.children(round_span)
    for span in (first, second):
        assert span.attributes["gen_ai.operation.name"] == "invoke_agent"
        assert span.attributes["gen_ai.agent.name"] == "director"
        assert span.attributes["mascot.direction.fallback"] is False
    assert first.attributes["mascot.direction.speaker"] == first.attributes["mascot.handoff.to"] == "anchor"
    assert turn.attributes["gen_ai.agent.name"] == "anchor" and turn.attributes["mascot.handoff.from"] == "director"
    assert second.attributes["mascot.handoff.to"] == "user" == back.attributes["gen_ai.agent.name"]

    [voice_chat] = tree.children(turn)
    assert voice_chat.attributes["gen_ai.operation.name"] == "chat"
    assert voice_chat.attributes["gen_ai.response.model"] == "prompt-fake"
    assert voice_chat.attributes["gen_ai.usage.input_tokens"] > 100  # the persona prompt's words
    assert voice_chat.attributes["gen_ai.usage.output_tokens"] == 3  # "VOICE-REPLY-n about it"
    [director_chat] = tree.children(first)
    assert "gen_ai.usage.input_tokens" not in director_chat.attributes  # the scripted model reports none


def test_a_repaired_direction_is_marked_as_a_fallback(roster: Roster, provider: TracerProvider,
                                                      exporter: InMemorySpanExporter) -> None:
    graph = one_round_graph(roster, ["not a direction at all", direction("user")])
    graph.invoke({"messages": [HumanMessage(PERSON)]}, {"callbacks": [OpenTelemetryTracer(provider)]})
    tree = Tree(exporter.get_finished_spans())
    first = tree.named("invoke_agent director")[0]
    assert first.attributes["mascot.direction.fallback"] is True
    [turn] = [s for s in tree.spans if s.name.startswith("invoke_agent") and s.name not in (
        "invoke_agent director", "invoke_agent user")]
    assert turn.attributes["gen_ai.agent.name"] == first.attributes["mascot.handoff.to"]
    assert "mascot.roster" not in tree.named("mascot.round")[0].attributes  # no roster given, none claimed


def test_model_parameters_and_failures_land_on_the_chat_span(roster: Roster, provider: TracerProvider,
                                                             exporter: InMemorySpanExporter) -> None:
    class Refused(RuntimeError):
        pass

    class Hosted(PromptChat):
        """A model that names itself and its sampling parameters, as provider models do."""

        def _get_ls_params(self, stop: list[str] | None = None, **kwargs: object) -> dict[str, object]:
            return {**super()._get_ls_params(stop=stop, **kwargs), "ls_model_name": "voice-7b",
                    "ls_temperature": 0.7, "ls_max_tokens": 256}

    failing = Hosted(reply=lambda p: "never", fail=lambda p: Refused(f"cannot answer {PERSON}"))
    graph = one_round_graph(roster, [direction("anchor")], speakers=failing)
    with pytest.raises(Refused):
        graph.invoke({"messages": [HumanMessage(PERSON)]}, {"callbacks": [OpenTelemetryTracer(provider)]})
    tree = Tree(exporter.get_finished_spans())
    [turn] = tree.named("invoke_agent anchor")
    [chat] = tree.children(turn)
    assert chat.name == "chat voice-7b" and chat.attributes["gen_ai.request.model"] == "voice-7b"
    assert chat.attributes["gen_ai.request.temperature"] == 0.7
    assert chat.attributes["gen_ai.request.max_tokens"] == 256
    for span in (chat, turn, tree.roots()[0]):
        assert span.status.status_code == StatusCode.ERROR, span.name
        assert span.attributes["error.type"].endswith("Refused")
        assert PERSON not in (span.status.description or "")  # the message quotes the person
    assert not tree.named("invoke_agent user")


def test_a_simulated_person_plays_two_rounds_in_one_trace(roster: Roster, provider: TracerProvider,
                                                          exporter: InMemorySpanExporter) -> None:
    director = ScriptedChat(replies=[direction("anchor"), direction("user"), direction("catalyst"), direction("user")])
    person = PromptChat(reply=lambda prompt: "PERSON-SAYS more")
    graph = create_director_graph(roster, director=director, speakers=voices(), user=person, max_rounds=2,
                                  safety=False).compile()
    scenario = load_scenarios("emotional_support")[0]
    graph.invoke({"messages": [], "scenario": scenario.model_dump(),
                  "user_profile": roster.user_profiles[0].model_dump()},
                 {"callbacks": [OpenTelemetryTracer(provider)]})
    tree = Tree(exporter.get_finished_spans())
    [root] = tree.roots()
    rounds = tree.children(root)
    assert [r.attributes["mascot.round"] for r in rounds] == [0, 1]
    assert root.attributes["mascot.rounds"] == 2
    names = [[s.name for s in tree.children(r)] for r in rounds]
    assert names == [
        ["invoke_agent user", "invoke_agent director", "invoke_agent anchor", "invoke_agent director",
         "invoke_agent user"],  # the opening line, the round, the person's simulated answer
        ["invoke_agent director", "invoke_agent catalyst", "invoke_agent director", "invoke_agent user"],
    ]
    answer = tree.children(rounds[0])[-1]
    [person_chat] = tree.children(answer)
    assert person_chat.attributes["gen_ai.usage.output_tokens"] == 2
    assert answer.attributes["mascot.handoff.from"] == "director"
    assert "mascot.handoff.from" not in tree.children(rounds[0])[0].attributes  # the opening came from START


def test_a_parent_graph_holding_the_director_graph_nests_alike(roster: Roster, provider: TracerProvider,
                                                               exporter: InMemorySpanExporter) -> None:
    parent = StateGraph(DirectorState)
    parent.add_node("conversation", one_round_graph(roster, [direction("anchor"), direction("user")]))
    parent.add_edge(START, "conversation")
    parent.compile().invoke({"messages": [HumanMessage(PERSON)]}, {"callbacks": [OpenTelemetryTracer(provider)]})
    tree = Tree(exporter.get_finished_spans())
    [root] = tree.roots()
    assert tree.outline(root) == ["mascot.conversation", [ROUND]]


def test_an_app_span_parents_the_conversation(roster: Roster, provider: TracerProvider,
                                              exporter: InMemorySpanExporter) -> None:
    graph = one_round_graph(roster, [direction("anchor"), direction("user")])
    with provider.get_tracer("app").start_as_current_span("handle request"):
        graph.invoke({"messages": [HumanMessage(PERSON)]}, {"callbacks": [OpenTelemetryTracer(provider)]})
    tree = Tree(exporter.get_finished_spans())
    [request] = tree.roots()
    assert request.name == "handle request"
    assert [s.name for s in tree.children(request)] == ["mascot.conversation"]


def test_async_runs_nest_alike(roster: Roster, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    replies = iter([direction("anchor"), direction("user")])
    director = PromptChat(reply=lambda prompt: next(replies), delay=lambda prompt: 0.01)
    graph = create_director_graph(roster, director=director, speakers=voices(), safety=False).compile()
    tracer = OpenTelemetryTracer(provider)

    async def run() -> None:
        await graph.ainvoke({"messages": [HumanMessage(PERSON)]}, {"callbacks": [tracer]})

    asyncio.run(run())
    tree = Tree(exporter.get_finished_spans())
    [root] = tree.roots()
    assert tree.outline(root) == ["mascot.conversation", [ROUND]]
    assert all(s.end_time for s in tree.spans)
    assert len(tree.named("chat")) == 3


def _texts(spans: Sequence[ReadableSpan]) -> str:
    """Every attribute and event value of every span, as one string."""
    values: list[str] = []
    for span in spans:
        values += [span.name, str(span.status.description)] + [str(v) for v in (span.attributes or {}).values()]
        for event in span.events:
            values += [event.name] + [str(v) for v in (event.attributes or {}).values()]
    return "\n".join(values)


@pytest.mark.parametrize("record_content", [False, True])
def test_words_leave_only_when_asked(roster: Roster, provider: TracerProvider, exporter: InMemorySpanExporter,
                                     record_content: bool) -> None:
    graph = one_round_graph(roster, [direction("anchor"), direction("user")])
    state = graph.invoke({"messages": [HumanMessage(PERSON)]},
                         {"callbacks": [OpenTelemetryTracer(provider, record_content=record_content)]})
    reply = state["messages"][1].text
    assert reply.startswith("VOICE-REPLY-")
    recorded = _texts(exporter.get_finished_spans())
    words = [PERSON, reply, "ACTION-anchor", "TONE-anchor", roster.personas[0].persona[:40]]
    if record_content:
        assert all(word in recorded for word in words), [w for w in words if w not in recorded]
        [turn] = Tree(exporter.get_finished_spans()).named("invoke_agent anchor")
        [chat] = Tree(exporter.get_finished_spans()).children(turn)
        assert [e.name for e in chat.events] == ["gen_ai.content.prompt", "gen_ai.content.completion"]
        assert chat.events[1].attributes["gen_ai.completion"] == reply
    else:
        assert not [word for word in words if word in recorded]
        assert not any(span.events for span in exporter.get_finished_spans())


BLOCK_OTEL = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] == 'opentelemetry':
            raise ModuleNotFoundError('blocked: ' + name)
sys.meta_path.insert(0, Block())
import mascot.graphs
from mascot.graphs import OpenTelemetryTracer
try:
    OpenTelemetryTracer()
except ImportError as exc:
    print(exc)
"""


def test_without_opentelemetry_the_module_imports_and_construction_says_what_to_install() -> None:
    result = subprocess.run([sys.executable, "-c", BLOCK_OTEL], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == 'OpenTelemetryTracer needs OpenTelemetry: pip install "mascot[otel]"'


def test_an_openai_model_call_records_its_model_and_usage_and_never_its_key(
        roster: Roster, provider: TracerProvider, exporter: InMemorySpanExporter) -> None:
    import httpx
    from langchain_openai import ChatOpenAI

    def answer(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json={
            "id": "chatcmpl-1", "object": "chat.completion", "created": 0, "model": "gpt-4o-mini-2024-07-18",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": "SERVED-REPLY here"}}],
            "usage": {"prompt_tokens": 321, "completion_tokens": 2, "total_tokens": 323}})

    model = ChatOpenAI(model="gpt-4o-mini", api_key="sk-SECRET-KEY-123", base_url="http://llm.invalid/v1",
                       temperature=0.3, max_tokens=64, http_client=httpx.Client(transport=httpx.MockTransport(answer)))
    graph = one_round_graph(roster, [direction("anchor"), direction("user")], speakers=model)
    graph.invoke({"messages": [HumanMessage(PERSON)]},
                 {"callbacks": [OpenTelemetryTracer(provider, record_content=True)]})
    tree = Tree(exporter.get_finished_spans())
    [chat] = tree.children(tree.named("invoke_agent anchor")[0])
    assert chat.name == "chat gpt-4o-mini"
    assert {k: chat.attributes[k] for k in ("gen_ai.provider.name", "gen_ai.request.model", "gen_ai.response.model",
                                            "gen_ai.request.temperature", "gen_ai.request.max_tokens",
                                            "gen_ai.usage.input_tokens", "gen_ai.usage.output_tokens",
                                            "gen_ai.response.finish_reasons")} == {
        "gen_ai.provider.name": "openai", "gen_ai.request.model": "gpt-4o-mini",
        "gen_ai.response.model": "gpt-4o-mini-2024-07-18", "gen_ai.request.temperature": 0.3,
        "gen_ai.request.max_tokens": 64, "gen_ai.usage.input_tokens": 321, "gen_ai.usage.output_tokens": 2,
        "gen_ai.response.finish_reasons": ("stop",)}
    recorded = _texts(tree.spans)
    assert "SERVED-REPLY" in recorded and "SECRET" not in recorded  # content on request; the key never


def test_approval_is_traced_as_its_own_step(roster: Roster, provider: TracerProvider,
                                            exporter: InMemorySpanExporter) -> None:
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.types import Command

    director = ScriptedChat(replies=[direction("beacon"), direction("anchor"), direction("user")])
    graph = create_director_graph(roster, director=director, speakers=voices(), approve=True).compile(
        checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "approved"}, "callbacks": [OpenTelemetryTracer(provider)]}
    graph.invoke({"messages": [HumanMessage("I failed my driving test again")]}, config)
    graph.invoke(Command(resume="reject"), config)
    graph.invoke(Command(resume="approve"), config)
    tree = Tree(exporter.get_finished_spans())
    asked = [s for s in tree.named("invoke_agent director") if s.attributes.get("mascot.direction.approval") == "asked"]
    assert [s.attributes["mascot.direction.speaker"] for s in asked] == ["beacon", "anchor"]
    # each question is a step that the interrupt ends; each answer, one that goes on
    answers = [s for s in tree.named("invoke_agent approve") if "mascot.approval.decision" in s.attributes]
    assert len(tree.named("invoke_agent approve")) == 4
    assert [s.attributes["mascot.approval.decision"] for s in answers] == ["rejected", "approved"]
    assert answers[1].attributes["mascot.handoff.to"] == "anchor"
    (turn,) = tree.named("invoke_agent anchor")
    assert turn.attributes["mascot.handoff.from"] == "director"
    assert not tree.named("invoke_agent beacon")  # the rejected voice never spoke
