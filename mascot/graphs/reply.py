"""Cleaning a generated turn so that it speaks only for its own speaker."""

from __future__ import annotations

import re
from collections.abc import Iterable

_THINK = re.compile(r"<think>.*?(</think>|$)", re.DOTALL)
_USER_LABELS = ("user", "person", "human", "client", "me")


def speaker_labels(*names: str) -> list[str]:
    """Return the labels a model may use for a speaker: as given, and without "The "."""
    labels: list[str] = []
    for name in names:
        name = name.strip()
        if not name:
            continue
        labels.append(name)
        labels.append(name.replace("_", " "))
        labels.append(re.sub(r"^the\s+", "", name, flags=re.IGNORECASE))
    return sorted(set(labels), key=len, reverse=True)


def user_labels(*names: str) -> list[str]:
    """Labels of the person in the conversation (generic words plus given names)."""
    return speaker_labels(*_USER_LABELS, *names)


def strip_reasoning(text: str) -> str:
    """Drop reasoning blocks (``<think>...</think>``, also an unclosed one) and trim."""
    return _THINK.sub("", text).strip()


def clean_reply(text: str, *, own: Iterable[str], others: Iterable[str]) -> str:
    """Strip the speaker's own name prefix and cut lines written for anyone else.

    A model continuing a transcript tends to start with its own label
    (``"The Anchor: ..."``, ``"[anchor] ..."``) and to go on writing other speakers'
    lines (``"\\nCatalyst: ..."``). The first is removed; the reply is cut where the
    second begins. Reasoning blocks (``<think>``) are dropped, and a reply that starts
    repeating a sentence is cut there (``cut_repetition``).

    Args:
        text: The generated text.
        own: Labels of the speaker itself (see ``speaker_labels``).
        others: Labels of every other speaker, the person included.

    Returns:
        The cleaned reply; empty when nothing of the speaker's own remains.
    """
    text = strip_reasoning(text)
    own_prefix = re.compile(r"^\s*" + _label(own), re.IGNORECASE)
    while True:
        stripped = own_prefix.sub("", text, count=1).strip()
        if stripped == text:
            break
        text = stripped
    other_labels = list(others)
    if other_labels:
        other_line = re.compile(r"(?:^|\n)[ \t]*" + _label(other_labels), re.IGNORECASE)
        match = other_line.search(text)
        if match:
            text = text[: match.start()]
    return cut_repetition(text.strip().strip('"').strip())


_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def cut_repetition(text: str) -> str:
    """Cut a reply where it starts saying a sentence again.

    Small models fall into loops ("What makes you sure? What makes you sure? ...") until
    their token budget runs out; the first occurrence is kept.
    """
    seen: set[str] = set()
    start = 0
    for boundary in [*_SENTENCE_END.finditer(text), None]:
        end = boundary.start() if boundary else len(text)
        key = " ".join(_WORD.findall(text[start:end].lower()))
        if key and key in seen:
            return text[:start].strip()
        seen.add(key)
        start = boundary.end() if boundary else end
    return text


_WORD = re.compile(r"[a-z0-9']+")
_CUE = re.compile(r"\(\s*director\b[^)]*\)?", re.IGNORECASE)
#: Share of a reply's words found in the direction (and the speaker's names) above which
#: the reply is taken for the direction echoed back rather than an answer.
ECHO_OVERLAP = 0.8
_FILLER = {"the", "a", "an", "to", "and", "of", "s", "is", "that", "it", "in"}


def strip_cues(text: str) -> str:
    """Remove stage cues a model copied into its reply (``(Director to ...: ...)``)."""
    return _CUE.sub("", text).strip()


def echoes(text: str, source: str, *, names: Iterable[str] = ()) -> bool:
    """Whether a reply is ``source`` said back instead of an answer: the stage direction, or
    the person's message.

    Small models asked to follow ``action``/``tone`` often write the instruction itself
    ("Gently question the belief that ...") or narrate it in the third person ("The
    Catalyst gently questions ..."), and asked to answer a message they often say it back
    with a word changed. A reply counts as an echo when at least ``ECHO_OVERLAP`` of its
    words occur in ``source`` or the speaker's names, and it is not much longer than
    ``source``.

    Args:
        text: The cleaned reply.
        source: The direction's action and tone, or the person's message.
        names: The speaker's labels (id, display name).
    """
    words = [w for w in _WORD.findall(text.lower()) if w not in _FILLER]
    if len(words) < 4:  # too short to tell an echo from an answer
        return False
    known = set(_WORD.findall(source.lower()))
    for name in names:
        known.update(_WORD.findall(name.lower().replace("_", " ")))
    shared = sum(word in known for word in words) / len(words)
    return shared >= ECHO_OVERLAP and len(words) <= len(_WORD.findall(source.lower())) + 12


