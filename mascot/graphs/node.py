"""A graph node: sync and async functions of the state that LangGraph's task runs directly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

from langchain_core.runnables import Runnable, RunnableConfig

from mascot.graphs.state import DirectorState


class Node(Runnable[DirectorState, Any]):
    """A node (or branch path) that calls its function without a callback run of its own.

    LangGraph already opens one callback run per node task and runs the node inside that
    run's config context, where the node's model calls, interrupts and ``stream_mode=
    "messages"`` find it. A ``RunnableLambda`` would open a second, nested run per node
    (and inspect the functions' signatures on every call), which was about a quarter of
    the orchestration cost of a turn. So traces show one run per node, with the model
    calls directly under it.

    Args:
        name: Name of the node.
        func: Returns the node's update (or ``Command``) for a state.
        afunc: The async path; without it ``ainvoke`` calls ``func`` (for functions
            that do no I/O).
    """

    def __init__(
        self,
        name: str,
        func: Callable[[DirectorState], Any],
        afunc: Callable[[DirectorState], Awaitable[Any]] | None = None,
    ) -> None:
        self.name = name
        self.func = func
        self.afunc = afunc

    def invoke(self, input: DirectorState, config: RunnableConfig | None = None, **kwargs: Any) -> Any:
        """Run the sync function on the state (the config is LangGraph's context already)."""
        return self.func(input)

    async def ainvoke(
        self, input: DirectorState, config: RunnableConfig | None = None, **kwargs: Any
    ) -> Any:
        """Run the async function on the state, or the sync one if there is none."""
        if self.afunc is None:
            return self.func(input)
        return await self.afunc(input)
