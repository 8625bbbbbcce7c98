"""The director graph that `langgraph dev` and LangGraph Studio serve, set up from the environment.

``langgraph.json`` at the repository root names ``mascot.studio:studio_graph``. The server
passes no arguments to a graph factory, so the roster and the models come from variables:

- ``MASCOT_ROSTER``: a shipped roster id or a roster file (default ``emotional_support``);
- ``MASCOT_POLICIES``: a policy file (a model per role), or
- ``MASCOT_MODEL``: one local model for every role (a model folder, e.g. one made by
  ``mascot offline-model`` or ``mascot tiny-model``, or a Hub id);
- neither: the offline model where ``mascot offline-model`` is told to put it by the
  README and CI (``$MASCOT_CACHE``, else ``~/.cache/mascot``, then
  ``qwen2.5-coder-0.5b-instruct``), when it has been built there.

The server asks the factory for the graph on every run and state read; the graph (and the
weights of local models) is built once per set of values and reused.
"""

from __future__ import annotations

import asyncio
import os
import threading
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path

from langgraph.graph.state import CompiledStateGraph

from mascot.graphs import create_director_graph
from mascot.offline.model import default_cache, is_offline_model
from mascot.policies import Policies, PolicyError, PolicySpec
from mascot.rosters import RosterError, load_roster

ROSTER_VAR = "MASCOT_ROSTER"
POLICIES_VAR = "MASCOT_POLICIES"
MODEL_VAR = "MASCOT_MODEL"
#: The roster served when ``MASCOT_ROSTER`` is unset.
DEFAULT_ROSTER = "emotional_support"
#: The folder name of the offline model served when no model variable is set.
DEFAULT_MODEL_FOLDER = "qwen2.5-coder-0.5b-instruct"

# one build at a time: two first runs arriving together must not load the weights twice
_build_lock = threading.Lock()


class StudioError(ValueError):
    """A ``MASCOT_*`` variable is missing or holds a bad value; the message is one line
    that names the variable."""


async def studio_graph() -> CompiledStateGraph:
    """The graph factory of ``langgraph.json``: the director graph of the ``MASCOT_*``
    variables, compiled without a checkpointer (the server brings its own).

    Each run is one round (``user=None``): the Director picks the voices, they answer, and
    the run ends when the turn returns to the person; the next message is a new run on the
    same thread, as Studio's chat sends it. The build runs in a worker thread, so loading
    weights never blocks the server's event loop.

    Returns:
        The compiled graph.

    Raises:
        StudioError: on a missing or bad variable (see ``graph_from_env``).
    """
    return await asyncio.to_thread(graph_from_env)


def graph_from_env(environ: Mapping[str, str] | None = None) -> CompiledStateGraph:
    """Build (or reuse) the director graph that the ``MASCOT_*`` variables describe.

    Args:
        environ: The variables to read; ``None`` reads ``os.environ``. Relative paths are
            taken from the current directory (where ``langgraph dev`` runs).

    Returns:
        The director graph with structured-output directions, compiled without a
        checkpointer; the same object for the same values.

    Raises:
        StudioError: if the roster is unknown or invalid, both ``MASCOT_POLICIES`` and
            ``MASCOT_MODEL`` are set, neither is and the offline model is not built, or
            the policy file or model cannot be read or loaded.
    """
    env = os.environ if environ is None else environ
    roster = env.get(ROSTER_VAR, "").strip() or DEFAULT_ROSTER
    policies = env.get(POLICIES_VAR, "").strip() or None
    model = env.get(MODEL_VAR, "").strip() or None
    if policies and model:
        raise StudioError(f"set {POLICIES_VAR} or {MODEL_VAR}, not both (got {policies!r} and {model!r})")
    if not policies and not model:
        offline = default_model()
        if not is_offline_model(offline):
            raise StudioError(
                f"set {POLICIES_VAR} to a policy file, or {MODEL_VAR} to a model folder or Hub id "
                f"(e.g. a folder made by `mascot tiny-model`), or build the default model: "
                f"mascot offline-model --out {offline}"
            )
        model = str(offline)
    with _build_lock:
        return _build(roster, policies, model)


def default_model() -> Path:
    """The offline model's folder served when neither model variable is set (it may not exist)."""
    return default_cache().parent / DEFAULT_MODEL_FOLDER


@lru_cache(maxsize=4)
def _build(roster_name: str, policy_file: str | None, model: str | None) -> CompiledStateGraph:
    try:
        roster = load_roster(roster_name)
    except RosterError as exc:
        raise StudioError(f"{ROSTER_VAR}: {exc}") from None
    variable = POLICIES_VAR if policy_file else MODEL_VAR
    try:
        if policy_file:
            policies = Policies.from_file(policy_file, roster)
        else:
            policies = Policies.single(PolicySpec(kind="local", model=str(model)), roster)
        director, speakers = policies.chat_model("director"), policies.speakers()
    except PolicyError as exc:
        raise StudioError(f"{variable}: {exc}") from None
    builder = create_director_graph(roster, director=director, speakers=speakers, structured_output=True)
    return builder.compile()
