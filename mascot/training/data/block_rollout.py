"""Director decision points, and rolling a conversation forward from one for N turns.

A *decision point* is a prefix of a recorded episode where the Director was (or would be)
asked who speaks next: after the person's message, or after a persona's turn while the
round has room for another voice. ``BlockRollout`` takes a stage direction written for a
decision point and plays it in the real director graph: the direction is interpreted
exactly as at inference (repairs and fallbacks included), the chosen persona speaks with
its current policy, and the conversation goes on, the later decisions made by the
continuation Director and the person played by the user simulator, until the block has
``block_turns`` new turns (or the conversation ends). Rollouts of a batch run concurrently
on one event loop that lives as long as the ``BlockRollout``.
"""

from __future__ import annotations

import asyncio
import hashlib
import threading
from collections.abc import Coroutine, Mapping, Sequence
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any

from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForLLMRun
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langgraph.checkpoint.memory import InMemorySaver

from mascot.graphs import StageDirection, create_director_graph
from mascot.graphs.direction import interpret_direction
from mascot.graphs.prompts import director_messages
from mascot.messages import chat_messages, langchain_message, openai_messages
from mascot.rosters import Roster
from mascot.training.episodes.episode import Episode


@dataclass(frozen=True)
class DecisionPoint:
    """A conversation prefix at which the Director decides.

    Attributes:
        context_id: Stable id of (episode, cut).
        episode_id: The episode the prefix comes from.
        cut: Number of messages in the prefix.
        messages: The prefix as the graph holds it.
        round: Completed rounds in the prefix.
        round_turns: Persona turns since the person's last message.
        scenario: The episode's scenario (for the user simulator).
        user_profile: The episode's person (for the user simulator).
        prompt: What the Director's model sees there (OpenAI messages).
    """

    context_id: str
    episode_id: str
    cut: int
    messages: tuple[BaseMessage, ...]
    round: int
    round_turns: int
    scenario: dict[str, Any] | None
    user_profile: dict[str, Any] | None
    prompt: tuple[dict[str, str], ...]

    def chat(self) -> list[dict[str, Any]]:
        """The prefix as OpenAI messages with persona names (the group RM's context)."""
        return _plain(list(self.messages))


@dataclass(frozen=True)
class Block:
    """What followed one stage direction at a decision point.

    Attributes:
        point: The decision point.
        direction: The direction as the graph interpreted it.
        validity: ``"valid"``, ``"repaired"`` (e.g. a display name for the id, a missing
            tone) or ``"replaced"`` (no JSON, an unknown persona: the fallback spoke).
        turns: The new turns, OpenAI messages with persona names.
    """

    point: DecisionPoint
    direction: StageDirection
    validity: str
    turns: list[dict[str, Any]]


def decision_points(
    episodes: Sequence[Episode], roster: Roster, *, max_speakers_per_round: int = 3, min_speakers_per_round: int = 1
) -> list[DecisionPoint]:
    """Every prefix of ``episodes`` where the Director is asked who speaks next.

    That is after each message of the person or of a persona, except where the round
    already had ``max_speakers_per_round`` persona turns (the graph hands back without
    asking), and in rounds a safety rule governed (``Episode.guards``): the route chose
    there, not the Director, so its choice is neither rewarded nor penalised.

    Raises:
        ValueError: if an episode belongs to another roster.
    """
    points = []
    for episode in episodes:
        if episode.roster != roster.id:
            raise ValueError(f"episode {episode.id} is of roster '{episode.roster}', not '{roster.id}'")
        history: list[BaseMessage] = []
        guarded = {g.get("round") for g in episode.guards}
        rounds, round_turns = -1, 0
        for cut, message in enumerate(episode.messages, start=1):
            history.append(langchain_message(message.role, message.content, message.name))
            if message.role == "user":
                rounds, round_turns = rounds + 1, 0
            elif message.role == "assistant" and message.name in roster.persona_ids:
                round_turns += 1
            else:
                continue
            if rounds < 0 or round_turns >= max_speakers_per_round or rounds in guarded:
                continue
            prompt = director_messages(roster, history, round_turns=round_turns,
                                       max_speakers_per_round=max_speakers_per_round,
                                       min_speakers_per_round=min_speakers_per_round)
            points.append(DecisionPoint(
                context_id=hashlib.sha256(f"{episode.id}|{cut}|director".encode()).hexdigest()[:16],
                episode_id=episode.id, cut=cut, messages=tuple(history), round=rounds, round_turns=round_turns,
                scenario=episode.scenario.model_dump() if episode.scenario else None,
                user_profile=episode.user_profile.model_dump() if episode.user_profile else None,
                prompt=tuple(chat_messages(prompt)),
            ))
    return points


