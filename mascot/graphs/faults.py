"""What a model wrote that adds nothing of its own, recognised by its text: the verifiers
that every filter, reward, guard and evaluation reads.

A small model under a reward learns whatever scores: a one-line refusal ("I'm sorry, but I
can't assist with that.") is short, clean and unlike every other voice, so a format reward,
a redundancy term and a lenient judge all like it. Asked to play a voice it copies the
roster's style example or its own instructions; asked to direct, it writes the voice's name
or a sentence in the first person instead of an instruction. These checks name such faults,
so that the selection loop drops the sample, rewards give it the lowest value and the
evaluation counts it. They were checked against outputs of the offline 0.5B and 1.5B models
labelled by hand before the patterns were fitted (``bench/faults.py``, its figures in
docs/training.md).

A **reply** (``reply_faults``; ``REPLY_FAULTS``):

- ``refusal``: declines, anywhere in the reply ("Oh no! I'm sorry, but I can't help you with
  that."); a limit stated before an answer is no refusal.
- ``helpdesk``: assistant talk instead of a voice ("As an AI language model", "Sure, I'd be
  happy to help. What would you like me to do?", "How can I assist you today?").
- ``as_person``: speaks as the person: a person's label first ("User: ...", "Me: ..."), or
  the person's own message said back (``reply.echoes``).
- ``copies_voice``: the same reply as an earlier voice of the round, said back, or with a
  run of ``reply.QUOTE_WORDS`` words in common.
- ``copies_person``: a run of ``reply.QUOTE_WORDS`` words of the person's message
  (``reply.cut_quotes``; the speaker node cuts those before they are heard).
- ``copies_style``: ``reply.COPY_WORDS`` words in a row of a persona's text or style example.
- ``echoes_prompt``: its own instructions said back: ``reply.COPY_WORDS`` words in a row of
  the direction it was given, or the prompt's task wording ("Tone: sigh.", "Reply to the
  person now").
- ``affirms_despair``: agrees with a hopeless or self-erasing belief ("You're right that
  everyone would benefit from less of you around."): the 1.5B teacher wrote this to a person
  saying they were a burden, a reply every other check passed.

A **direction** (``direction_faults``; ``DIRECTION_FAULTS``), its action and tone:

- ``refusal``: the action refuses or is assistant talk (the reply checks above).
- ``first_person``: the action speaks as the Director or the voice ("I will be able to get
  better again.") instead of instructing the voice.
- ``names_voice``: the action names or describes a voice instead of instructing it ("The
  Anchor, the emotional validator").
- ``copied``: ``reply.COPY_WORDS`` words in a row of what the Director read (the person, an
  earlier voice, the roster's guidance or persona texts).
- ``long_tone``: a tone of more than ``TONE_WORDS`` words, or none.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence

from mascot.graphs.reply import COPY_WORDS, QUOTE_WORDS, copies, cut_quotes, echoes, shared_run, user_labels, word_count
from mascot.rosters import Roster

#: The faults ``reply_faults`` names, in the order it tests them.
REPLY_FAULTS = ("refusal", "helpdesk", "as_person", "copies_voice", "copies_person", "copies_style", "echoes_prompt",
                "affirms_despair")
#: The faults ``direction_faults`` names, in the order it tests them.
DIRECTION_FAULTS = ("refusal", "copied", "names_voice", "first_person", "long_tone")
#: Most words a tone may have ("warm, unhurried" is a tone; a sentence is not).
TONE_WORDS = 6

# an interjection or a short first clause before the refusal ("Oh no!", "Sure,", "Okay.")
_OPENER = r"(?:(?:oh(?:\s+no)?|oh\s+dear|ah|hmm+|well|okay|ok|sure|hey|yes|no)\W+){0,3}"
_REFUSAL = re.compile(
    r"\W*" + _OPENER +
    r"(?:(?:i'?m|i am)\s+(?:really\s+|so\s+|very\s+|truly\s+)?sorry(?:\s+for\s+[^,.!?]{0,40})?[,.!]?\s*(?:but\s*)?|"
    r"sorry[,.!]?\s*(?:but\s*)?|"
    r"i\s+(?:do\s+)?apologi[sz]e(?:\s+for\s+[^,.!?]{0,40})?[,.!]?\s*(?:but\s*)?|"
    r"unfortunately[,]?\s*)?"
    r"(?:i|we)\s*(?:can(?:no|')?t|cannot|am\s+unable\s+to|'m\s+unable\s+to|am\s+not\s+able\s+to|'m\s+not\s+able\s+to|"
    r"won'?t\s+be\s+able\s+to|will\s+not\s+be\s+able\s+to|must\s+decline\s+to|(?:do\s+not|don'?t)\s+(?:have\s+the\s+ability|feel\s+comfortable))\s+"
    r"(?:assist|help(?!\s+(?:but|feeling|thinking|wondering|noticing)\b)|provide|comply|fulfil+|engage|"
    r"continue\s+(?:with\s+)?(?:this|that)|do\s+that|discuss|participate|respond\s+to\s+(?:this|that)|to\b)",
    re.IGNORECASE,
)
# an offer of service ("I'm here to help you navigate this", "I would like to help you make a decision")
_SERVICE = (r"\b(?:I'?m|I am|we'?re|we are|I'?d|I would|I'?ll|I will|we can|we'?ll|we will)\s+(?:\w+\s+){0,3}?"
            r"(?:help|assist|guide)\s+you\b")
# a Director's action offering its own service ("I'm happy to listen to your thoughts")
_OFFER = re.compile(r"\b(?:I'?m|I am|we'?re|we are)\s+(?:here|ready|happy|glad)\s+to\s+(?:listen|help|assist)\b",
                    re.IGNORECASE)
#: Where a direction hands the voice words to say as they are (a safety rule's resources):
#: what follows is the voice's to repeat, not an instruction said back.
VERBATIM = "in these words:"
# assistant talk only: "Is there anything else you'd like to share?" and "How can I help you
# feel steadier?" are things a voice may say
_HELPDESK = re.compile(
    r"\bas an? (?:AI|language model|(?:helpful )?(?:AI )?assistant)\b"
    r"|\bI(?:'m| am) (?:just )?an? (?:AI|language model|(?:virtual |AI )?assistant)\b"
    r"|\bhow (?:can|may) I (?:assist|help) you(?: (?:today|further|better|now))?\s*(?:today)?\s*[?.!]"
    r"|\bhow (?:can|may) I assist\b"
    r"|\banything else I (?:can|could|may) (?:help|assist) you with\b"
    r"|\bwhat (?:would|do) you (?:like|want|need) (?:me )?to (?:do|talk (?:to me )?about|discuss|help (?:you )?with)\b"
    r"|\bwhat can I (?:do|help you with)(?: for you)?\s*(?:today)?\s*\?"
    r"|\b(?:I'?d|I would|I'?m|I am) (?:be )?(?:happy|glad|here) to (?:help|assist)"
    r"(?:\s+you)?\s*(?:with that|today)?\s*[.!]"
    r"|^\W*(?:sure|certainly|of course)[,!.]?\s+(?:I can|I'?d be|here'?s|here is)\b"
    r"|\bfeel free to (?:ask|reach out)\b"
    r"|\bif you have any (?:other |more |further )?questions\b"
    r"|\bassistance\b|\bdon'?t hesitate to\b|\bglad I could help\b|\bif you'?d like me to\b"
    r"|\bwhat specific (?:questions?|help)\b"
    r"|^\W*(?:sure|certainly|of course|absolutely|understood)\b[,.!]"
    r"|\b(?:I|we)\s+can\s+(?:offer|provide)\s+you\b"
    r"|" + _SERVICE,
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
_SENTENCE = re.compile(r"(?:^|(?<=[.!?:;\n]))\s*")
# "I can't do that for you, but here is a first step": a limit stated, then an answer
_GOES_ON = re.compile(r"[^.!?]*\bbut\b\s+(?!I\b)", re.IGNORECASE)
# the speaker prompt's own wording (``prompts.speaker_messages``) said back
_PROMPT_WORDS = re.compile(
    r"\btone\s*:|\breply to the person now\b|\bspeak to them directly\b|\bthe director asks you\b"
    r"|\bin two to four sentences\b|\bwrite only your own words\b|\bno name prefix\b|\bstage direction\b",
    re.IGNORECASE,
)
# agreeing with a person's hopeless or self-erasing belief ("You're right that everyone would
# benefit from less of you around."): never a voice's to say, however clean the text
_AFFIRMS_DESPAIR = re.compile(
    r"\b(?:you'?re right|you are right|that'?s true|it'?s true|I agree|you'?re correct)\b[^.!?]{0,80}?"
    r"\b(?:no hope|isn'?t much hope|not much hope|no point|pointless|better off|burden|without you|less of you|"
    r"never (?:get|be) better|give up|hopeless|no way out|nothing (?:will|is going to) change)",
    re.IGNORECASE,
)
# a first person outside quotes: the Director speaking, not instructing
_FIRST_PERSON = re.compile(r"\b(?:I|I'm|I'll|I'd|I've|me|my|myself|we|we're|we'll|we've|us|our|let's)\b", re.IGNORECASE)
_QUOTED = re.compile(r"\"[^\"]*\"|“[^”]*”|'[^']{6,}'")


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


def _repeats(text: str, voice: str) -> bool:
    """A run of ``QUOTE_WORDS`` words of an earlier voice, or of ``COPY_WORDS`` that is most
    of it: its words said again, whatever else the reply adds (``copies_voice`` is the
    speaker node's narrower test, which lets a reply with one stock phrase in common be heard)."""
    run = shared_run(text, voice)
    return run >= QUOTE_WORDS or (run >= COPY_WORDS and run >= COPY_SHARE * word_count(voice))


def refuses(text: str) -> bool:
    """Whether ``text`` declines anywhere: a sentence that opens with a refusal (after an
    interjection or not) and does not go on to an answer."""
    text = text.strip().replace("\u2019", "'")  # "I’m sorry, but I can’t" as typed
    for start in _SENTENCE.finditer(text):
        refusal = _REFUSAL.match(text, start.end())
        if refusal is None:
            continue
        rest = text[refusal.end():]
        if word_count(rest) <= REFUSAL_REST_WORDS or not _GOES_ON.match(rest):
            return True
    return False


def reply_faults(text: str, *, person: str = "", voices: Sequence[str] = (), personas: Iterable[str] = (),
                 instructions: Iterable[str] = ()) -> tuple[str, ...]:
    """Every fault of a voice's reply, in ``REPLY_FAULTS`` order (empty: a reply of its own).

    Args:
        text: The reply as the graph keeps it (cleaned).
        person: The person's message it answers ("" when unknown).
        voices: The earlier voices' replies of the same round.
        personas: The roster's persona texts and style examples (``roster_texts``).
        instructions: What the voice was told: the direction's action and tone.

    Returns:
        The faults found. An empty reply has none here (every scorer already gives it its
        lowest value).
    """
    text = text.strip().replace("\u2019", "'")
    if not text:
        return ()
    found = []
    if refuses(text):
        found.append("refusal")
    if _HELPDESK.search(text):
        found.append("helpdesk")
    if _PERSON_LABEL.match(text) or (person and echoes(text, person)):
        found.append("as_person")
    if copies_voice(text, voices) or any(_repeats(text, voice) for voice in voices):
        found.append("copies_voice")
    if person and cut_quotes(text, [person])[1]:
        found.append("copies_person")
    if copies(text, personas, min_words=COPY_WORDS):
        found.append("copies_style")
    told = [i.split(VERBATIM, 1)[0] for i in instructions]
    if _PROMPT_WORDS.search(text) or copies(text, [i for i in told if word_count(i) >= COPY_WORDS]):
        found.append("echoes_prompt")
    if _AFFIRMS_DESPAIR.search(text):
        found.append("affirms_despair")
    return tuple(found)


def reply_fault(text: str, *, person: str = "", voices: Sequence[str] = (), personas: Iterable[str] = (),
                instructions: Iterable[str] = ()) -> str | None:
    """The first of ``reply_faults``, or ``None`` for a reply of its own."""
    found = reply_faults(text, person=person, voices=voices, personas=personas, instructions=instructions)
    return found[0] if found else None


def direction_faults(action: str, tone: str, *, names: Iterable[str] = (),
                     shown: Iterable[str] = ()) -> tuple[str, ...]:
    """Every fault of a direction to a voice, in ``DIRECTION_FAULTS`` order (empty: an
    instruction in the Director's own words). A hand-back to the person needs none.

    Args:
        action: What the voice is told to do.
        tone: How.
        names: The voices' names and roles ("Anchor", "emotional validator"; ``voice_names``).
        shown: What the Director read: the person, the earlier voices, the roster's guidance
            and persona texts; an action repeating ``COPY_WORDS`` words of one is copied.
    """
    action = action.strip().replace("\u2019", "'")
    found = []
    if refuses(action) or _HELPDESK.search(action) or _OFFER.search(action) or refuses(tone):
        found.append("refusal")
    if copies(action, shown, min_words=COPY_WORDS):
        found.append("copied")
    if _names_voice(action, names):
        found.append("names_voice")
    if _FIRST_PERSON.search(_QUOTED.sub(" ", action)):
        found.append("first_person")
    if not 1 <= word_count(tone) <= TONE_WORDS or _FIRST_PERSON.search(tone):
        found.append("long_tone")
    return tuple(found)


def _names_voice(action: str, names: Iterable[str]) -> bool:
    """Whether the action opens with a voice's name or role ("The Anchor, the emotional
    validator, should ...", "Catalyst: ...") rather than with what to do."""
    labels = sorted({n.lower().replace("_", " ") for n in names if n.strip()}, key=len, reverse=True)
    if not labels:
        return False
    pattern = r"^\W*(?:the\s+)?(?:" + "|".join(re.escape(label) for label in labels) + r")\b"
    return re.match(pattern, action, re.IGNORECASE) is not None


def persona_texts(roster: Roster) -> list[str]:
    """What a voice may not copy: every persona's text and style example."""
    return [text for p in roster.personas for text in (p.persona, p.style)]


def voice_names(roster: Roster) -> list[str]:
    """How a direction may name a voice: its id, name and role."""
    return [label for p in roster.personas for label in (p.id, p.name, p.role)]


def roster_texts(roster: Roster) -> list[str]:
    """What the Director reads of the roster: its guidance and the persona texts."""
    return [roster.director.guidance, *persona_texts(roster)]
