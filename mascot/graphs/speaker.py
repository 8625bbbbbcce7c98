"""The persona speaker node: persona prompt + conversation + stage direction -> one turn."""

from __future__ import annotations

import logging
import time
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage

from mascot.graphs.direction import StageDirection
from mascot.graphs.faults import copies_voice
from mascot.graphs.node import Node
from mascot.graphs.prompts import speaker_messages
from mascot.graphs.reply import (
    clean_reply,
    cut_quotes,
    echoes,
    speaker_labels,
    strip_cues,
    user_labels,
    word_count,
)
from mascot.graphs.safety import has_resources
from mascot.graphs.state import DirectorState, round_messages
from mascot.rosters import Persona, Roster

logger = logging.getLogger(__name__)

#: Words a reply must keep after a repeated message is cut from it to stay a turn.
MIN_WORDS_LEFT = 3


def speaker_node(roster: Roster, persona: Persona, model: BaseChatModel) -> Node:
    """Build the node in which ``persona`` speaks, following the latest stage direction.

    The reply is attributed to the persona (``name=<persona id>``), carries the
    direction under ``additional_kwargs["stage_direction"]`` and the model's metadata
    (model name, adapter, token usage, and the call's ``latency_s``). Name prefixes are stripped and lines written
    for other speakers (or the Director) are cut, copied stage cues removed, and long runs
    repeated verbatim from the person's messages (``cut_quotes``) are cut and recorded as a
    fallback. An empty result, one that was mostly the person's message, one that only says
    the direction back, or one that says back a voice heard this round (``reply_fault``
    ``copies_voice``: two voices with the same reply are one voice), is recorded as a
    fallback and the turn is skipped. In a round a safety rule governs, the voice that
    gives the resources always does: a reply without them gets them appended, one that
    would be skipped is replaced by them (both recorded).

    Args:
        roster: The roster the persona belongs to.
        persona: The persona that speaks in this node.
        model: The chat model that writes the persona's turns.

    Returns:
        A node with sync and async paths.
    """
    own = speaker_labels(persona.id, persona.name)
    others = user_labels() + speaker_labels(
        "Director", *(label for p in roster.personas if p.id != persona.id for label in (p.id, p.name))
    )

    def prompt(state: DirectorState) -> tuple[StageDirection, list[BaseMessage]]:
        direction = StageDirection.model_validate(state["directions"][-1])
        return direction, speaker_messages(roster, persona, direction, state["messages"])

    def finish(
        state: DirectorState, direction: StageDirection, reply: BaseMessage, latency_s: float
    ) -> dict[str, Any]:
        text = strip_cues(clean_reply(reply.text, own=own, others=others))
        update: dict[str, Any] = {"round_turns": state.get("round_turns", 0) + 1}
        said = [m.text for m in state["messages"] if m.type == "human"]
        text, quoted = cut_quotes(text, said)
        reason, directed = None, 0
        if quoted and word_count(text) < MIN_WORDS_LEFT:
            reason = f"repeated the person's message ({quoted} words); turn skipped"
        elif not text:
            reason = "empty reply; turn skipped"
        elif any(echoes(text, message) for message in said):
            reason = f"repeated the person's message; turn skipped: {text[:80]!r}"
        elif echoes(text, f"{direction.action} {direction.tone}", names=own):
            reason = f"echoed the stage direction; turn skipped: {text[:80]!r}"
        elif copies_voice(text, [m.text for m in round_messages(state["messages"])]):
            reason = f"repeated a voice heard this round; turn skipped: {text[:80]!r}"
        else:  # the direction is for the voice, not the person: its words do not reach them
            text, directed = cut_quotes(text, [direction.action])
            if directed and word_count(text) < MIN_WORDS_LEFT:
                reason = f"repeated the stage direction ({directed} words); turn skipped"
        resources = (direction.guard or {}).get("resources")
        notes = []
        if reason and resources:  # the person in crisis gets the resources whatever the reply was
            text, reason = resources, None
            notes.append(f"safety rule '{direction.guard['rule']}': the reply could not be used; the resources "
                         "were given alone")
        elif resources and not has_resources(text, resources):
            text = f"{text}\n\n{resources}"
            notes.append(f"safety rule '{direction.guard['rule']}': the reply gave no resources; appended")
        if reason:
            logger.warning("%s: %s", persona.id, reason)
            update["fallbacks"] = [{"node": persona.id, "round": state.get("round", 0), "reason": reason}]
            return update
        if directed:
            notes.insert(0, f"repeated {directed} words of the stage direction; cut")
        if quoted:
            notes.insert(0, f"repeated {quoted} words of the person's message; cut")
        for note in notes:
            logger.warning("%s: %s", persona.id, note)
        if notes:
            update["fallbacks"] = [{"node": persona.id, "round": state.get("round", 0), "reason": n} for n in notes]
        usage = reply.usage_metadata if isinstance(reply, AIMessage) else None
        update["messages"] = [
            AIMessage(
                content=text,
                name=persona.id,
                additional_kwargs={"stage_direction": direction.model_dump(exclude_none=True)},
                response_metadata={**reply.response_metadata, "latency_s": round(latency_s, 4)},
                usage_metadata=usage,
            )
        ]
        return update

    def speak(state: DirectorState) -> dict[str, Any]:
        direction, messages = prompt(state)
        start = time.perf_counter()
        reply = model.invoke(messages)
        return finish(state, direction, reply, time.perf_counter() - start)

    async def aspeak(state: DirectorState) -> dict[str, Any]:
        direction, messages = prompt(state)
        start = time.perf_counter()
        reply = await model.ainvoke(messages)
        return finish(state, direction, reply, time.perf_counter() - start)

    return Node(persona.id, speak, aspeak)
