"""mascot: direct ensembles of LLM personas with a trained Director.

The public API in one place; everything here imports without torch.
"""

from mascot.graphs import (
    BASELINES,
    DirectorState,
    StageDirection,
    create_baseline_graph,
    create_director_graph,
    openai_messages,
)
from mascot.policies import Policies, PolicyError, PolicySpec
from mascot.rosters import (
    USER,
    Persona,
    Roster,
    RosterError,
    Scenario,
    UserProfile,
    list_rosters,
    load_roster,
    load_scenarios,
)

__all__ = [
    "BASELINES",
    "USER",
    "DirectorState",
    "Persona",
    "Policies",
    "PolicyError",
    "PolicySpec",
    "Roster",
    "RosterError",
    "Scenario",
    "StageDirection",
    "UserProfile",
    "create_baseline_graph",
    "create_director_graph",
    "list_rosters",
    "load_roster",
    "load_scenarios",
    "openai_messages",
]
