"""The director graph's wiring: a Director node, one node per persona and the person's turn, joined into a graph.

``assemble_graph`` is shared by the director graph and the baselines (whose Director
follows a rule, ``mascot.graphs.baselines.rule_director``); ``check_limits`` checks the
round limits both are built with.
"""

from __future__ import annotations

from collections.abc import Mapping

from langchain_core.language_models import BaseChatModel
from langchain_core.runnables import Runnable
from langgraph.graph import START, StateGraph
from langgraph.types import RetryPolicy

from mascot.graphs.approval import APPROVAL_NODE
from mascot.graphs.node import Node
from mascot.graphs.routes import DIRECTOR_NODE, entry
from mascot.graphs.speaker import speaker_node
from mascot.graphs.state import DirectorState
from mascot.graphs.user import USER_NODE, UserKind, user_node
from mascot.rosters import Roster


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
    graph.add_conditional_edges(START, Node("_entry", entry), [DIRECTOR_NODE, USER_NODE])
    return graph


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


def check_limits(max_speakers: int, min_speakers: int, max_rounds: int) -> None:
    """Check a graph's round limits.

    Raises:
        ValueError: if ``max_speakers`` < 1, ``min_speakers`` is not within 0 to
            ``max_speakers``, or ``max_rounds`` < 1.
    """
    if max_speakers < 1:
        raise ValueError(f"max_speakers_per_round must be >= 1, got {max_speakers}")
    if not 0 <= min_speakers <= max_speakers:
        raise ValueError(
            f"min_speakers_per_round must be between 0 and max_speakers_per_round "
            f"({max_speakers}), got {min_speakers}"
        )
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
