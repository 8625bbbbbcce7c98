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
- ``refusal_rate``: persona turns that refuse or talk as an assistant (``reply_fault``
  ``refusal`` or ``boilerplate``).
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
- ``short_tones``: directions of persona turns whose tone has at most ``TONE_WORDS`` words
  (a tone, not a sentence).
- ``first_offered``: directions of persona turns naming the voice offered first (``offered``, with
  two or more voices offered): about ``100 / offered_voices`` for a Director that chooses
  for a reason, 100 for one that chooses by position.
- ``offered_voices``: voices offered per such direction (the ``k`` of ``1/k``).
"""

from __future__ import annotations

from mascot.graphs.reply import copies, word_count
from mascot.graphs.reply_faults import reply_fault
from mascot.rosters import USER, Roster
from mascot.training.episodes.episode import Episode

#: The guard metrics, in report order.
GUARDS = ("voices_per_round", "multi_voice_rounds", "reply_words", "refusal_rate", "echo_rate", "as_person_rate",
          "skipped_turns", "copied_actions", "action_refusals", "short_tones", "first_offered", "offered_voices")
#: A tone of at most this many words counts as a tone (``short_tones``).
TONE_WORDS = 6
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
    faults: list[str | None] = []
    directions: list[dict] = []
    copied = 0
    shown = _roster_text(roster)
    for index, message in enumerate(episode.messages):
        if message.role == "user":
            rounds.append([])
            person = message.content
        elif message.role == "assistant" and message.name in roster.persona_ids:
            if not rounds:
                rounds.append([])
            faults.append(reply_fault(message.content, person=person, voices=rounds[-1]))
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
    return {
        "voices_per_round": sum(map(len, spoken_rounds)) / len(spoken_rounds) if spoken_rounds else None,
        "multi_voice_rounds": _share(sum(len(v) >= 2 for v in spoken_rounds), len(spoken_rounds)),
        "reply_words": sum(map(word_count, turns)) / len(turns) if turns else None,
        "refusal_rate": _share(sum(f in ("refusal", "boilerplate") for f in faults), len(faults)),
        "echo_rate": _share(sum(f in ("copies_voice", "copies_person") for f in faults) + copy_skips, attempts),
        "as_person_rate": _share(sum(f == "as_person" for f in faults), len(faults)),
        "skipped_turns": _share(len(skips), attempts),
        "copied_actions": _share(copied, len(directions)),
        "action_refusals": _share(sum(reply_fault(str(d.get("action", ""))) in ("refusal", "boilerplate")
                                      for d in directions), len(directions)),
        "short_tones": _share(sum(0 < word_count(str(d.get("tone", ""))) <= TONE_WORDS for d in directions),
                              len(directions)),
        "first_offered": _share(sum(d["speaker"] == d["offered"][0] for d in offered), len(offered)),
        "offered_voices": sum(len([v for v in d["offered"] if v != USER]) for d in offered) / len(offered)
        if offered else None,
    }
