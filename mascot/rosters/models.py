"""Pydantic models of a roster: personas, director guidance, user profiles, scenarios.

Every field carries a ``description``: the schema reference (docs/rosters.md) and the commented
``roster.yaml`` that ``mascot rosters new`` writes are generated from them.
"""

from __future__ import annotations

import re
from typing import Annotated, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator

#: Reserved speaker id that hands the turn back to the person in the conversation.
USER = "user"

#: Ids no persona may take, each with the reason. A persona id is its graph node's name
#: and its policy role, so it must differ from the graphs' other nodes (mascot.graphs:
#: ``DIRECTOR_NODE``, ``USER_NODE``, the single baseline's ``assistant``) and from the
#: policy file's fixed roles (mascot.policies ``FIXED_ROLES``); tests keep these in step.
RESERVED_IDS: dict[str, str] = {
    "director": "it names the Director's node in the graph",
    USER: "it names the person's turn in the graph (the speaker that hands the turn back)",
    "assistant": "it names the single baseline's assistant node in the graph",
    "judge": "it names the judge's role in a policy file",
    "default": "it names the fallback role in a policy file",
    "speakers": "it names every persona at once in the CLI's `--max-tokens speakers=N`",
}

ID_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
SCENARIO_ID_PATTERN = r"^[a-z0-9][a-z0-9_\-]{0,59}$"
_ID_RULE = "a lower-case letter, then lower-case letters, digits or `_`; 40 characters at most"
_MAX_PERSONAS = 12
_MAX_TEXT = 4000


