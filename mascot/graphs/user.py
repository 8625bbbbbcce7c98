"""The person's turn: end of a round, then a simulated user, a human, or the caller."""

from __future__ import annotations

import logging
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import BaseMessage, HumanMessage
from langgraph.graph import END
from langgraph.types import Command, interrupt

from mascot.graphs.faults import reply_faults
from mascot.graphs.node import Node
from mascot.graphs.prompts import user_simulator_messages
from mascot.graphs.reply import clean_reply, speaker_labels, user_labels
from mascot.graphs.state import DirectorState
from mascot.rosters import Roster, Scenario, UserProfile

logger = logging.getLogger(__name__)

#: Name of the node where the turn returns to the person.
USER_NODE = "user"
#: Samples of the simulated person before a conversation whose person keeps refusing ends.
PERSON_TRIES = 3
#: The user turn goes back to the Director, or ends the run.
UserKind = BaseChatModel | Literal["human"] | None


def user_node(roster: Roster, user: UserKind, *, max_rounds: int, next_node: str) -> Node:
    """Build the node where a round ends and the person speaks.

    Ending a round increments ``round`` (every hand-back from the Director counts, one
    with no persona turn too) and resets ``round_turns``. Then, unless
    ``max_rounds`` rounds are complete:

    - ``user=None``: the run ends; the caller sends the next message in a new run on the
      same thread (the usual way to embed the graph in an app).
    - ``user="human"``: the graph interrupts; resume with ``Command(resume="text")``
      (an empty resume ends the conversation).
    - ``user=<chat model>``: the model plays ``state["user_profile"]``; the first message
      of an empty conversation is the scenario's opening line, and the next ones are the
      scenario's ``followups`` while it has them (the same for every system an evaluation
      compares). A simulated message that refuses or talks as an assistant
      (``faults.reply_faults``) is sampled again, up to ``PERSON_TRIES`` times; then the
      conversation ends, recorded as a fallback: no round starts from a refusing "person".

    Args:
        roster: The roster the conversation uses.
        user: Who speaks for the person.
        max_rounds: Rounds after which the conversation ends.
        next_node: Where the conversation continues after the person spoke.

    Returns:
        A node that returns ``Command(goto=next_node | END)``.
    """
    own = user_labels()
    others = speaker_labels(*(label for p in roster.personas for label in (p.id, p.name)))

    def close_round(state: DirectorState) -> dict[str, Any]:
        # A round was played when a persona took a turn, or when the Director handed the
        # person's message back unanswered (min_speakers_per_round=0): the graph enters
        # here from START only when the person has not just spoken, so a person's message
        # last means a hand-back, which must count, or Director and person loop forever.
        messages = state.get("messages", [])
        handed_back = bool(messages) and isinstance(messages[-1], HumanMessage)
        played = 1 if state.get("round_turns", 0) > 0 or handed_back else 0
        return {"round": state.get("round", 0) + played, "round_turns": 0}

    def prompt(state: DirectorState) -> list[BaseMessage]:
        profile_data = state.get("user_profile")
        if not profile_data:
            raise ValueError("a simulated user needs 'user_profile' in the graph input")
        scenario_data = state.get("scenario")
        profile = UserProfile.model_validate(profile_data)
        scenario = Scenario.model_validate(scenario_data) if scenario_data else None
        return user_simulator_messages(roster, profile, scenario, state.get("messages", []))

    def person_fault(text: str) -> str | None:
        """Why a simulated message cannot start a round: empty, a refusal or assistant talk."""
        if not text:
            return "empty reply"
        faults = [f for f in reply_faults(text) if f in ("refusal", "helpdesk")]
        return f"{faults[0]} from the simulated person" if faults else None

    def reply_command(update: dict[str, Any], text: str, fault: str | None) -> Command:
        if fault:
            logger.warning("user simulator: %s after %d tries; conversation ended", fault, PERSON_TRIES)
            update["fallbacks"] = [
                {"node": USER_NODE, "round": update["round"], "reason": f"{fault}; conversation ended"}
            ]
            return Command(goto=END, update=update)
        update["messages"] = [HumanMessage(text)]
        return Command(goto=next_node, update=update)

    def scripted(state: DirectorState, update: dict[str, Any]) -> Command | None:
        """The scenario's next follow-up, while it has one."""
        scenario = state.get("scenario")
        if not scenario or user == "human":
            return None
        said = sum(isinstance(m, HumanMessage) for m in state.get("messages", []))
        followups = Scenario.model_validate(scenario).followups
        if 1 <= said <= len(followups):
            return Command(goto=next_node, update={**update, "messages": [HumanMessage(followups[said - 1])]})
        return None

    def begin(state: DirectorState) -> tuple[dict[str, Any], Command | None]:
        update = close_round(state)
        if update["round"] >= max_rounds or user is None:
            return update, Command(goto=END, update=update)
        scenario = state.get("scenario")
        if not state.get("messages") and scenario and user != "human":
            opening = Scenario.model_validate(scenario).opening
            return update, Command(goto=next_node, update={**update, "messages": [HumanMessage(opening)]})
        return update, None

    def take_turn(state: DirectorState) -> Command:
        update, done = begin(state)
        if done is not None:
            return done
        if user == "human":
            answer = interrupt({"round": update["round"], "roster": roster.id})
            if not isinstance(answer, str) or not answer.strip():
                return Command(goto=END, update=update)
            update["messages"] = [HumanMessage(answer.strip())]
            return Command(goto=next_node, update=update)
        if (command := scripted(state, update)) is not None:
            return command
        assert isinstance(user, BaseChatModel)
        for _ in range(PERSON_TRIES):
            text = clean_reply(user.invoke(prompt(state)).text, own=own, others=others)
            if (fault := person_fault(text)) is None:
                break
        return reply_command(update, text, fault)

    async def atake_turn(state: DirectorState) -> Command:
        if user == "human" or user is None:
            return take_turn(state)
        update, done = begin(state)
        if done is not None:
            return done
        if (command := scripted(state, update)) is not None:
            return command
        for _ in range(PERSON_TRIES):
            text = clean_reply((await user.ainvoke(prompt(state))).text, own=own, others=others)
            if (fault := person_fault(text)) is None:
                break
        return reply_command(update, text, fault)

    return Node(USER_NODE, take_turn, atake_turn)
