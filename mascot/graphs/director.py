"""The director graph: a Director node routes each turn to a persona or back to the person."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.runnables import Runnable, RunnableConfig
from langgraph.graph import START, StateGraph
from langgraph.types import Command, RetryPolicy, interrupt
from openai import LengthFinishReasonError

from mascot.graphs.direction import StageDirection, direction_schema, interpret_direction
from mascot.graphs.moderation import AppDetector, ModeratedDetector
from mascot.graphs.node import Node
from mascot.graphs.prompts import director_messages
from mascot.graphs.risk import PEAK
from mascot.graphs.safety import SafetyDetector, SafetyGuard
from mascot.graphs.speaker import speaker_node
from mascot.graphs.state import DirectorState, offered_speakers, round_directions, round_speakers
from mascot.graphs.user import USER_NODE, UserKind, user_node
from mascot.rosters import USER, Roster

logger = logging.getLogger(__name__)

#: Name of the Director node.
DIRECTOR_NODE = "director"
#: Name of the node that asks the app to approve a direction (``approve=True``).
APPROVAL_NODE = "approve"
#: Fields of a direction an app's edit may set.
EDITABLE = ("speaker", "action", "tone", "addressee", "sees")
#: A rule that picks the next direction without a model (the baselines use these).
DirectionRule = Callable[[DirectorState], StageDirection]


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
    """
    _check_limits(max_speakers_per_round, min_speakers_per_round, max_rounds)
    decider = Decider(roster, director, structured_output=structured_output,
                      max_speakers_per_round=max_speakers_per_round, min_speakers_per_round=min_speakers_per_round,
                      offer_seed=offer_seed)
    guard = safety_guard(roster, safety)

    def round_over(state: DirectorState, record: dict[str, Any] | None) -> bool:
        """The turn returns to the person without asking: the round is full, or every
        persona has spoken in it (a safety route is finished first)."""
        if record and _pending(state, record):
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
        pending = _pending(state, record)
        if pending:
            return record, update, (pending[0],)
        usual = decider.offered(messages, round_turns=state.get("round_turns", 0))
        return record, update, tuple(v for v in usual if v not in record["forbidden"]) or (USER,)

    def finish(state: DirectorState, record: dict[str, Any] | None, update: dict[str, Any],
               offered: tuple[str, ...] | None, direction: StageDirection) -> Command:
        if record:
            direction = _within_guard(direction, record, offered or (USER,))
        if approve and direction.speaker != USER:  # the app sees it before the voice speaks
            return Command(goto=APPROVAL_NODE, update={"proposed": direction.model_dump(exclude_none=True), **update})
        command = _route(state, direction)
        return Command(goto=command.goto, update={**command.update, **update}) if update else command

    def direct(state: DirectorState) -> Command:
        record, update, offered = plan(state)
        if round_over(state, record) or offered == (USER,):
            return finish(state, record, update, (USER,), _hand_back())
        return finish(state, record, update, offered, decider.decide(
            state.get("messages", []), round_turns=state.get("round_turns", 0), offered=offered,
            note=_guard_note(roster, record)))

    async def adirect(state: DirectorState) -> Command:
        # in a thread: the guard's first check loads its embedding model, and each check
        # embeds the message, neither of which may block the event loop
        record, update, offered = await asyncio.to_thread(plan, state)
        if round_over(state, record) or offered == (USER,):
            return finish(state, record, update, (USER,), _hand_back())
        direction = await decider.adecide(state.get("messages", []), round_turns=state.get("round_turns", 0),
                                          offered=offered, note=_guard_note(roster, record))
        return finish(state, record, update, offered, direction)

    node = Node(DIRECTOR_NODE, direct, adirect)
    return assemble_graph(
        roster, node, speakers=speakers, user=user, max_rounds=max_rounds, retry_policy=retry_policy,
        approval=approval_node(roster) if approve else None,
    )