class BlockRollout:
    """Plays stage directions at decision points in the director graph, ``block_turns`` each."""

    def __init__(
        self,
        roster: Roster,
        *,
        speakers: BaseChatModel | Mapping[str, BaseChatModel],
        director: BaseChatModel,
        user: BaseChatModel | None,
        block_turns: int,
        max_speakers_per_round: int = 3,
        min_speakers_per_round: int = 1,
        concurrency: int = 8,
    ) -> None:
        """Hold the policies; starts the event loop thread the rollouts run on.

        Args:
            roster: The roster.
            speakers: The current speaker policies (one model, or one per persona id).
            director: The continuation Director: decides the block's later turns.
            user: The user simulator; ``None`` ends a block when the turn returns to the person.
            block_turns: New turns per block (persona and person turns alike).
            max_speakers_per_round: As in ``create_director_graph``.
            min_speakers_per_round: As in ``create_director_graph``.
            concurrency: Rollouts played at once.

        Raises:
            ValueError: on ``block_turns`` or ``concurrency`` below 1.
        """
        if block_turns < 1 or concurrency < 1:
            raise ValueError(f"block_turns={block_turns}, concurrency={concurrency}: both must be at least 1")
        self.roster = roster
        self.block_turns = block_turns
        self._speakers, self._director, self._user = speakers, director, user
        self.max_speakers_per_round = max_speakers_per_round
        self._limits = {"max_speakers_per_round": max_speakers_per_round,
                        "min_speakers_per_round": min_speakers_per_round}
        self._concurrency = concurrency
        self._loop = asyncio.new_event_loop()
        threading.Thread(target=self._loop.run_forever, name="block-rollout", daemon=True).start()

    def run(self, points: Sequence[DecisionPoint], directions: Sequence[str]) -> list[Block]:
        """Play ``directions[i]`` (a Director model's output) at ``points[i]``; one block each."""
        if len(points) != len(directions):
            raise ValueError(f"{len(points)} decision points but {len(directions)} directions")
        return self._wait(self._run_all(points, directions, range(len(points))))

    def run_samples(self, points: Sequence[DecisionPoint], samples: Sequence[int]) -> list[Block]:
        """Let the continuation Director decide at ``points[i]`` too, with sampling seeded by
        the point and ``samples[i]``; one block each (sibling blocks, see ``sibling_blocks``)."""
        if len(points) != len(samples):
            raise ValueError(f"{len(points)} decision points but {len(samples)} sample numbers")
        return self._wait(self._run_all(points, [None] * len(points), samples))

    def close(self) -> None:
        """Stop the event loop thread."""
        self._loop.call_soon_threadsafe(self._loop.stop)

    def _wait(self, coroutine: Coroutine[Any, Any, list[Block]]) -> list[Block]:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    async def _run_all(self, points: Sequence[DecisionPoint], directions: Sequence[str | None],
                       samples: Sequence[int]) -> list[Block]:
        gate = asyncio.Semaphore(self._concurrency)

        async def one(index: int) -> Block:
            async with gate:
                return await self._play(points[index], directions[index], sample=samples[index])

        return list(await asyncio.gather(*(one(i) for i in range(len(points)))))

    async def _play(self, point: DecisionPoint, output: str | None, *, sample: int) -> Block:
        director = self._director if output is None else _FirstThen(first=output, then=self._director)
        graph = create_director_graph(
            self.roster, director=director, speakers=self._speakers,
            user=self._user, max_rounds=point.round + self.block_turns + 1, structured_output=True, **self._limits,
        ).compile(checkpointer=InMemorySaver())
        config = {"configurable": {"thread_id": f"{point.context_id}-{sample}"},
                  "metadata": {"episode_id": point.context_id, "sample": sample},
                  "recursion_limit": 4 * self.block_turns + 10}
        state = {"messages": list(point.messages), "round": point.round, "round_turns": point.round_turns,
                 "scenario": point.scenario, "user_profile": point.user_profile}
        if isinstance(point.messages[-1], HumanMessage):
            start: dict[str, Any] | None = state
        else:  # mid-round: continue as if that persona had just spoken
            await graph.aupdate_state(config, state, as_node=point.messages[-1].name)
            start = None
        turns: list[BaseMessage] = []
        decided: list[dict[str, Any]] = []
        # aclosing: leaving the stream early must close the graph run here, not at GC
        async with aclosing(graph.astream(start, config, stream_mode="updates")) as updates:
            async for update in updates:
                for node, values in update.items():
                    if node == "director" and values:
                        decided.extend(values.get("directions") or [])
                    elif values and values.get("messages"):
                        turns.extend(values["messages"])
                if len(turns) >= self.block_turns:
                    break
        if decided:  # the graph's own reading of the first decision (the one under test)
            direction = StageDirection.model_validate(decided[0])
        else:  # the graph ended before deciding (e.g. the round limit)
            direction = interpret_direction(
                output or "", self.roster, recent_speakers=[m.name for m in point.messages if isinstance(m, AIMessage)],
                round_turns=point.round_turns, min_speakers_per_round=self._limits["min_speakers_per_round"])
        validity = "valid" if not direction.fallback else (
            "repaired" if direction.fallback.startswith("repaired") else "replaced")
        return Block(point=point, direction=direction, validity=validity, turns=_plain(turns[: self.block_turns]))


def _plain(messages: list[BaseMessage]) -> list[dict[str, Any]]:
    """OpenAI messages with only ``role``, ``content`` and ``name`` (no stage directions)."""
    return [{k: v for k, v in m.items() if k in ("role", "content", "name")} for m in openai_messages(messages)]


class _FirstThen(BaseChatModel):
    """Answers its first call with a given text (the direction under test), then delegates."""

    first: str
    then: BaseChatModel
    used: bool = False

    @property
    def _llm_type(self) -> str:
        return "first-then"

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: CallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if not self.used:
            self.used = True
            return ChatResult(generations=[ChatGeneration(message=AIMessage(self.first))])
        return ChatResult(generations=[ChatGeneration(message=self.then.invoke(messages, stop=stop, **kwargs))])

    async def _agenerate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                         run_manager: AsyncCallbackManagerForLLMRun | None = None, **kwargs: Any) -> ChatResult:
        if not self.used:
            self.used = True
            return ChatResult(generations=[ChatGeneration(message=AIMessage(self.first))])
        reply = await self.then.ainvoke(messages, stop=stop, **kwargs)
        return ChatResult(generations=[ChatGeneration(message=reply)])
