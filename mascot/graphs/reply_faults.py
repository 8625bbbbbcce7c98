"""Replies that add nothing in the voice's own words, recognised by their text.

A small model under a reward learns whatever scores: a one-line refusal ("I'm sorry, but I
can't assist with that.") is short, clean and unlike every other voice, so a format reward,
a redundancy term and a lenient judge all like it. ``reply_fault`` names what is wrong with
such a reply, so that rewards, the metric judge and the evaluation's guard metrics give it
the lowest value and count it:

- ``refusal``: declines to answer ("I can't help with that", "I'm unable to provide ...").
- ``boilerplate``: assistant talk instead of a voice ("As an AI language model", "How can
  I assist you better today?", "Let me know if there's anything else I can help you with.").
- ``as_person``: speaks as the person: a person's label first ("User: ...", "Me: ..."), or
  the person's own message said back (``reply.echoes``).
- ``copies_voice``: the same reply as an earlier voice of the round, said back, or with a
  run of ``reply.QUOTE_WORDS`` words in common.
- ``copies_person``: a run of ``reply.QUOTE_WORDS`` words of the person's message
  (``reply.cut_quotes``; the speaker node cuts those before they are heard).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mascot.graphs.reply import QUOTE_WORDS, cut_quotes, echoes, shared_run, user_labels, word_count

#: The faults ``reply_fault`` names, in the order it tests them.
FAULTS = ("refusal", "boilerplate", "as_person", "copies_voice", "copies_person")

_REFUSAL = re.compile(
    r"^\W*(?:(?:i'?m|i am)\s+(?:really\s+|so\s+|very\s+)?sorry[,.!]?\s*(?:but\s*)?|sorry[,.!]?\s*(?:but\s*)?|"
    r"i\s+(?:do\s+)?apologi[sz]e[,.!]?\s*(?:but\s*)?|"
    r"unfortunately[,]?\s*)?"
    r"(?:i|we)\s*(?:can(?:no|')?t|cannot|am\s+unable\s+to|'m\s+unable\s+to|am\s+not\s+able\s+to|'m\s+not\s+able\s+to|"
    r"won'?t\s+be\s+able\s+to|will\s+not\s+be\s+able\s+to|must\s+decline\s+to)\s+"
    r"(?:assist|help(?!\s+(?:but|feeling|thinking|wondering|noticing)\b)|provide|comply|fulfil+|engage|"
    r"continue\s+(?:with\s+)?(?:this|that)|do\s+that|discuss|participate|respond\s+to\s+(?:this|that))",
    re.IGNORECASE,
)
# assistant talk only: "Is there anything else you'd like to share?" and "How can I help?"
# are things a voice may say
_BOILERPLATE = re.compile(
    r"\bas an? (?:AI|language model|(?:helpful )?(?:AI )?assistant)\b"
    r"|\bI(?:'m| am) (?:just )?an? (?:AI|language model|(?:virtual |AI )?assistant)\b"
    r"|\bhow (?:can|may) I assist you\b"
    r"|\banything else I (?:can|could|may) (?:help|assist) you with\b",
    re.IGNORECASE,
)
#: Words a copy must share with the voice before, as a share of the copy's own words.
COPY_SHARE = 0.6
#: Words after "I can't help ..." up to which it stays a refusal even with a "but" ("but a
#: professional can."); past them, with a "but", it is a limit stated before an answer.
REFUSAL_REST_WORDS = 8
_PERSON_LABEL = re.compile(
    r"^\s*[*_\[]{0,2}(?:" + "|".join(re.escape(label) for label in user_labels()) + r")[*_\]]{0,2}\s*[:：]",
    re.IGNORECASE,
)
_SPACE = re.compile(r"\s+")
# "I can't do that for you, but here is a first step": a limit stated, then an answer
_GOES_ON = re.compile(r"[^.!?]*\bbut\b\s+(?!I\b)", re.IGNORECASE)


def copies_voice(text: str, voices: Sequence[str]) -> bool:
    """Whether ``text`` says back one of ``voices`` (the earlier voices of its round): the same
    reply, or one that shares ``QUOTE_WORDS`` words in a row or most of its words with it,
    either way covering at least ``COPY_SHARE`` of its own words. A short question in a long
    earlier reply's words, or one stock phrase in common, is no copy."""
    flat = _SPACE.sub(" ", text.strip()).lower()
    words = word_count(text)
    for voice in voices:
        if not voice.strip():
            continue
        if flat == _SPACE.sub(" ", voice.strip()).lower():
            return True
        run = shared_run(text, voice)
        if run >= QUOTE_WORDS and run >= COPY_SHARE * words:
            return True
        if echoes(text, voice) and words >= COPY_SHARE * word_count(voice):
            return True
    return False


def reply_fault(text: str, *, person: str = "", voices: Sequence[str] = ()) -> str | None:
    """What is wrong with a voice's reply, or ``None`` for a reply of its own.

    Args:
        text: The reply as the graph keeps it (cleaned).
        person: The person's message it answers ("" when unknown).
        voices: The earlier voices' replies of the same round.

    Returns:
        One of ``FAULTS``, or ``None``. An empty reply is not a fault here (every scorer
        already gives it its lowest value).
    """
    text = text.strip().replace("\u2019", "'")  # "I’m sorry, but I can’t" as typed
    if not text:
        return None
    refusal = _REFUSAL.search(text)
    rest = text[refusal.end():] if refusal else ""
    if refusal and (word_count(rest) <= REFUSAL_REST_WORDS or not _GOES_ON.match(rest)):
        return "refusal"
    if _BOILERPLATE.search(text):
        return "boilerplate"
    if _PERSON_LABEL.match(text) or (person and echoes(text, person)):
        return "as_person"
    if copies_voice(text, voices):
        return "copies_voice"
    if person and cut_quotes(text, [person])[1]:
        return "copies_person"
    return None