class _Strict(BaseModel):
    """Base for roster data: unknown fields are errors, strings are stripped."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True, frozen=True)


class Persona(_Strict):
    """One speaker of the ensemble: an item of the roster's `personas` list."""

    id: str = Field(
        pattern=ID_PATTERN,
        description=f"Stable identifier ({_ID_RULE}); also the persona's graph node, policy role and the "
        f"`name` of every message it writes. Unique in the roster. Reserved: "
        f"{', '.join(f'`{i}`' for i in RESERVED_IDS)}.",
    )
    name: str = Field(min_length=1, max_length=60,
                      description="Display name, e.g. `The Anchor`. Unique in the roster (ignoring case).")
    role: str = Field(min_length=1, max_length=80, description="Short role label, e.g. `emotional validator`.")
    persona: str = Field(min_length=40, max_length=_MAX_TEXT,
                         description="The persona text: traits, outlook, what this persona brings that the "
                                     "others do not.")
    goals: list[str] = Field(min_length=1, max_length=10,
                             description="What the persona tries to achieve in a conversation; each item "
                                         "non-empty text.")
    style: str = Field(min_length=1, max_length=_MAX_TEXT,
                       description="How the persona speaks: length, wording, typical moves.")
    boundaries: list[str] = Field(min_length=1, max_length=10,
                                  description="What the persona never does; each item non-empty text.")

    @field_validator("goals", "boundaries")
    @classmethod
    def _non_empty_items(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("items must be non-empty text")
        return [item.strip() for item in value]


class DirectorGuidance(_Strict):
    """What the Director should optimise for in this domain: the roster's `director` mapping."""

    guidance: str = Field(min_length=20, max_length=_MAX_TEXT,
                          description="Instructions for the Director: who should speak when, what a good "
                                      "conversation in this domain looks like, what to avoid.")


class Ocean(_Strict):
    """Big Five (OCEAN) trait scores of a user profile: its `ocean` mapping."""

    openness: float = Field(ge=0.0, le=1.0, description="Openness to experience, 0.0 (low) to 1.0 (high).")
    conscientiousness: float = Field(ge=0.0, le=1.0, description="Conscientiousness, 0.0 (low) to 1.0 (high).")
    extraversion: float = Field(ge=0.0, le=1.0, description="Extraversion, 0.0 (low) to 1.0 (high).")
    agreeableness: float = Field(ge=0.0, le=1.0, description="Agreeableness, 0.0 (low) to 1.0 (high).")
    neuroticism: float = Field(ge=0.0, le=1.0, description="Neuroticism, 0.0 (low) to 1.0 (high).")

    def describe(self) -> str:
        """Return the traits as short words a simulator prompt can use."""
        words = []
        for trait, value in self.model_dump().items():
            level = "high" if value >= 0.67 else "low" if value <= 0.33 else "moderate"
            words.append(f"{level} {trait}")
        return ", ".join(words)


class UserProfile(_Strict):
    """A person the user simulator can play: an item of the roster's `user_profiles` list."""

    id: str = Field(pattern=ID_PATTERN, description=f"Stable identifier ({_ID_RULE}); unique in the roster.")
    name: str = Field(min_length=1, max_length=60, description="The person's first name, e.g. `Maya`.")
    ocean: Ocean = Field(description="Big Five trait scores: a mapping of all five traits.")
    situation: str = Field(min_length=10, max_length=_MAX_TEXT,
                           description="Who the person is and what they are dealing with.")
    style: str = Field(min_length=1, max_length=_MAX_TEXT, description="How the person writes their messages.")


class Scenario(_Strict):
    """An opening situation: one JSON object per line of `scenarios.jsonl`."""

    id: str = Field(pattern=SCENARIO_ID_PATTERN,
                    description="Stable identifier: a lower-case letter or digit, then lower-case letters, "
                                "digits, `_` or `-`; 60 characters at most; unique in the file.")
    opening: str = Field(min_length=5, max_length=_MAX_TEXT, description="What the person says first.")
    context: str = Field(min_length=5, max_length=_MAX_TEXT,
                         description="What lies behind the opening (the simulated person knows it; the "
                                     "personas do not).")
    valence: Literal["negative", "mixed", "positive"] = Field(description="The emotional tone of the situation.")
    difficulty: Literal["easy", "medium", "hard"] = Field(description="How hard the conversation is to get right.")
    topics: list[str] = Field(default_factory=list, max_length=10, description="Short topic tags.")
    followups: list[Annotated[str, Field(min_length=2, max_length=_MAX_TEXT)]] = Field(
        default_factory=list, max_length=10,
        description="What the person says at the start of the rounds after the first, "
                    "in order, written in advance (the same for every system an "
                    "evaluation compares); past the list, or without one, the simulated "
                    "person speaks.")


#: What a routed voice gives when a safety rule fires and neither the rule nor the
#: deployment sets resources of its own (a deployment sets its country's numbers).
DEFAULT_RESOURCES = ("If you are in danger or might act on these thoughts, please call your local emergency "
                     "number now, or reach a crisis line in your country (in the US, call or text 988); you "
                     "do not have to go through this alone.")


class SafetyRule(_Strict):
    """A crisis the round must answer in a fixed way: an item of the roster's `safety` list.

    When the person's message matches the rule (a pattern, or close enough in meaning to a
    trigger example), the voices of `route` speak in that order, the `forbidden` voices do not
    speak in that round, and `resources_by` gives the resource text, whatever the Director writes.
    """

    name: str = Field(pattern=ID_PATTERN, description=f"The rule's name ({_ID_RULE}), e.g. `self_harm`; "
                                                      "unique in the roster; recorded as the guard that fired.")
    description: str = Field(min_length=5, max_length=_MAX_TEXT,
                             description="When the rule applies, in one sentence (the Director and judges read it).")
    triggers: list[str] = Field(min_length=3, max_length=200,
                                description="Example messages that call for the rule (at least 3), in varied "
                                            "wording, indirect ones included: the detector's classifier is fitted "
                                            "on them (the shipped rules have about 90 each).")
    near_misses: list[str] = Field(default_factory=list, max_length=200,
                                   description="Messages that share words or themes with the triggers but call for "
                                               "nothing (idioms, games, films, work jargon, ordinary sadness, past "
                                               "events): the classifier is fitted to keep them out, with every "
                                               "rule's near misses and a few everyday messages.")
    patterns: list[str] = Field(default_factory=list, max_length=50,
                                description="Regular expressions (Python, matched case-insensitively) that fire "
                                            "the rule on their own; keep them unambiguous (first person, no "
                                            "idioms such as 'this exam is killing me').")
    route: list[str] = Field(min_length=1, max_length=_MAX_PERSONAS,
                             description="Persona ids that must speak in that round, in order.")
    forbidden: list[str] = Field(default_factory=list, max_length=_MAX_PERSONAS,
                                 description="Persona ids that must not speak in that round.")
    resources_by: str | None = Field(default=None, description="The persona id of the route that gives the "
                                                              "resources; default the route's last voice.")
    persists_rounds: int | None = Field(default=None, ge=0, le=1000,
                                        description="The most rounds after the one it fired in during which the rule "
                                                    "stays in force: its `forbidden` voices stay out and the Director "
                                                    "reads why (the route and the resources are for the round it fired "
                                                    "in); default: while the conversation's running risk stays up "
                                                    "(several calm rounds); 0: that round only.")
    resources: str | None = Field(default=None, min_length=10, max_length=_MAX_TEXT,
                                  description="The resource text that voice must give; default a text that says to "
                                              "call the local emergency number or a crisis line (a deployment may "
                                              "set its own).")

    @field_validator("triggers", "near_misses")
    @classmethod
    def _non_empty_triggers(cls, value: list[str]) -> list[str]:
        if any(not item.strip() for item in value):
            raise ValueError("items must be non-empty text")
        return [item.strip() for item in value]

    @field_validator("patterns")
    @classmethod
    def _compiles(cls, value: list[str]) -> list[str]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"pattern {pattern!r} is not a regular expression ({exc})") from None
        return value

    @property
    def giver(self) -> str:
        """The persona id that gives the resources."""
        return self.resources_by or self.route[-1]