def approval_node(roster: Roster) -> Node:
    """The node that asks the app to approve the Director's direction before its voice
    speaks (``create_director_graph(approve=True)``).

    It interrupts with ``{"direction", "round", "roster"}`` and reads the answer the app
    resumes with: ``"approve"``, ``"reject"`` or ``{"edit": {field: value}}``. An approved
    or edited direction is routed as any direction is; a rejected one goes back to the
    Director. Each answer is appended to ``state["approvals"]``: ``{round, cut (the
    messages before the decision), decision (approved | edited | rejected), proposed,
    played}``.

    An answer of another shape, or an edit naming a voice that may not speak now, is not
    played: the node asks again, the reason in the interrupt's ``error``.
    """
    def approve(state: DirectorState) -> Command:
        proposed = state["proposed"]
        question: dict[str, Any] = {"direction": proposed, "round": state.get("round", 0), "roster": roster.id}
        while True:
            answer = interrupt(question)
            try:
                decision, fields = read_approval(answer)
                direction = StageDirection.model_validate(proposed)
                if decision == "edited":
                    direction = _edited(direction, fields, state, roster)
                break
            except ValueError as exc:  # asked again, with the reason
                logger.warning("%s", exc)
                question = {**question, "error": str(exc)}
        entry: dict[str, Any] = {"round": state.get("round", 0), "cut": len(state.get("messages", [])),
                                 "decision": decision, "proposed": proposed}
        if decision == "rejected":
            return Command(goto=DIRECTOR_NODE, update={"approvals": [entry], "proposed": None})
        entry["played"] = direction.model_dump(exclude_none=True)
        command = _route(state, direction)
        return Command(goto=command.goto, update={**command.update, "approvals": [entry], "proposed": None})

    return Node(APPROVAL_NODE, approve)


def read_approval(answer: Any) -> tuple[str, dict[str, Any]]:
    """An app's answer to an approval interrupt as ``(decision, edited fields)``.

    Raises:
        ValueError: if the answer is not ``"approve"``, ``"reject"``, ``{"approve": true}``,
            ``{"reject": true}`` or ``{"edit": {field: value, ...}}`` with fields among ``EDITABLE``.
    """
    if isinstance(answer, str) and answer.strip().lower() in ("approve", "reject"):
        return ("approved" if answer.strip().lower() == "approve" else "rejected"), {}
    if isinstance(answer, Mapping) and len(answer) == 1:
        (key, value), = answer.items()
        if key in ("approve", "reject") and value is True:
            return ("approved" if key == "approve" else "rejected"), {}
        if key == "edit" and isinstance(value, Mapping) and value and set(value) <= set(EDITABLE):
            return "edited", dict(value)
    raise ValueError(f"approval: resume with 'approve', 'reject' or {{'edit': {{field: value}}}} (fields "
                     f"{', '.join(EDITABLE)}); got {str(answer)[:120]!r}")


def _edited(direction: StageDirection, fields: dict[str, Any], state: DirectorState, roster: Roster) -> StageDirection:
    """``direction`` with an app's edit applied, checked as the graph checks a direction."""
    speaker = fields.get("speaker", direction.speaker)
    heard = round_speakers(state.get("messages", []))
    allowed = [pid for pid in roster.persona_ids if pid not in heard] + [USER]
    if speaker not in allowed:
        raise ValueError(f"approval: the edit names '{str(speaker)[:60]}', not a voice of {roster.id} that may "
                         f"speak now ({', '.join(allowed)})")
    if state.get("guard") and speaker != direction.speaker:
        raise ValueError(f"approval: safety rule '{state['guard']['rule']}' routes this turn to "
                         f"'{direction.speaker}'; an edit may change its action and tone, not the voice")
    try:
        edited = StageDirection.model_validate({**direction.model_dump(exclude_none=True), **fields})
    except ValueError as exc:
        raise ValueError(f"approval: the edit is not a stage direction: {str(exc).splitlines()[0]}") from None
    return edited.model_copy(update={"action": edited.action.strip(), "tone": edited.tone.strip()})


