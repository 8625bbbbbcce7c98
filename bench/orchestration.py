"""Orchestration overhead: one turn through the director graph vs the same turn without it.

One turn = the Director decides who speaks (one model call) and that persona speaks (one
model call), starting from the same short conversation each time. The chat models are
instant fakes, identical in every variant (the Director picks personas from a seeded random
sequence and answers a direction JSON that also carries the matching handoff tool call; the
speakers answer a fixed line), so what is measured is everything except generation:

- plain loop: call the Director, read its JSON, call the chosen speaker, append the reply
  (the floor);
- plain loop + mascot's work: the same loop with mascot's prompts, direction parsing and
  reply cleaning (what the director graph does besides orchestration);
- minimal LangGraph: a hand-written ``StateGraph`` with the same routing (director ->
  chosen speaker -> director -> end);
- ``create_director_graph``: mascot's graph (``max_speakers_per_round=1``, ``user=None``:
  director -> persona -> director hands back -> user node -> end);
- langgraph-supervisor: ``create_supervisor`` with one one-node agent graph per persona; its
  supervisor is a tool-calling agent, so it calls the Director's model a second time to end
  the turn (the fake answers that call with a hand-back and no tool call).

Each repeat runs ``--turns`` turns of every variant in turn (interleaved, so drift on a
shared machine hits all of them). Time is the CPU time of this process per turn
(``time.process_time``, which other processes on a shared machine disturb much less than wall
time; the wall-clock median is printed beside it). The table shows the median over
``--repeats`` repeats, the min-max spread, model calls per turn, and ratios to the plain loop
and to the minimal graph. Before timing, every variant runs a few turns with fresh fakes and
must let the same personas speak. ``--profile`` adds each variant's Python function calls
per turn (independent of load) and a cProfile of the director graph.

    .venv/bin/python bench/orchestration.py [--turns 300] [--repeats 7] [--profile]

The supervisor row needs langgraph-supervisor, which mascot does not depend on; install it
into the same environment (it changes no other package there):

    .venv/bin/pip install langgraph-supervisor==0.0.31
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import importlib.util
import json
import os
import pstats
import random
import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Annotated, Any, TypedDict

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.runnables import Runnable
from langchain_core.utils.function_calling import convert_to_openai_tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.graph.message import add_messages
from langgraph.types import Command
from langgraph.warnings import LangGraphDeprecatedSinceV10
from pydantic import PrivateAttr

from mascot.graphs import create_director_graph
from mascot.graphs.direction import interpret_direction
from mascot.graphs.prompts import director_messages, speaker_messages
from mascot.graphs.reply import clean_reply, speaker_labels, user_labels
from mascot.rosters import USER, Roster, load_roster

#: A turn: the conversation before it (ending with the person's message) -> after it.
Turn = Callable[[list[BaseMessage]], list[BaseMessage]]

REPLY = "That sounds exhausting. What part of it weighs on you most right now?"
HAND_BACK = json.dumps({"speaker": USER, "action": "Hand the turn back to the person.", "tone": "natural"})


class DirectorFake(BaseChatModel):
    """An instant Director: a seeded random persona per decision, as JSON and as a handoff call.

    After a persona handed back (a ``ToolMessage`` last, which only the supervisor sends)
    it hands the turn back to the person, without a tool call.
    """

    persona_ids: list[str]
    seed: int = 0
    _rng: random.Random = PrivateAttr()
    _directions: dict[str, str] = PrivateAttr()
    _calls: int = PrivateAttr(default=0)

    def model_post_init(self, context: Any) -> None:
        """Seed the speaker sequence and render each persona's direction once."""
        self._rng = random.Random(self.seed)
        self._directions = {
            pid: json.dumps({"speaker": pid, "action": "respond to the person", "tone": "warm"})
            for pid in self.persona_ids
        }

    @property
    def _llm_type(self) -> str:
        return "bench-director"

    @property
    def calls(self) -> int:
        """Model calls answered so far."""
        return self._calls

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self._calls += 1
        if isinstance(messages[-1], ToolMessage):
            message = AIMessage(HAND_BACK)
        else:
            speaker = self._rng.choice(self.persona_ids)
            message = AIMessage(
                self._directions[speaker],
                tool_calls=[{"name": f"transfer_to_{speaker}", "args": {}, "id": f"call_{self._calls}"}],
            )
        return ChatResult(generations=[ChatGeneration(message=message)])

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Runnable:
        """Bind tools as OpenAI-format dicts, the shape langgraph's agents check for."""
        return self.bind(tools=[convert_to_openai_tool(tool) for tool in tools], **kwargs)


