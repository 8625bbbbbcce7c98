"""Guard metrics: the figures that expose a gain made by saying less, refusing or copying.

A policy trained on rewards finds the cheapest way to score: one-line refusals, rounds of
one voice (redundancy 0 by construction), replies that say an earlier voice back, a
Director that names whichever voice its prompt lists first and fills its action with the
prompt's words. Each of these has a figure here, per episode, reported beside every
quality number (``guard_metrics``; percentages 0-100 unless said otherwise; ``None`` where
an episode has nothing to measure, so it does not count):

- ``voices_per_round``: persona turns per round (a round: the turns after a person's message).
- ``multi_voice_rounds``: rounds with two or more voices.
- ``reply_words``: words per persona turn.
- ``multi_voice_rounds_all``: the same over every round, silent ones included (a round the
  Director handed straight back counts as one voice short).
- ``refusal_rate``: persona turns that refuse (anywhere in the reply) or talk as an
  assistant (``faults.reply_faults`` ``refusal`` or ``helpdesk``).
- ``reply_refusals``: persona turns that refuse, anywhere in the reply (``refusal`` alone).
- ``helpdesk_rate``: persona turns with help-desk talk ("What would you like me to do?").
- ``voice_copies``: persona turns heard that repeat an earlier voice of the round.
- ``style_copies``: persona turns repeating a persona's text or style example.
- ``prompt_echoes``: persona turns saying back their own direction or the prompt's wording.
- ``despair_agreements``: persona turns agreeing with the person's hopeless or self-erasing belief.
- ``echo_rate``: persona turns that copy an earlier voice of the round or the person, over
  every attempt: the speaker node skips most copies before they are heard (a fallback
  "repeated a voice heard this round" or "repeated the person's message"), and those count.
- ``as_person_rate``: persona turns that speak as the person (kept ones; a reply that starts
  with the person's label is cut to nothing and counted in ``skipped_turns``).
- ``skipped_turns``: persona attempts the speaker node skipped (empty, echoed, copied).
- ``copied_actions``: directions of persona turns whose action repeats
  ``reply.COPY_WORDS`` consecutive words of what the Director read (the roster's guidance
  and voices, the person, an earlier reply).
- ``action_refusals``: directions of persona turns whose action refuses or talks as an
  assistant ("I'm sorry, but I can't help with that."), by the reply checks.
- ``action_first_person``: directions whose action speaks in the first person or names the
  voice instead of instructing it (``faults.direction_faults``: ``first_person``,
  ``names_voice``).
- ``short_tones``: directions of persona turns whose tone has at most ``TONE_WORDS`` words
  (a tone, not a sentence).
- ``first_offered``: directions of persona turns naming the voice offered first (``offered``, with
  two or more voices offered): about ``100 / offered_voices`` for a Director that chooses
  for a reason, 100 for one that chooses by position.
- ``offered_voices``: voices offered per such direction (the ``k`` of ``1/k``).
"""

from __future__ import annotations

from mascot.graphs.faults import TONE_WORDS, direction_faults, persona_texts, reply_faults, voice_names
from mascot.graphs.reply import copies, word_count
from mascot.rosters import USER, Roster
from mascot.training.episodes.episode import Episode

#: The guard metrics, in report order.
GUARDS = ("voices_per_round", "multi_voice_rounds", "multi_voice_rounds_all", "reply_words", "refusal_rate",
          "reply_refusals", "helpdesk_rate", "voice_copies", "style_copies", "prompt_echoes", "despair_agreements",
          "echo_rate", "as_person_rate", "skipped_turns", "copied_actions", "action_refusals", "action_first_person",
          "short_tones", "first_offered", "offered_voices")
#: Fallback reasons of the speaker node for a skipped copy (``graphs.speaker``).
_COPY_SKIPS = ("repeated a voice heard this round", "repeated the person's message")


def _share(hits: int, total: int) -> float | None:
    return 100.0 * hits / total if total else None