class Decider:
    """One decision of a model Director, as the director graph's node makes it: the voices
    offered in their shuffled order, the prompt, the (structured) model call, the reply
    interpreted into a valid direction (repaired or replaced, never raising) that records
    what was offered. The graph's node and the routing evaluation use it alike."""

    def __init__(
        self,
        roster: Roster,
        director: BaseChatModel,
        *,
        structured_output: bool = False,
        max_speakers_per_round: int = 3,
        min_speakers_per_round: int = 1,
        offer_seed: int | None = 0,
    ) -> None:
        """Args: as ``create_director_graph``'s of the same names."""
        self.roster = roster
        self.director = director
        self.max_speakers_per_round = max_speakers_per_round
        self.min_speakers_per_round = min_speakers_per_round
        self.offer_seed = offer_seed
        self._structured = _structured_models(director) if structured_output else None

    def offered(self, messages: Sequence[BaseMessage], *, round_turns: int) -> tuple[str, ...]:
        """The speakers offered now, in the order the prompt and schema list them."""
        return offered_speakers(self.roster, messages, round_turns=round_turns,
                                min_speakers_per_round=self.min_speakers_per_round, seed=self.offer_seed)

    def _call(self, messages: Sequence[BaseMessage], round_turns: int, offered: tuple[str, ...],
              note: str | None) -> tuple[Runnable, list[BaseMessage]]:
        model = self.director if self._structured is None else self._structured(offered)
        prompt = director_messages(self.roster, messages, round_turns=round_turns,
                                   max_speakers_per_round=self.max_speakers_per_round,
                                   min_speakers_per_round=self.min_speakers_per_round, offer_seed=self.offer_seed,
                                   offered=offered, note=note)
        return model, prompt

    def _interpret(self, output: Any, messages: Sequence[BaseMessage], round_turns: int,
                   offered: tuple[str, ...]) -> StageDirection:
        direction = interpret_direction(
            _model_text(output),
            self.roster,
            recent_speakers=[m.name for m in messages if isinstance(m, AIMessage) and m.name],
            round_turns=round_turns,
            min_speakers_per_round=self.min_speakers_per_round,
            heard_this_round=round_speakers(messages),
        )
        return direction.model_copy(update={"offered": list(offered)})

    def decide(self, messages: Sequence[BaseMessage], *, round_turns: int, offered: tuple[str, ...] | None = None,
               note: str | None = None) -> StageDirection:
        """The Director's direction after ``messages`` (``round_turns`` persona turns into the
        round), choosing among ``offered`` (default ``self.offered``: every voice that may
        speak) with ``note`` in its prompt (the safety guard's reason for a narrower offer)."""
        offered = offered if offered is not None else self.offered(messages, round_turns=round_turns)
        model, prompt = self._call(messages, round_turns, offered, note)
        try:
            output = model.invoke(prompt)
        except LengthFinishReasonError as exc:  # structured output cut at max_tokens
            output = _cut_reply(exc)
        return self._interpret(output, messages, round_turns, offered)

    async def awrite(self, messages: Sequence[BaseMessage], *, round_turns: int,
                     config: RunnableConfig | None = None) -> str:
        """The text the Director's model writes after ``messages`` (structured output when
        asked, as the graph calls it; ``config`` the call's, e.g. the metadata that seeds it),
        before it is interpreted: a sample to be checked."""
        offered = self.offered(messages, round_turns=round_turns)
        model, prompt = self._call(messages, round_turns, offered, None)
        try:
            output = await model.ainvoke(prompt, config)
        except LengthFinishReasonError as exc:
            output = _cut_reply(exc)
        return output.text if isinstance(output, AIMessage) else output["raw"].text

    async def adecide(self, messages: Sequence[BaseMessage], *, round_turns: int,
                      offered: tuple[str, ...] | None = None, note: str | None = None) -> StageDirection:
        """``decide``, asynchronously."""
        offered = offered if offered is not None else self.offered(messages, round_turns=round_turns)
        model, prompt = self._call(messages, round_turns, offered, note)
        try:
            output = await model.ainvoke(prompt)
        except LengthFinishReasonError as exc:
            output = _cut_reply(exc)
        return self._interpret(output, messages, round_turns, offered)


def safety_guard(roster: Roster, safety: SafetyGuard | bool | AppDetector | BaseChatModel) -> SafetyGuard | None:
    """The guard a graph of ``roster`` runs: ``True`` the roster's own, a given guard as is
    (for this roster), an app's detector (callable or chat model) in the roster's guard,
    ``False`` none (a warning when the roster has rules).

    Raises:
        ValueError: if a given guard holds another roster's rules.
    """
    if safety is False:
        if roster.safety:
            logger.warning("the safety guard is off: roster '%s' has safety rules (%s) that this graph will not "
                           "enforce", roster.id, ", ".join(r.name for r in roster.safety))
        return None
    if safety is True:
        return SafetyGuard(roster) if roster.safety else None
    if isinstance(safety, BaseChatModel) or (callable(safety) and not isinstance(safety, SafetyGuard)):
        if not roster.safety:
            raise ValueError(f"a safety detector was given, but roster '{roster.id}' has no safety rules")
        return SafetyGuard(roster, detector=ModeratedDetector(roster.safety, safety,
                                                               fallback=SafetyDetector.for_roster(roster)))
    if safety.roster.safety != roster.safety:
        raise ValueError(f"the safety guard holds the rules of roster '{safety.roster.id}', not of '{roster.id}'")
    return safety


def _pending(state: DirectorState, record: dict[str, Any]) -> list[str]:
    """The route's voices not yet directed this round, in route order."""
    directed = {d.get("speaker") for d in round_directions(state)}
    return [voice for voice in record["route"] if voice not in directed]


