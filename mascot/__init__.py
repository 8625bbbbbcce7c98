"""mascot: direct ensembles of LLM personas with a trained Director.

The public API in one place. Names are imported when first used, so that
``import mascot.rosters`` (which runs this file) does not load LangGraph, LangChain or
the training code; ``from mascot import create_director_graph`` works as usual.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    # for type checkers only; __getattr__ below exports these lazily (the noqa: ruff cannot read
    # __all__, built from _HOME, and would take them for unused imports)
    from mascot.graphs import (  # noqa: F401
        BASELINES,
        DirectorState,
        SafetyGuard,
        StageDirection,
        create_baseline_graph,
        create_director_graph,
        openai_messages,
    )
    from mascot.policies import Policies, PolicyError, PolicySpec  # noqa: F401
    from mascot.rosters import (  # noqa: F401
        USER,
        Persona,
        Roster,
        RosterError,
        Scenario,
        UserProfile,
        list_rosters,
        load_profiles,
        load_roster,
        load_scenarios,
    )
    from mascot.training import (  # noqa: F401
        Episode,
        JsonlTracer,
        collect_episodes,
        import_checkpoints,
        model_retry_policy,
        read_episodes,
    )

# public name -> the subpackage that defines it
_HOME = {
    **dict.fromkeys(
        ("BASELINES", "DirectorState", "SafetyGuard", "StageDirection", "create_baseline_graph",
         "create_director_graph", "openai_messages"), "mascot.graphs"),
    **dict.fromkeys(("Policies", "PolicyError", "PolicySpec"), "mascot.policies"),
    **dict.fromkeys(
        ("USER", "Persona", "Roster", "RosterError", "Scenario", "UserProfile", "list_rosters",
         "load_profiles", "load_roster", "load_scenarios"), "mascot.rosters"),
    **dict.fromkeys(
        ("Episode", "JsonlTracer", "collect_episodes", "import_checkpoints", "model_retry_policy",
         "read_episodes"), "mascot.training"),
}

__all__ = sorted(_HOME)


def __getattr__(name: str) -> Any:
    """Import a public name from its subpackage on first use (PEP 562)."""
    if name not in _HOME:
        raise AttributeError(f"module 'mascot' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOME[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