def _roster_text(roster: Roster) -> list[str]:
    """What a Director's prompt shows of the roster: its guidance and each voice."""
    return [roster.director.guidance, *(f"{p.id}: {p.name}, the {p.role}" for p in roster.personas)]


def guard_metrics(episode: Episode, roster: Roster) -> dict[str, float | None]:
    """The guard metrics of one episode (see the module docstring)."""
    rounds: list[list[str]] = []
    person = ""
    faults: list[tuple[str, ...]] = []
    directions: list[dict] = []
    copied = 0
    shown = _roster_text(roster)
    personas, names = persona_texts(roster), voice_names(roster)
    for index, message in enumerate(episode.messages):
        if message.role == "user":
            rounds.append([])
            person = message.content
        elif message.role == "assistant" and message.name in roster.persona_ids:
            if not rounds:
                rounds.append([])
            direction = message.stage_direction or {}
            faults.append(reply_faults(message.content, person=person, voices=rounds[-1], personas=personas,
                                       instructions=[str(direction.get("action", "")), str(direction.get("tone", ""))]))
            rounds[-1].append(message.content)
            if message.stage_direction:  # what the Director read when it wrote this turn's direction
                directions.append(message.stage_direction)
                earlier = [m.content for m in episode.messages[:index] if m.role != "system"]
                copied += copies(str(message.stage_direction.get("action", "")), shown + earlier)
    turns = [text for voices in rounds for text in voices]
    offered = [d for d in directions if len([v for v in d.get("offered") or [] if v != USER]) >= 2]
    skips = [f for f in episode.fallbacks if f.get("node") in roster.persona_ids
             and "turn skipped" in str(f.get("reason", ""))]
    copy_skips = sum(any(reason in str(f.get("reason", "")) for reason in _COPY_SKIPS) for f in skips)
    attempts = len(faults) + len(skips)
    spoken_rounds = [voices for voices in rounds if voices]
    action_faults = [direction_faults(str(d.get("action", "")), str(d.get("tone", "")), names=names)
                     for d in directions]
    return {
        "voices_per_round": sum(map(len, spoken_rounds)) / len(spoken_rounds) if spoken_rounds else None,
        "multi_voice_rounds": _share(sum(len(v) >= 2 for v in spoken_rounds), len(spoken_rounds)),
        "multi_voice_rounds_all": _share(sum(len(v) >= 2 for v in rounds), len(rounds)),
        "reply_words": sum(map(word_count, turns)) / len(turns) if turns else None,
        "refusal_rate": _share(sum("refusal" in f or "helpdesk" in f for f in faults), len(faults)),
        "reply_refusals": _share(sum("refusal" in f for f in faults), len(faults)),
        "helpdesk_rate": _share(sum("helpdesk" in f for f in faults), len(faults)),
        "voice_copies": _share(sum("copies_voice" in f for f in faults), len(faults)),
        "style_copies": _share(sum("copies_style" in f for f in faults), len(faults)),
        "prompt_echoes": _share(sum("echoes_prompt" in f for f in faults), len(faults)),
        "despair_agreements": _share(sum("affirms_despair" in f for f in faults), len(faults)),
        "echo_rate": _share(sum("copies_voice" in f or "copies_person" in f for f in faults) + copy_skips, attempts),
        "as_person_rate": _share(sum("as_person" in f for f in faults), len(faults)),
        "skipped_turns": _share(len(skips), attempts),
        "copied_actions": _share(copied, len(directions)),
        "action_refusals": _share(sum("refusal" in f for f in action_faults), len(directions)),
        "action_first_person": _share(sum("first_person" in f or "names_voice" in f for f in action_faults),
                                      len(directions)),
        "short_tones": _share(sum(0 < word_count(str(d.get("tone", ""))) <= TONE_WORDS for d in directions),
                              len(directions)),
        "first_offered": _share(sum(d["speaker"] == d["offered"][0] for d in offered), len(offered)),
        "offered_voices": sum(len([v for v in d["offered"] if v != USER]) for d in offered) / len(offered)
        if offered else None,
    }
