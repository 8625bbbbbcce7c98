"""A conversation's running risk: what each person message adds to each safety rule, kept
across messages and decaying slowly.

A classifier of single messages cannot see risk spread over several messages, each harmless
alone ("the house is so quiet since she left", "sitting in the garage with the engine
running, just thinking", "tonight feels right"). The running risk adds up, per rule:

- the detector's probability of the rule for the message, above ``FLOOR``;
- for the rules in ``STAGED_RULES``, the signals of the recognised stages of suicide-risk
  screening the message shows (``STAGES``: a passive wish, active thoughts, a method,
  intent or a time, preparation), each its weight.

Each person message first decays the risk by ``DECAY``. Words about other people (a
character in a book, the news, a friend), or a past that is over, add only ``OTHERS`` of
their signal. Nothing resets it: "anyway", "forget I said that" or a change of subject are
calm messages like any other, and only several of them bring it down. A rule fires when its
risk reaches ``FIRE`` and stays in force while it stays at ``RELEASE`` or more; a rule the
detector fires outright starts at ``PEAK``, so it lasts through ``calm_messages(PEAK)`` calm
messages. The risk lives in the graph's state (``safety_risk``): a checkpointer keeps it,
an app reads it, and an app or a moderator clears a rule by setting its risk to 0 or raises
one by setting it to ``PEAK`` (``graph.update_state``).
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass

#: Per person message, the share of the risk kept.
DECAY = 0.75
#: The risk at which a rule fires, the risk below which a rule in force ends, and where a
#: rule the detector fires outright starts. Chosen on the dev conversations
#: (``safety_conversations_dev.yaml``), with ``bench/safety.py``.
FIRE = 1.0
RELEASE = 0.3
PEAK = 1.5
#: From this risk up to ``FIRE``, a guard with a second opinion asks it (``SafetyGuard``).
ASK = 0.5
#: A classifier probability counts only above this (everyday sadness sits below it).
FLOOR = 0.3
#: The share of a message's signal counted when it is about other people or a past that is over.
OTHERS = 0.2
#: The rules that the screening stages feed (by name, in every roster).
STAGED_RULES = frozenset({"self_harm"})


@dataclass(frozen=True)
class Stage:
    """A stage of suicide-risk screening, its weight in the running risk and the words that
    show it."""

    name: str
    weight: float
    pattern: re.Pattern[str]


def _words(*alternatives: str) -> re.Pattern[str]:
    return re.compile(r"\b(?:" + "|".join(alternatives) + r")", re.IGNORECASE)


STAGES: tuple[Stage, ...] = (
    Stage("passive_wish", 0.45, _words(
        r"wish (?:i|I) (?:was|were)(?:n'?t| not) (?:here|alive|born)", r"wish i could (?:just )?(?:disappear|vanish)",
        r"never wake up", r"not wake up", r"better off without me",
        r"(?:don'?t|do not) want to (?:be here|exist|be alive|wake up)",
        r"no point (?:in )?(?:going on|living|any of it)", r"tired of (?:living|existing|being alive)",
        r"(?:a|the) burden (?:on|to) (?:everyone|them|my)", r"wouldn'?t (?:even )?(?:notice|miss me)",
        r"not (?:be )?here anymore", r"want (?:it )?(?:all )?to stop (?:for good|permanently)",
        r"(?:nothing|no reason) (?:left )?to live for", r"disappear for good", r"cope (?:fine )?without me")),
    Stage("active_thoughts", 0.8, _words(
        r"kill(?:ing)? myself", r"end(?:ing)? (?:it all|my life|myself)", r"take my (?:own )?life", r"suicid",
        r"\bkms\b", r"unalive", r"hurt(?:ing)? myself", r"(?:cut|cutting|burn|burning) myself", r"want to die",
        r"(?:better|rather) (?:be )?dead", r"finish myself")),
    Stage("method", 0.5, _words(
        r"pills", r"tablets", r"(?:sleeping|pain) ?killers", r"overdose", r"\brope\b", r"noose", r"hang(?:ing)? myself",
        r"bridge", r"\broof\b", r"ledge", r"cliff", r"jump(?:ing)? (?:off|from)", r"razor", r"blade", r"engine running",
        r"closed garage", r"\bhose\b", r"train tracks", r"platform edge", r"bleed out", r"\bgun\b")),
    Stage("intent_time", 0.65, _words(
        r"made up my mind", r"(?:it'?s|its) decided", r"(?:picked|chosen|set) a (?:date|day|time)", r"have a plan",
        r"my plan is", r"tonight'?s the (?:night|one)", r"tonight feels right", r"won'?t be (?:around|here)",
        r"last (?:message|time you'?ll)", r"(?:it'?s|its) (?:time|enough)\b",
        r"not (?:going to|gonna) be (?:around|here)",
        r"after (?:this|the) (?:weekend|week)", r"ready to (?:go|let go)", r"one way or another", r"found the nerve",
        r"nobody'?s? (?:home|around) (?:till|until)")),
    Stage("preparation", 0.6, _words(
        r"(?:gave|giving|handed|handing) (?:away|out) (?:my|all my)", r"(?:goodbye|farewell) (?:note|letter|message)",
        r"wrote (?:a |some )?(?:note|letters?) (?:to|for)", r"said (?:my )?goodbyes?", r"saying goodbye",
        r"(?:sorted|arranged|put) (?:out )?(?:my )?(?:affairs|will|finances)", r"updated my will",
        r"(?:take|look after|feed|have) (?:my|the) (?:dog|cat|kids|pets?) (?:after|when|once)", r"spare keys?",
        r"stockpil", r"saving (?:up )?(?:my )?(?:pills|tablets|meds)", r"counted (?:them|the pills|twice)",
        r"lined them up", r"cancel(?:l?ed|ling) (?:all )?(?:my )?(?:subscriptions|accounts)",
        r"deleted (?:all )?my (?:accounts|socials)", r"life insurance", r"won'?t need (?:them|it|any of it)")),
)

#: Words that put a message's risk on someone else or in a past that is over.
OTHERS_PATTERN = _words(
    r"in (?:the|a|this|that) (?:book|novel|film|movie|show|series|game|episode|story|song|article|play|documentary)",
    r"the (?:character|detective|protagonist|hero|heroine|narrator|villain|author|main character)",
    r"(?:my|a|her|his) (?:friend|colleague|coworker|cousin|brother|sister|mum|mom|dad|neighbou?r|uncle|aunt)'?s? "
    r"(?:said|told|was|used to|went through|tried|once)",
    r"(?:he|she|they) (?:said|says|wants|wanted|tried|was|is) (?:to|that|going)", r"on the news", r"in the news",
    r"(?:years|months) ago", r"used to", r"back then", r"looking back",
    r"when i was (?:younger|a teen|at school|in school)",
    r"(?:i'?m|i am) (?:doing )?(?:much |so much |a lot )?better now", r"(?:over|past) (?:it|that) now", r"lyrics?")


def stages(message: str) -> list[Stage]:
    """The screening stages ``message`` shows."""
    return [stage for stage in STAGES if stage.pattern.search(message)]


def about_others(message: str) -> bool:
    """Whether ``message`` speaks of someone else (a character, the news, a friend) or of a
    past that is over."""
    return bool(OTHERS_PATTERN.search(message))


def update(risk: Mapping[str, float], message: str, probabilities: Mapping[str, float], *,
           fired: str | None = None) -> dict[str, float]:
    """The running risk after one more person message.

    Args:
        risk: Each rule's risk before ``message`` (a rule missing is 0).
        message: The person's message.
        probabilities: The detector's probability of each rule for ``message``.
        fired: The rule the detector fired outright on ``message``, if any: its risk is at
            least ``PEAK`` after it.
    """
    share = OTHERS if about_others(message) else 1.0
    shown = sum(stage.weight for stage in stages(message))
    out: dict[str, float] = {}
    for rule in {*risk, *probabilities}:
        signal = max(0.0, probabilities.get(rule, 0.0) - FLOOR) + (shown if rule in STAGED_RULES else 0.0)
        value = DECAY * float(risk.get(rule, 0.0)) + share * signal
        if rule == fired:
            value = max(value, PEAK)
        out[rule] = round(value, 4)
    return out


def in_force(risk: Mapping[str, float], rule: str, *, was_in_force: bool) -> bool:
    """Whether ``rule`` governs the round at this ``risk``: it reaches ``FIRE``, or it was in
    force and stays at ``RELEASE`` or more."""
    value = float(risk.get(rule, 0.0))
    return value >= FIRE or (was_in_force and value >= RELEASE)


def calm_messages(start: float = PEAK) -> int:
    """How many calm person messages bring a risk of ``start`` below ``RELEASE``."""
    return max(0, math.ceil(math.log(RELEASE / start) / math.log(DECAY))) if start >= RELEASE else 0
