"""Pydantic models of a roster: personas, director guidance, user profiles, scenarios."""

from __future__ import annotations

from typing import Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

#: Reserved speaker id that hands the turn back to the person in the conversation.
USER = "user"

_ID_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
_MAX_PERSONAS = 12
_MAX_TEXT = 4000


class _Strict(BaseModel):
    """Base for roster data: unknown fields are errors, strings are stripped."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)


class Persona(_Strict):
    """One speaker of the ensemble.

    Attributes:
        id: Stable identifier (lower snake case); also the LangGraph node name and the
            ``name`` of every message the persona writes.
        name: Display name, e.g. ``The Anchor``.
        role: Short role label, e.g. ``emotional validator``.
        persona: The persona text: traits, outlook, what the persona brings.
        goals: What the persona tries to achieve in a conversation.
        style: How the persona speaks.
        boundaries: What the persona never does.
    """

    id: str = Field(pattern=_ID_PATTERN)
    name: str = Field(min_length=1, max_length=60)
    role: str = Field(min_length=1, max_length=80)
    persona: str = Field(min_length=40, max_length=_MAX_TEXT)
    goals: list[str] = Field(min_length=1, max_length=10)
    style: str = Field(min_length=1, max_length=_MAX_TEXT)
    boundaries: list[str] = Field(min_length=1, max_length=10)

    @field_validator("id")
    @classmethod
    def _not_reserved(cls, value: str) -> str:
        if value == USER:
            raise ValueError(f"'{USER}' is reserved for the person in the conversation")
        return value

    @field_validator("goals", "boundaries")
    @classmethod
    def _non_empty_items(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("items must be non-empty text")
        return [item.strip() for item in value]


class DirectorGuidance(_Strict):
    """What the Director should optimise for in this domain."""

    guidance: str = Field(min_length=20, max_length=_MAX_TEXT)


class Ocean(_Strict):
    """Big Five (OCEAN) trait scores, each from 0.0 (low) to 1.0 (high)."""

    openness: float = Field(ge=0.0, le=1.0)
    conscientiousness: float = Field(ge=0.0, le=1.0)
    extraversion: float = Field(ge=0.0, le=1.0)
    agreeableness: float = Field(ge=0.0, le=1.0)
    neuroticism: float = Field(ge=0.0, le=1.0)

    def describe(self) -> str:
        """Return the traits as short words a simulator prompt can use."""
        words = []
        for trait, value in self.model_dump().items():
            level = "high" if value >= 0.67 else "low" if value <= 0.33 else "moderate"
            words.append(f"{level} {trait}")
        return ", ".join(words)


class UserProfile(_Strict):
    """A person the user simulator can play."""

    id: str = Field(pattern=_ID_PATTERN)
    name: str = Field(min_length=1, max_length=60)
    ocean: Ocean
    situation: str = Field(min_length=10, max_length=_MAX_TEXT)
    style: str = Field(min_length=1, max_length=_MAX_TEXT)


class Scenario(_Strict):
    """An opening situation: what the person says first and what lies behind it."""

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9_\-]{0,59}$")
    opening: str = Field(min_length=5, max_length=_MAX_TEXT)
    context: str = Field(min_length=5, max_length=_MAX_TEXT)
    valence: Literal["negative", "mixed", "positive"]
    difficulty: Literal["easy", "medium", "hard"]
    topics: list[str] = Field(default_factory=list, max_length=10)


_Item = TypeVar("_Item", Persona, UserProfile)


class Roster(_Strict):
    """A persona ensemble for one domain, with director guidance and user profiles."""

    id: str = Field(pattern=_ID_PATTERN)
    version: int = Field(ge=1)
    domain: str = Field(min_length=1, max_length=80)
    description: str = Field(min_length=1, max_length=_MAX_TEXT)
    personas: list[Persona] = Field(min_length=2, max_length=_MAX_PERSONAS)
    director: DirectorGuidance
    user_profiles: list[UserProfile] = Field(min_length=1, max_length=100)

    @model_validator(mode="after")
    def _unique_ids(self) -> Roster:
        for label, ids in (
            ("persona id", [p.id for p in self.personas]),
            ("persona name", [p.name.lower() for p in self.personas]),
            ("user profile id", [u.id for u in self.user_profiles]),
        ):
            duplicates = sorted({i for i in ids if ids.count(i) > 1})
            if duplicates:
                raise ValueError(f"duplicate {label}: {', '.join(duplicates)}")
        return self

    @property
    def persona_ids(self) -> list[str]:
        """The persona ids in roster order."""
        return [p.id for p in self.personas]

    def persona(self, persona_id: str) -> Persona:
        """Return the persona with this id.

        Raises:
            KeyError: if the roster has no such persona; the message lists the valid ids.
        """
        return _by_id(self.personas, persona_id, "persona")

    def profile(self, profile_id: str) -> UserProfile:
        """Return the user profile with this id.

        Raises:
            KeyError: if the roster has no such profile; the message lists the valid ids.
        """
        return _by_id(self.user_profiles, profile_id, "user profile")


def _by_id(items: list[_Item], item_id: str, kind: str) -> _Item:
    for item in items:
        if item.id == item_id:
            return item
    raise KeyError(f"unknown {kind} '{item_id}'; valid: {', '.join(i.id for i in items)}")
