"""Groupthink probes played through a system: one round of its graph per probe and variant.

``plain``: the person's probe message starts the round and the system's voices answer.
``confederate``: the round starts with the probe's scripted confederate line already said by
the roster's first persona, written into a checkpointed thread with
``graph.update_state(..., as_node=<first persona>)`` as if that persona's node had just run
(the message, its stage direction, ``round_turns: 1``); ``graph.invoke(None, config)`` then
continues the round from there, so the Director is asked next and that persona does not
speak again in the round. The ``single`` assistant has no other voices: its confederate
round shows the line as an earlier voice of the round (named by the roster's first persona)
and its one reply follows it (``is_single`` tells it by its nodes, whatever its name).

Systems (``SYSTEMS``): ``director`` (the director graph, voices see the conversation),
``director_blind`` (the same graph with ``voices_see: person``: each voice sees only the
person), and the baselines ``round_robin``, ``all`` and ``single``. Every system plays the
same probes with the same seed metadata (``episode_id`` = probe and variant), so a local or
seeded model samples alike wherever the graphs agree.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph.state import CompiledStateGraph

from mascot.graphs.baselines import ASSISTANT, create_baseline_graph
from mascot.graphs.direction import StageDirection
from mascot.graphs.director import create_director_graph
from mascot.graphs.state import round_messages
from mascot.rosters import Roster
from mascot.rosters.probes import GroupthinkProbe
from mascot.training.evaluation.groupthink_rates import ProbeRound

#: The systems a probe can be played through.
SYSTEMS = ("director", "director_blind", "round_robin", "all", "single")
#: The variants of a probe's round.
VARIANTS = ("plain", "confederate")
#: The confederate's stage direction, as recorded with its line.
CONFEDERATE_DIRECTION = {"action": "Respond to the person.", "tone": "warm", "rationale": "scripted confederate"}


def build_system(system: str, roster: Roster, *, director: BaseChatModel | None,
                 speakers: BaseChatModel | Mapping[str, BaseChatModel],
                 max_speakers_per_round: int = 3) -> CompiledStateGraph:
    """One system's graph, compiled with an in-memory checkpointer (one round per run).

    Args:
        system: One of ``SYSTEMS``.
        roster: The roster; ``director_blind`` plays it with ``voices_see: person``,
            ``director`` with ``voices_see: conversation``.
        director: The Director's chat model (the director graphs only; structured output).
        speakers: One chat model for every persona (``single`` needs one), or one per persona.
        max_speakers_per_round: Voices per round (``all``: every persona).

    Raises:
        ValueError: on an unknown system, or a director graph without a ``director``.
    """
    if system not in SYSTEMS:
        raise ValueError(f"unknown system '{system}'; valid: {', '.join(SYSTEMS)}")
    if system.startswith("director"):
        if director is None:
            raise ValueError(f"system '{system}' needs a director model")
        seen = roster.model_copy(update={"voices_see": "person" if system == "director_blind" else "conversation"})
        builder = create_director_graph(seen, director=director, speakers=speakers, structured_output=True,
                                        max_speakers_per_round=max_speakers_per_round, max_rounds=1)
    else:
        builder = create_baseline_graph(system, roster, speakers=speakers,
                                        max_speakers_per_round=max_speakers_per_round, max_rounds=1)
    return builder.compile(checkpointer=InMemorySaver())


async def aplay_probe(graph: CompiledStateGraph, system: str, roster: Roster, probe: GroupthinkProbe,
                      variant: str) -> ProbeRound:
    """Play one round of ``graph`` on ``probe`` (see the module docstring).

    Args:
        graph: Built by ``build_system(system, roster, ...)``.
        system: Its name, recorded in the round and in its thread id.
        roster: The roster the system plays (its first persona is the confederate).
        probe: The probe.
        variant: ``plain`` or ``confederate``.

    Returns:
        The round: its turns in order (the confederate's scripted), directions and fallbacks.

    Raises:
        ValueError: on an unknown variant.
    """
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant '{variant}'; valid: {', '.join(VARIANTS)}")
    config: dict[str, Any] = {"configurable": {"thread_id": f"{system}/{roster.id}/{probe.id}/{variant}"},
                              "metadata": {"episode_id": f"{roster.id}/{probe.id}/{variant}"}}
    start = time.perf_counter()
    if variant == "plain":
        state = await graph.ainvoke({"messages": [HumanMessage(probe.message)]}, config)
    else:
        single = is_single(graph, roster)
        await graph.aupdate_state(config, confederate_update(roster, probe, single=single),
                                  as_node=ASSISTANT.id if single else roster.personas[0].id)
        state = await graph.ainvoke(None, config)
    heard = round_messages(state["messages"])
    scripted = 1 if variant == "confederate" else 0
    turns = [{"voice": m.name, "text": m.text, "position": i + 1, "scripted": i < scripted}
             for i, m in enumerate(heard)]
    return ProbeRound(system=system, roster=roster.id, probe=probe.id, variant=variant,  # type: ignore[arg-type]
                      turns=turns, directions=list(state.get("directions", [])),
                      fallbacks=list(state.get("fallbacks", [])), seconds=time.perf_counter() - start)


def is_single(graph: CompiledStateGraph, roster: Roster) -> bool:
    """Whether ``graph`` is the one-assistant baseline (its only voice is the assistant)."""
    return ASSISTANT.id in graph.nodes and not any(p in graph.nodes for p in roster.persona_ids)


def confederate_update(roster: Roster, probe: GroupthinkProbe, *, single: bool = False) -> dict[str, Any]:
    """The state a confederate round starts from: the probe message, then the confederate
    line said by the roster's first persona with its direction. For the ``single``
    assistant, no persona turn is counted, so that the assistant still speaks."""
    first = roster.personas[0].id
    direction = StageDirection(speaker=first, **CONFEDERATE_DIRECTION).model_dump(exclude_none=True)
    line = AIMessage(probe.confederate, name=first, additional_kwargs={"stage_direction": direction})
    if single:
        return {"messages": [HumanMessage(probe.message), line], "round_turns": 0}
    return {"messages": [HumanMessage(probe.message), line], "round_turns": 1, "directions": [direction]}


async def aplay(graphs: Mapping[str, CompiledStateGraph], roster: Roster, probes: Sequence[GroupthinkProbe], *,
                variants: Sequence[str] = VARIANTS, concurrency: int = 8) -> list[ProbeRound]:
    """Every probe x system x variant, ``concurrency`` rounds at a time.

    Returns:
        The rounds, in probe, system, variant order.
    """
    gate = asyncio.Semaphore(concurrency)

    async def one(system: str, probe: GroupthinkProbe, variant: str) -> ProbeRound:
        async with gate:
            return await aplay_probe(graphs[system], system, roster, probe, variant)

    return list(await asyncio.gather(*(one(s, p, v) for p in probes for s in graphs for v in variants)))