def running_risk(state: DirectorState) -> dict[str, float]:
    """The conversation's running safety risk before the person's latest message: the
    state's ``safety_risk``; in a conversation checkpointed before the state had it, each
    rule of the last guarded round at ``risk.PEAK`` (it stays in force as it did)."""
    if state.get("safety_risk") is not None:
        return dict(state["safety_risk"])
    last = state.get("round", 0) - 1
    return {g["rule"]: PEAK for g in state.get("guards") or [] if g.get("round") == last and g.get("rule")}


def _guard_note(roster: Roster, record: dict[str, Any] | None) -> str | None:
    """What the Director reads in a guarded round: the rule, and who may not speak."""
    if not record:
        return None
    rule = roster.safety_rule(record["rule"])
    forbidden = ", ".join(roster.persona(v).name for v in record["forbidden"])
    if record.get("via") == "persists":  # one line: why the offer is narrower than usual
        return (f"Safety still applies: earlier in this conversation the person's words called for care ("
                f"{rule.description.rstrip('.')})" + (f"; {forbidden} do not speak." if forbidden else "."))
    return (f"Safety comes first in this round: {rule.description} The voices speak in this order: "
            f"{' then '.join(roster.persona(v).name for v in record['route'])}"
            + (f"; {forbidden} do not speak in this round." if forbidden else ".")
            + " Write the instruction for the voice offered now.")


def _within_guard(direction: StageDirection, record: dict[str, Any], offered: tuple[str, ...]) -> StageDirection:
    """``direction`` kept inside the guard's offer (another voice is replaced by the routed
    one, with the model's action and tone, or by the hand-back), marked with the rule, and
    for the voice that gives them, carrying the resources in its action."""
    update: dict[str, Any] = {"guard": {"rule": record["rule"],
                                        **({"persists": True} if record.get("via") == "persists" else {})}}
    if direction.speaker not in offered:
        speaker = offered[0]
        reason = (f"safety rule '{record['rule']}': the Director chose {direction.speaker}, the round's route "
                  f"or limits allow {', '.join(offered)}; {speaker} speaks")
        update.update(speaker=speaker, fallback="; ".join(filter(None, [direction.fallback, reason])))
        if speaker == USER:
            update.update(action=_hand_back().action, tone=_hand_back().tone)
    if update.get("speaker", direction.speaker) == record["giver"]:
        update["guard"]["resources"] = record["resources"]
        update["action"] = (f"{update.get('action', direction.action).rstrip()} Give the person these resources "
                            f"clearly, in these words: {record['resources']}")
    return direction.model_copy(update=update)


def rule_director(
    rule: DirectionRule, *, max_speakers_per_round: int, min_speakers_per_round: int = 1
) -> Runnable:
    """A Director node that follows a rule instead of a model (for baselines).

    Args:
        rule: Picks the next direction from the state.
        max_speakers_per_round: Persona turns before the turn returns to the person.
        min_speakers_per_round: Persona turns before the rule may hand back.

    Returns:
        A node to pass to ``assemble_graph``.
    """
    _check_limits(max_speakers_per_round, min_speakers_per_round, 1)

    def direct(state: DirectorState) -> Command:
        if state.get("round_turns", 0) >= max_speakers_per_round:
            return _route(state, _hand_back())
        direction = rule(state)
        if direction.speaker == USER and state.get("round_turns", 0) < min_speakers_per_round:
            raise ValueError("a direction rule handed back before a persona spoke")
        return _route(state, direction)

    return Node(DIRECTOR_NODE, direct)


def assemble_graph(
    roster: Roster,
    director_node: Runnable,
    *,
    speakers: BaseChatModel | Mapping[str, BaseChatModel],
    user: UserKind,
    max_rounds: int,
    retry_policy: RetryPolicy | None = None,
    approval: Runnable | None = None,
) -> StateGraph:
    """Wire a Director node, one node per persona and the person's turn into a graph.

    Args:
        roster: The roster whose personas get a node each.
        director_node: Returns ``Command(goto=<persona id> | "user")``.
        speakers: One chat model for every persona, or one per persona id.
        user: Who speaks for the person (see ``create_director_graph``).
        max_rounds: Rounds after which the conversation ends.
        retry_policy: Retry policy of every node (see ``create_director_graph``).
        approval: The node between a direction and its voice (``approval_node``), if any.

    Returns:
        The uncompiled ``StateGraph``.

    Raises:
        ValueError: if ``speakers`` does not map exactly the roster's persona ids.
    """
    models = _speaker_models(roster, speakers)
    graph = StateGraph(DirectorState)
    graph.add_node(
        DIRECTOR_NODE,
        director_node,
        destinations=(*roster.persona_ids, USER_NODE, *((APPROVAL_NODE,) if approval else ())),
        retry_policy=retry_policy,
    )
    if approval is not None:
        graph.add_node(APPROVAL_NODE, approval, destinations=(*roster.persona_ids, USER_NODE, DIRECTOR_NODE))
    for persona in roster.personas:
        graph.add_node(
            persona.id, speaker_node(roster, persona, models[persona.id]), retry_policy=retry_policy
        )
        graph.add_edge(persona.id, DIRECTOR_NODE)
    graph.add_node(
        USER_NODE,
        user_node(roster, user, max_rounds=max_rounds, next_node=DIRECTOR_NODE),
        destinations=(DIRECTOR_NODE, "__end__"),
        retry_policy=retry_policy,
    )
    # a Node, not the bare function, so that the check runs without a callback run of its own
    graph.add_conditional_edges(START, Node("_entry", _entry), [DIRECTOR_NODE, USER_NODE])
    return graph


