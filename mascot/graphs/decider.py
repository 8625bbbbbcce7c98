"""The Director's decision: its model call (JSON or structured output) and the reply read into a valid direction.

``Decider`` offers the voices in their shuffled order, builds the prompt, calls the
Director's model (structured output where asked and supported) and interprets the reply:
a malformed or impossible direction is repaired or replaced by the fallback, with the
reason recorded, never raised. The director graph's node, the routing evaluation and the
warm-start samples use it alike.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.runnables import Runnable, RunnableConfig
from openai import LengthFinishReasonError

from mascot.graphs.direction import StageDirection, direction_schema, interpret_direction
from mascot.graphs.prompts import director_messages
from mascot.graphs.state import offered_speakers, round_speakers
from mascot.rosters import Roster

logger = logging.getLogger(__name__)


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

