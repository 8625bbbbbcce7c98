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
    load_profiles,
    load_roster,
    load_scenarios,
)
from mascot.training import (
    Episode,
    JsonlTracer,
    collect_episodes,
    import_checkpoints,
    model_retry_policy,
    read_episodes,
)

__all__ = [
    "BASELINES",
    "USER",
    "DirectorState",
    "Episode",
    "JsonlTracer",
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
    "collect_episodes",
    "create_director_graph",
    "import_checkpoints",
    "list_rosters",
    "load_profiles",
    "load_roster",
    "load_scenarios",
    "model_retry_policy",
    "openai_messages",
    "read_episodes",
]