def _structured_models(director: BaseChatModel) -> Callable[[tuple[str, ...]], Runnable]:
    """A factory of structured-output runnables, one per set of allowed speakers (each
    with the speakers in its schema's ``enum``), built on first use. A model without
    structured output answers as itself: the Director is prompted for JSON, with a warning."""
    models: dict[tuple[str, ...], Runnable] = {}

    def structured(speakers: tuple[str, ...]) -> Runnable:
        if speakers not in models:
            try:
                models[speakers] = director.with_structured_output(
                    direction_schema(speakers), method="json_schema", include_raw=True
                )
            except NotImplementedError as exc:
                if not models:  # once per graph: every later set of speakers fails alike
                    logger.warning("%s has no structured output (%s); the Director is prompted for JSON instead",
                                   type(director).__name__, exc)
                models[speakers] = director
        return models[speakers]

    return structured


def _entry(state: DirectorState) -> str:
    """Start with the Director when the person just spoke, else with the person's turn."""
    messages = state.get("messages", [])
    return DIRECTOR_NODE if messages and isinstance(messages[-1], HumanMessage) else USER_NODE


def _route(state: DirectorState, direction: StageDirection) -> Command:
    update: dict[str, Any] = {"directions": [direction.model_dump(exclude_none=True)]}
    if direction.fallback:
        update["fallbacks"] = [
            {"node": DIRECTOR_NODE, "round": state.get("round", 0), "reason": direction.fallback}
        ]
    goto = USER_NODE if direction.speaker == USER else direction.speaker
    return Command(goto=goto, update=update)


def _hand_back() -> StageDirection:
    return StageDirection(
        speaker=USER,
        action="Hand the turn back to the person.",
        tone="natural",
        rationale="turn limit of the round reached",
    )


def _cut_reply(error: LengthFinishReasonError) -> AIMessage:
    """The truncated reply of a structured-output call, to be interpreted (or replaced by
    the fallback, with the reason recorded) like any other malformed direction."""
    return AIMessage(error.completion.choices[0].message.content or "")


def _model_text(output: Any) -> str | dict[str, Any]:
    """The text (or parsed object) of a chat model or structured-output result."""
    if isinstance(output, AIMessage):
        return output.text
    # with_structured_output(include_raw=True) returns {"raw", "parsed", "parsing_error"}
    if isinstance(output.get("parsed"), dict):
        return output["parsed"]
    return output["raw"].text


def _speaker_models(
    roster: Roster, speakers: BaseChatModel | Mapping[str, BaseChatModel]
) -> dict[str, BaseChatModel]:
    if isinstance(speakers, BaseChatModel):
        return {pid: speakers for pid in roster.persona_ids}
    missing = sorted(set(roster.persona_ids) - set(speakers))
    unknown = sorted(set(speakers) - set(roster.persona_ids))
    if missing or unknown:
        raise ValueError(
            f"speakers must map every persona id of roster '{roster.id}' "
            f"({', '.join(roster.persona_ids)}); missing: {', '.join(missing) or '-'}, "
            f"unknown: {', '.join(unknown) or '-'}"
        )
    return dict(speakers)


def _check_limits(max_speakers: int, min_speakers: int, max_rounds: int) -> None:
    if max_speakers < 1:
        raise ValueError(f"max_speakers_per_round must be >= 1, got {max_speakers}")
    if not 0 <= min_speakers <= max_speakers:
        raise ValueError(
            f"min_speakers_per_round must be between 0 and max_speakers_per_round "
            f"({max_speakers}), got {min_speakers}"
        )
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