#: Consecutive words of the person's message a reply may repeat before the run is cut:
#: enough for a short reflection ("you said you failed again"), not for a copied message.
QUOTE_WORDS = 8
_TOKEN = re.compile(r"[A-Za-z0-9']+")


def cut_quotes(text: str, sources: Iterable[str], *, min_words: int = QUOTE_WORDS) -> tuple[str, int]:
    """Cut every run of ``min_words`` or more consecutive words that ``text`` repeats
    verbatim (case and punctuation aside) from one of ``sources``, the person's messages.

    A small model asked to answer a message often says it back, and a message that carries
    instructions ("SYSTEM: from now on always ...") is then repeated as if it were the
    voice's own line. A source shorter than ``min_words`` counts when repeated whole and
    it has at least 5 words.

    Returns:
        The text without the repeated runs (and the punctuation and quotes around them),
        and how many words were cut (0: unchanged).
    """
    cut = 0
    for source in sources:
        wanted = [w.lower() for w in _TOKEN.findall(source)]
        if len(wanted) < 5:
            continue
        length = min(min_words, len(wanted))
        while True:
            span = _repeated_run(text, wanted, length)
            if span is None:
                break
            start, end, words = span
            text = (text[:start].rstrip(" \t\"'“”‘’«»:-–—(") + " " + text[end:].lstrip(" \t\"'“”‘’«»).,;:!?")).strip()
            cut += words
    return text, cut


#: Consecutive words a Director's action may share with its prompt, the person or an
#: earlier reply before it counts as copied: a weak model fills the action with what it read.
COPY_WORDS = 6


def copies(text: str, sources: Iterable[str], *, min_words: int = COPY_WORDS) -> bool:
    """Whether ``text`` repeats ``min_words`` or more consecutive words (case and
    punctuation aside) of one of ``sources``."""
    return any(_repeated_run(text, [w.lower() for w in _TOKEN.findall(source)], min_words) is not None
               for source in sources)


def shared_run(text: str, source: str) -> int:
    """The longest run of consecutive words (case and punctuation aside) ``text`` shares with ``source``."""
    span = _repeated_run(text, [w.lower() for w in _TOKEN.findall(source)], 1)
    return span[2] if span else 0


def word_count(text: str) -> int:
    """The words of ``text``, counted as ``cut_quotes`` counts them."""
    return len(_TOKEN.findall(text))


def _repeated_run(text: str, source: list[str], length: int) -> tuple[int, int, int] | None:
    """The character span and word count of the longest run of ``text``'s words that is
    also consecutive in ``source``, if it has at least ``length`` words."""
    tokens = list(_TOKEN.finditer(text))
    words = [t.group().lower() for t in tokens]
    best = (0, 0)  # (run length, end index in words)
    previous = [0] * (len(source) + 1)
    for i, word in enumerate(words, 1):
        current = [0] * (len(source) + 1)
        for j, other in enumerate(source, 1):
            if word == other:
                current[j] = previous[j - 1] + 1
                if current[j] > best[0]:
                    best = (current[j], i)
        previous = current
    run, end = best
    if run < length:
        return None
    return tokens[end - run].start(), tokens[end - 1].end(), run


def _label(labels: Iterable[str]) -> str:
    """A pattern for a speaker label: ``[Name]``, ``Name:``, ``**Name** (role):``."""
    names = "|".join(re.escape(label) for label in sorted(set(labels), key=len, reverse=True))
    if not names:
        return r"(?!x)x"
    return (
        r"(?:\[(?:" + names + r")\]\s*:?|[*_]{0,2}(?:" + names + r")[*_]{0,2}"
        r"\s*(?:\([^)\n]{0,60}\))?\s*[*_]{0,2}\s*[:：])\s*"
    )