class SpeakerFake(BaseChatModel):
    """An instant speaker that always says ``REPLY``."""

    _calls: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "bench-speaker"

    @property
    def calls(self) -> int:
        """Model calls answered so far."""
        return self._calls

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kwargs: Any) -> ChatResult:
        self._calls += 1
        return ChatResult(generations=[ChatGeneration(message=AIMessage(REPLY))])


#: Builds a variant's turn around the two fakes.
Builder = Callable[[Roster, DirectorFake, SpeakerFake], Turn]


def plain_loop(roster: Roster, director: DirectorFake, speaker: SpeakerFake) -> Turn:
    """The floor: the same model calls and routing in a Python function."""

    def turn(messages: list[BaseMessage]) -> list[BaseMessage]:
        messages = list(messages)
        pid = json.loads(director.invoke(messages).text)["speaker"]
        messages.append(AIMessage(speaker.invoke(messages).text, name=pid))
        return messages

    return turn


def plain_loop_mascot_work(roster: Roster, director: DirectorFake, speaker: SpeakerFake) -> Turn:
    """The plain loop plus what mascot's nodes do besides routing: prompts, parsing, cleaning."""
    labels = {
        p.id: (speaker_labels(p.id, p.name), user_labels() + speaker_labels(
            *(label for o in roster.personas if o.id != p.id for label in (o.id, o.name))))
        for p in roster.personas
    }

    def turn(messages: list[BaseMessage]) -> list[BaseMessage]:
        messages = list(messages)
        prompt = director_messages(roster, messages, round_turns=0, max_speakers_per_round=1,
                                   min_speakers_per_round=1)
        recent = [m.name for m in messages if isinstance(m, AIMessage) and m.name]
        direction = interpret_direction(director.invoke(prompt).text, roster, recent_speakers=recent,
                                        round_turns=0)
        persona = roster.persona(direction.speaker)
        reply = speaker.invoke(speaker_messages(roster, persona, direction, messages))
        own, others = labels[persona.id]
        messages.append(AIMessage(clean_reply(reply.text, own=own, others=others), name=persona.id,
                                  additional_kwargs={"stage_direction": direction.model_dump(exclude_none=True)}))
        return messages

    return turn


class MinimalState(TypedDict, total=False):
    """State of the minimal graph: the conversation and whether a persona spoke."""

    messages: Annotated[list[AnyMessage], add_messages]
    spoken: bool


def minimal_graph(roster: Roster, director: DirectorFake, speaker: SpeakerFake) -> Turn:
    """A hand-written StateGraph: director -> chosen speaker -> director -> end."""

    def direct(state: MinimalState) -> Command:
        if state.get("spoken"):
            return Command(goto=END)
        return Command(goto=json.loads(director.invoke(state["messages"]).text)["speaker"])

    def speaker_node(pid: str) -> Callable[[MinimalState], dict[str, Any]]:
        def speak(state: MinimalState) -> dict[str, Any]:
            return {"messages": [AIMessage(speaker.invoke(state["messages"]).text, name=pid)], "spoken": True}

        return speak

    builder = StateGraph(MinimalState)
    builder.add_node("director", direct, destinations=(*roster.persona_ids, END))
    for pid in roster.persona_ids:
        builder.add_node(pid, speaker_node(pid))
        builder.add_edge(pid, "director")
    builder.add_edge(START, "director")
    graph = builder.compile()
    return lambda messages: graph.invoke({"messages": messages})["messages"]


