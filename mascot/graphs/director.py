"""The director graph: a Director node routes each turn to a persona or back to the person.

``create_director_graph`` builds it from the pieces beside it: the Director's decision
(``mascot.graphs.decider``), the safety guard's routing (``mascot.graphs.guard_routing``),
the approval step (``mascot.graphs.approval``), the routes (``mascot.graphs.routes``) and
the wiring shared with the baselines (``mascot.graphs.assembly``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from langchain_core.language_models import BaseChatModel
from langgraph.graph import StateGraph
from langgraph.types import Command, RetryPolicy

from mascot.graphs.approval import APPROVAL_NODE, approval_node
from mascot.graphs.assembly import assemble_graph, check_limits
from mascot.graphs.baselines import rule_director
from mascot.graphs.decider import Decider
from mascot.graphs.direction import StageDirection
from mascot.graphs.guard_routing import guard_note, pending_voices, running_risk, safety_guard, within_guard
from mascot.graphs.moderation import AppDetector
from mascot.graphs.node import Node
from mascot.graphs.routes import DIRECTOR_NODE, hand_back, route
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.state import DirectorState, round_speakers
from mascot.graphs.user import UserKind
from mascot.rosters import USER, Roster

# the graph's public names that lived here before its pieces had modules of their own
__all__ = ["DIRECTOR_NODE", "assemble_graph", "create_director_graph", "rule_director"]

def create_director_graph(
    roster: Roster,
    *,
    director: BaseChatModel,
    speakers: BaseChatModel | Mapping[str, BaseChatModel],
    user: UserKind = None,
    max_speakers_per_round: int = 3,
    min_speakers_per_round: int = 1,
    max_rounds: int = 5,
    structured_output: bool = False,
    retry_policy: RetryPolicy | None = None,
    offer_seed: int | None = 0,
    safety: SafetyGuard | bool | AppDetector | BaseChatModel = True,
    approve: bool = False,
) -> StateGraph:
    """Build the directed multi-persona conversation graph (uncompiled).

    Each turn the Director's model writes a stage direction (JSON, or structured output
    where the model supports it); it is validated against the roster, repaired or
    replaced by the fallback with the reason recorded, and the graph goes to that
    persona's node or to the person's turn.

    Args:
        roster: The personas, director guidance and user profiles.
        director: Chat model of the Director.
        speakers: One chat model for every persona, or one per persona id.
        user: ``None`` (each run ends when the turn returns to the person), ``"human"``
            (a LangGraph interrupt asks for the person's message) or a chat model that
            simulates the person of ``state["user_profile"]``.
        max_speakers_per_round: Persona turns before the turn returns to the person.
        min_speakers_per_round: Persona turns before the Director may hand back.
        max_rounds: Rounds after which the conversation ends.
        structured_output: Ask the Director's model for structured output
            (``with_structured_output``, JSON schema whose ``speaker`` enum holds the
            voices that may speak now: constrained decoding on the local backend and
            vLLM, JSON schema on OpenAI) instead of prompting for JSON. A model without
            structured output is prompted for JSON, with a warning.
        retry_policy: LangGraph retry policy of every node that calls a model (e.g.
            retry server faults with backoff); ``None`` fails on the first error.
        offer_seed: Seed of the order in which each decision offers the voices, in the
            prompt and the schema (``state.offered_speakers``: shuffled per decision,
            the same for the same conversation); ``None`` offers them in roster order.
            Every direction records what it was offered (``StageDirection.offered``).
        safety: The safety guard (``mascot.graphs.safety``): ``True`` (the default) guards
            with the roster's rules and their own resources, a ``SafetyGuard`` with a
            deployment's resources or detector, the app's own detector (a callable of the
            person's messages returning a rule name or ``None``, or a chat model such as
            Llama Guard: ``mascot.graphs.moderation``), ``False`` turns it off (logged as a
            warning when the roster has rules). When a rule fires on the person's message,
            the round follows its route whatever the Director writes: the Director is
            offered only the routed voice (prompt and schema) and writes its action and
            tone, the forbidden voices do not speak, and the giver's reply carries the
            resources.
        approve: Interrupt after each direction to a voice, before the voice speaks. The
            interrupt's value is ``{"direction", "round", "roster"}``; resume with
            ``Command(resume="approve")``, ``"reject"`` (the Director decides again) or
            ``{"edit": {"speaker": ..., "action": ..., "tone": ...}}`` (any of those
            fields, ``addressee`` and ``sees``; the edited direction is the one played).
            Every answer is recorded in ``state["approvals"]`` (and in the episode), and
            ``mascot pairs --approvals`` turns edits and rejections into Director
            preference pairs. In a round a safety rule governs, an edit cannot change the
            routed voice.

    Returns:
        The ``StateGraph`` builder; compile it with the checkpointer of your choice.

    Raises:
        ValueError: on limits out of range or a speaker mapping that does not match
            the roster's persona ids.

    Example:
        >>> from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
        >>> from langchain_core.messages import HumanMessage
        >>> from mascot import create_director_graph, load_roster
        >>> director = GenericFakeChatModel(messages=iter([
        ...     '{"speaker": "anchor", "action": "Acknowledge the setback.", "tone": "warm"}',
        ...     '{"speaker": "user", "action": "Hand the turn back.", "tone": "natural"}']))
        >>> speakers = GenericFakeChatModel(messages=iter(["That sounds really discouraging."]))
        >>> graph = create_director_graph(load_roster("emotional_support"), director=director, speakers=speakers)
        >>> state = graph.compile().invoke({"messages": [HumanMessage("I failed my driving test again")]})
        >>> [(m.name, m.text) for m in state["messages"][1:]]
        [('anchor', 'That sounds really discouraging.')]
    """
    check_limits(max_speakers_per_round, min_speakers_per_round, max_rounds)
    decider = Decider(roster, director, structured_output=structured_output,
                      max_speakers_per_round=max_speakers_per_round, min_speakers_per_round=min_speakers_per_round,
                      offer_seed=offer_seed)
    guard = safety_guard(roster, safety)

    def round_over(state: DirectorState, record: dict[str, Any] | None) -> bool:
        """The turn returns to the person without asking: the round is full, or every
        persona has spoken in it (a safety route is finished first)."""
        if record and pending_voices(state, record):
            return False
        turns = state.get("round_turns", 0)
        everyone = set(roster.persona_ids) <= set(round_speakers(state.get("messages", [])))
        return turns >= max_speakers_per_round or everyone

    def plan(state: DirectorState) -> tuple[dict[str, Any] | None, dict[str, Any], tuple[str, ...] | None]:
        """The round's guard record, the state update that sets it, and the voices the
        guard offers (``None``: the Director's usual choice)."""
        record, update = state.get("guard"), {}
        messages = state.get("messages", [])
        if guard is not None and state.get("round_turns", 0) == 0 and messages and messages[-1].type == "human":
            record, risk = guard.assess(messages, state.get("guards") or [], state.get("round", 0),
                                        running_risk(state))
            update = {"guard": record, "safety_risk": risk,
                      **({"guards": [{**record, "round": state.get("round", 0)}]} if record else {})}
        if not record:
            return None, update, None
        pending = pending_voices(state, record)
        if pending:
            return record, update, (pending[0],)
        usual = decider.offered(messages, round_turns=state.get("round_turns", 0))
        return record, update, tuple(v for v in usual if v not in record["forbidden"]) or (USER,)

    def finish(state: DirectorState, record: dict[str, Any] | None, update: dict[str, Any],
               offered: tuple[str, ...] | None, direction: StageDirection) -> Command:
        if record:
            direction = within_guard(direction, record, offered or (USER,))
        if approve and direction.speaker != USER:  # the app sees it before the voice speaks
            return Command(goto=APPROVAL_NODE, update={"proposed": direction.model_dump(exclude_none=True), **update})
        command = route(state, direction)
        return Command(goto=command.goto, update={**command.update, **update}) if update else command

    def direct(state: DirectorState) -> Command:
        record, update, offered = plan(state)
        if round_over(state, record) or offered == (USER,):
            return finish(state, record, update, (USER,), hand_back())
        return finish(state, record, update, offered, decider.decide(
            state.get("messages", []), round_turns=state.get("round_turns", 0), offered=offered,
            note=guard_note(roster, record)))

    async def adirect(state: DirectorState) -> Command:
        # in a thread: the guard's first check loads its embedding model, and each check
        # embeds the message, neither of which may block the event loop
        record, update, offered = await asyncio.to_thread(plan, state)
        if round_over(state, record) or offered == (USER,):
            return finish(state, record, update, (USER,), hand_back())
        direction = await decider.adecide(state.get("messages", []), round_turns=state.get("round_turns", 0),
                                          offered=offered, note=guard_note(roster, record))
        return finish(state, record, update, offered, direction)

    node = Node(DIRECTOR_NODE, direct, adirect)
    return assemble_graph(
        roster, node, speakers=speakers, user=user, max_rounds=max_rounds, retry_policy=retry_policy,
        approval=approval_node(roster) if approve else None,
    )
