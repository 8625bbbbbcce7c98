"""Persona rosters as validated data: personas, director guidance, user profiles, scenarios."""

from mascot.rosters.loader import (
    RosterError,
    list_rosters,
    load_profiles,
    load_roster,
    load_scenarios,
    roster_path,
)
from mascot.rosters.models import (
    USER,
    DirectorGuidance,
    Ocean,
    Persona,
    Roster,
    Scenario,
    UserProfile,
)

__all__ = [
    "USER",
    "DirectorGuidance",
    "Ocean",
    "Persona",
    "Roster",
    "RosterError",
    "Scenario",
    "UserProfile",
    "list_rosters",
    "load_profiles",
    "load_roster",
    "load_scenarios",
    "roster_path",
]