def director_graph(roster: Roster, director: DirectorFake, speaker: SpeakerFake) -> Turn:
    """mascot's ``create_director_graph``, one persona per round, ending at the person's turn."""
    graph = create_director_graph(roster, director=director, speakers=speaker, max_speakers_per_round=1).compile()
    return lambda messages: graph.invoke({"messages": messages})["messages"]


def supervisor_graph(roster: Roster, director: DirectorFake, speaker: SpeakerFake) -> Turn:
    """langgraph-supervisor's ``create_supervisor`` with one one-node agent per persona."""
    from langgraph_supervisor import create_supervisor

    def agent(pid: str) -> Any:
        def speak(state: MessagesState) -> dict[str, Any]:
            return {"messages": [AIMessage(speaker.invoke(state["messages"]).text, name=pid)]}

        builder = StateGraph(MessagesState)
        builder.add_node("speak", speak)
        builder.add_edge(START, "speak")
        return builder.compile(name=pid)

    # create_supervisor builds its supervisor with langgraph's create_react_agent, deprecated
    # since langgraph 1.0; the warning is about the package, not about this benchmark.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LangGraphDeprecatedSinceV10)
        graph = create_supervisor(
            [agent(pid) for pid in roster.persona_ids],
            model=director,
        ).compile()
    return lambda messages: graph.invoke({"messages": messages})["messages"]


