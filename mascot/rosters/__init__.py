"""Persona rosters as validated data: personas, director guidance, user profiles, scenarios."""

from mascot.rosters.loader import (
    RosterError,
    list_rosters,
    load_profiles,
    load_roster,
    load_scenarios,
    roster_path,
    scenario_path,
)
from mascot.rosters.models import (
    DEFAULT_RESOURCES,
    RESERVED_IDS,
    USER,
    DirectorGuidance,
    Ocean,
    Persona,
    Roster,
    SafetyRule,
    Scenario,
    UserProfile,
)
from mascot.rosters.probes import (
    GroupthinkProbe,
    LabelledReplies,
    LabelledReply,
    ProbeSet,
    ProbeSetError,
    load_labelled_replies,
    load_probes,
)
from mascot.rosters.reference import schema_reference
from mascot.rosters.scaffold import scaffold_roster

__all__ = [
    "DEFAULT_RESOURCES",
    "RESERVED_IDS",
    "USER",
    "DirectorGuidance",
    "GroupthinkProbe",
    "LabelledReplies",
    "LabelledReply",
    "Ocean",
    "Persona",
    "ProbeSet",
    "ProbeSetError",
    "Roster",
    "RosterError",
    "SafetyRule",
    "Scenario",
    "UserProfile",
    "list_rosters",
    "load_labelled_replies",
    "load_probes",
    "load_profiles",
    "load_roster",
    "load_scenarios",
    "roster_path",
    "scaffold_roster",
    "scenario_path",
    "schema_reference",
]