def _not_reserved(persona: Persona) -> Persona:
    """Refuse a reserved id in a roster (not in ``Persona``: the single baseline's
    assistant is a persona, outside any roster file)."""
    if persona.id in RESERVED_IDS:
        raise ValueError(f"persona id '{persona.id}' is reserved: {RESERVED_IDS[persona.id]}; choose another id")
    return persona


_Item = TypeVar("_Item", Persona, UserProfile)


class Roster(_Strict):
    """A persona ensemble for one domain, with director guidance and user profiles: all of `roster.yaml`."""

    id: str = Field(pattern=ID_PATTERN, description=f"Stable identifier ({_ID_RULE}).")
    version: int = Field(ge=1, description="Version of this roster, a whole number; raise it when personas change.")
    domain: str = Field(min_length=1, max_length=80, description="The domain in a few words, e.g. `emotional support`.")
    description: str = Field(min_length=1, max_length=_MAX_TEXT,
                             description="What the ensemble is for and how its voices complement each other.")
    personas: list[Annotated[Persona, AfterValidator(_not_reserved)]] = Field(
        min_length=2, max_length=_MAX_PERSONAS, description="The speakers; ids and names unique, ids not reserved."
    )
    director: DirectorGuidance = Field(description="Guidance for the Director: a mapping with `guidance`.")
    user_profiles: list[UserProfile] = Field(min_length=1, max_length=100,
                                             description="The people the user simulator plays; ids unique.")
    voices_see: Literal["person", "round", "conversation"] = Field(
        default="conversation",
        description="What each voice sees of the conversation when it speaks: `person` (the person's messages "
                    "only: voices cannot echo or defer to each other), `round` (the person's messages and the "
                    "voices heard since the person's latest message) or `conversation` (everything). A stage "
                    "direction's `sees` overrides it for one turn.")
    safety: list[SafetyRule] = Field(default_factory=list, max_length=20,
                                     description="Crisis rules the graph enforces whatever the Director writes "
                                                 "(see docs/safety.md); names unique, every id a "
                                                 "persona of the roster, no voice both routed and forbidden.")

    # field validators, not one model validator: they run even when another field is
    # invalid, so a file's duplicates are reported together with its other problems
    @field_validator("personas")
    @classmethod
    def _unique_personas(cls, personas: list[Persona]) -> list[Persona]:
        _refuse_duplicates("persona id", [p.id for p in personas])
        _refuse_duplicates("persona name", [p.name.lower() for p in personas])
        return personas

    @field_validator("user_profiles")
    @classmethod
    def _unique_profiles(cls, profiles: list[UserProfile]) -> list[UserProfile]:
        _refuse_duplicates("user profile id", [u.id for u in profiles])
        return profiles

    @field_validator("safety")
    @classmethod
    def _safety_voices(cls, rules: list[SafetyRule], info: ValidationInfo) -> list[SafetyRule]:
        _refuse_duplicates("safety rule", [r.name for r in rules])
        if "personas" not in info.data:  # the personas are invalid: reported on their own
            return rules
        ids = [p.id for p in info.data["personas"]]
        for rule in rules:
            unknown = sorted({*rule.route, *rule.forbidden, rule.giver} - set(ids))
            if unknown:
                raise ValueError(f"safety rule '{rule.name}' names unknown persona ids {', '.join(unknown)}; "
                                 f"valid: {', '.join(ids)}")
            both = sorted(set(rule.route) & set(rule.forbidden))
            if both:
                raise ValueError(f"safety rule '{rule.name}' both routes and forbids {', '.join(both)}")
            _refuse_duplicates(f"voice in the route of safety rule '{rule.name}'", rule.route)
            if rule.giver not in rule.route:
                raise ValueError(f"safety rule '{rule.name}': resources_by '{rule.giver}' is not in its route "
                                 f"({', '.join(rule.route)})")
        return rules

    def safety_rule(self, name: str) -> SafetyRule:
        """Return the safety rule of this name.

        Raises:
            KeyError: if the roster has no such rule; the message lists the valid names.
        """
        for rule in self.safety:
            if rule.name == name:
                return rule
        raise KeyError(f"unknown safety rule '{name}'; valid: {', '.join(r.name for r in self.safety) or '-'}")

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


def _refuse_duplicates(label: str, ids: list[str]) -> None:
    duplicates = sorted({i for i in ids if ids.count(i) > 1})
    if duplicates:
        raise ValueError(f"duplicate {label}: {', '.join(duplicates)}")


def _by_id(items: list[_Item], item_id: str, kind: str) -> _Item:
    for item in items:
        if item.id == item_id:
            return item
    raise KeyError(f"unknown {kind} '{item_id}'; valid: {', '.join(i.id for i in items)}")