def conversation(roster: Roster, length: int) -> list[BaseMessage]:
    """A fixed earlier conversation of ``length`` messages (person and personas in turn)."""
    messages: list[BaseMessage] = []
    for index in range(length):
        if index % 2 == 0:
            messages.append(HumanMessage(f"Earlier message {index} from the person, about the exam."))
        else:
            pid = roster.persona_ids[index // 2 % len(roster.persona_ids)]
            messages.append(AIMessage(f"Earlier reply {index} from {pid}.", name=pid))
    return messages


def spoken(messages: Sequence[BaseMessage], roster: Roster) -> str:
    """The persona that spoke last in a conversation."""
    return next(m.name for m in reversed(messages) if isinstance(m, AIMessage) and m.name in roster.persona_ids)


def check_same_routing(builders: dict[str, Builder], roster: Roster, history: list[BaseMessage],
                       seed: int, turns: int = 12) -> dict[str, float]:
    """Check that fresh, equally seeded fakes route every variant's turns to the same personas.

    Returns:
        Model calls per turn of each variant.

    Raises:
        SystemExit: if two variants let different personas speak.
    """
    sequences, calls = {}, {}
    for name, build in builders.items():
        director, speaker = DirectorFake(persona_ids=roster.persona_ids, seed=seed), SpeakerFake()
        turn = build(roster, director, speaker)
        sequences[name] = [spoken(turn([*history, HumanMessage(f"turn {i}")]), roster) for i in range(turns)]
        calls[name] = (director.calls + speaker.calls) / turns
    if len(set(map(tuple, sequences.values()))) != 1:
        raise SystemExit(f"variants routed differently: {json.dumps(sequences, indent=1)}")
    return calls


def run_turns(turn: Turn, history: list[BaseMessage], turns: int) -> None:
    """Run ``turns`` turns, each from ``history`` plus a fresh message of the person."""
    for index in range(turns):
        turn([*history, HumanMessage(f"Turn {index}: I failed my driving test again.")])


def time_turns(turn: Turn, history: list[BaseMessage], turns: int) -> tuple[float, float]:
    """Run ``turns`` turns; returns (CPU, wall) microseconds per turn."""
    gc.collect()
    cpu, wall = time.process_time(), time.perf_counter()
    run_turns(turn, history, turns)
    return (time.process_time() - cpu) / turns * 1e6, (time.perf_counter() - wall) / turns * 1e6


def profile(turns: dict[str, Turn], history: list[BaseMessage], count: int, top: int) -> None:
    """Print each variant's Python function calls per turn, then where the director graph's time goes.

    Function calls per turn do not depend on the machine's load, unlike the timings.
    """
    for name, turn in turns.items():
        gc.collect()
        profiler = cProfile.Profile()
        profiler.enable()
        run_turns(turn, history, count)
        profiler.disable()
        stats = pstats.Stats(profiler)
        calls = sum(row[1] for row in stats.stats.values())  # type: ignore[attr-defined]
        print(f"{name:<27} {calls / count:>7.0f} function calls per turn")
        if name == "create_director_graph":
            director_stats = stats
    director_stats.strip_dirs()
    for key in ("tottime", "cumulative"):
        print(f"\ncProfile of create_director_graph, {count} turns, sorted by {key}:")
        director_stats.sort_stats(key).print_stats(top)


def main() -> None:
    """Print the overhead table (and the profile with ``--profile``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=300, help="turns per variant per repeat")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--warmup", type=int, default=50, help="untimed turns per variant first")
    parser.add_argument("--history", type=int, default=6, help="messages before each turn's person message")
    parser.add_argument("--seed", type=int, default=0, help="seed of the Director fakes' speaker choice")
    parser.add_argument("--profile", action="store_true", help="also count calls and cProfile the director graph")
    parser.add_argument("--profile-top", type=int, default=30, help="rows of each profile listing")
    args = parser.parse_args()
    for flag in ("turns", "repeats"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag} must be >= 1, got {getattr(args, flag)}")
    roster = load_roster("emotional_support")
    history = conversation(roster, args.history)
    builders: dict[str, Builder] = {
        "plain loop": plain_loop,
        "plain loop + mascot's work": plain_loop_mascot_work,
        "minimal LangGraph": minimal_graph,
        "create_director_graph": director_graph,
    }
    if importlib.util.find_spec("langgraph_supervisor") is None:
        print("langgraph-supervisor is not installed: skipping its row "
              "(.venv/bin/pip install langgraph-supervisor==0.0.31)")
    else:
        builders["langgraph-supervisor"] = supervisor_graph
    calls = check_same_routing(builders, roster, history, args.seed)

    turns = {
        name: build(roster, DirectorFake(persona_ids=roster.persona_ids, seed=args.seed), SpeakerFake())
        for name, build in builders.items()
    }
    for turn in turns.values():
        run_turns(turn, history, args.warmup)
    cpu: dict[str, list[float]] = {name: [] for name in turns}
    wall: dict[str, list[float]] = {name: [] for name in turns}
    for _ in range(args.repeats):
        for name, turn in turns.items():  # interleaved, so load from other processes hits every variant
            cpu_us, wall_us = time_turns(turn, history, args.turns)
            cpu[name].append(cpu_us)
            wall[name].append(wall_us)

    median = {name: statistics.median(values) for name, values in cpu.items()}
    floor, minimal = median["plain loop"], median["minimal LangGraph"]
    print(f"CPU µs per turn (Director decides + one persona speaks), instant fake models; {args.repeats} repeats "
          f"x {args.turns} turns after {args.warmup} warm-up turns, {args.history} earlier messages, "
          f"{os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end")
    print(f"{'variant':<27} {'calls/turn':>10} {'median':>7} {'min-max':>13} {'x plain loop':>12} "
          f"{'x minimal graph':>15} {'wall median':>11}")
    for name, values in cpu.items():
        spread = f"{min(values):.0f}-{max(values):.0f}"
        print(f"{name:<27} {calls[name]:>10.0f} {median[name]:>7.0f} {spread:>13} {median[name] / floor:>12.2f} "
              f"{median[name] / minimal:>15.2f} {statistics.median(wall[name]):>11.0f}")
    ratio = median["create_director_graph"] / minimal
    print(f"target: create_director_graph within 1.5x of the minimal graph: {ratio:.2f}x, "
          f"{'met' if ratio <= 1.5 else 'missed'}")
    if "langgraph-supervisor" in median:
        versus = median["langgraph-supervisor"] / median["create_director_graph"]
        print(f"target: faster than the supervisor build: the supervisor takes {versus:.2f}x as long, "
              f"{'met' if versus > 1 else 'missed'}")
    if args.profile:
        print()
        profile(turns, history, args.turns, args.profile_top)


if __name__ == "__main__":
    main()
