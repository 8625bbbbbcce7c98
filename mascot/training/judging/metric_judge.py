"""Metric judges: a 0-100 score of a judged candidate from automatic metrics, no LLM.

Where the LLM judge is not trustworthy (``judge_sanity``: under 75 % on its sanity set, or
a score a coin could match, p ≥ 0.01), preference labels come from this judge instead of
training on noise::

    overall = (1 - W) * judge_overall + W * metric_overall

``W`` is ``--metric-weight`` of ``mascot pairs``; from a failed sanity report it is
``SANITY_FALLBACK_WEIGHT`` = 1 (the metric judge alone).

A **persona reply** (a candidate of ``mascot candidates``; its prompt is the speaker's
prompt of ``graphs.prompts.speaker_messages``: the system message holds the persona, the
other voices' answers of this round and ``The Director asks you to: ACTION. Tone: TONE.``;
the user message is the person's latest) scores 0 when it is empty, says a cue back
(``graphs.reply.echoes`` against the action and tone, or cue-like, below), or has a
``graphs.faults.reply_fault`` (a refusal, help-desk talk, speaking as the
person, a copy of an earlier voice or of the person), else::

    100 * (0.2 format + 0.2 substance + 0.2 novelty + 0.2 persona_fit + 0.2 relevance)

with novelty only where another voice answered before it: the first voice of a round is
scored on the other four terms (each 0.25), so a reply earns nothing for speaking first.

- format: ``(roster_format_reward + 1) / 2`` (no speaker labels, no lines for others, length).
- substance: ``min(1, words / 8)``; a reply needs about eight words to say anything.
- novelty: ``1 - max(0, highest cosine to another voice's answer of this round)``.
- persona_fit: the share of the roster's other personas whose description (the one persona
  identifiability uses) is less similar to the reply than its own persona's (ties count half);
  0 for a reply that speaks as an AI or assistant ("As an AI language model, ...").
- relevance: ``max(0, cosine to the person's latest message)``.

A **group block** (persona ``group``; the reply is ``id: text`` paragraphs, as
``targets.render_block`` writes them) scores 0 without a persona turn, else::

    100 * (voices + novelty + persona_fit + no_cues + substance + relevance) / 6

- voices: distinct persona speakers / persona turns (one voice three times: 1/3).
- novelty: ``1 -`` the mean over the turns after the first of ``max(0, highest cosine to an
  earlier turn of the block)`` (the block's ``measures.redundancy``).
- persona_fit, substance: the persona turns' mean of the reply terms above.
- relevance: the persona turns' mean ``max(0, cosine to the person's latest message)`` of the
  block's prefix (0 without one): three fluent voices on another problem are no answer.
- no_cues: the share of persona turns that are neither cue-like nor have a ``reply_fault``
  (against the block's earlier turns); such a turn also adds 0 to persona_fit and substance.

A turn is **cue-like** when it holds a copied ``(Director ...)`` cue, narrates its own
speaker in the third person (``The Catalyst gently questions ...``), or speaks of "the
person" or "the user" as the Director does, and never to them ("you"). Cosines use the embedder
passed, else ``default_embedder()`` (all-MiniLM-L6-v2, or the lexical fallback).
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from mascot.graphs.embeddings import Embedder, Vector, default_embedder
from mascot.graphs.faults import reply_fault
from mascot.graphs.reply import echoes, speaker_labels, strip_cues
from mascot.rosters import USER, Persona, Roster
from mascot.training.judging.judgement import JudgedCandidate
from mascot.training.measures import cosine, describe_persona  # as persona identifiability embeds and compares
from mascot.training.rewards import roster_format_reward

#: Weight of the metric judge in the labels when the LLM judge failed its sanity set (alone).
SANITY_FALLBACK_WEIGHT = 1.0
#: Weight of each term of a reply's and of a block's score.
REPLY_WEIGHTS = {"format": 0.2, "substance": 0.2, "novelty": 0.2, "persona_fit": 0.2, "relevance": 0.2}
BLOCK_WEIGHTS = {name: 1 / 6 for name in ("voices", "novelty", "persona_fit", "no_cues", "substance", "relevance")}
#: Words a reply needs for full substance.
SUBSTANCE_WORDS = 8
#: The persona id of a group-block candidate.
GROUP = "group"

# the phrases of speaker_messages (graphs/prompts.py) that the reply terms read back
_TASK = re.compile(r"The Director asks you to: (?P<action>.*?)\. Tone: (?P<tone>.*?)\.(?: Address: .*?\.)? "
                   r"Reply to the person now, as ", re.DOTALL)
_ANSWERED = "The other voices have already answered it:\n\n"
_WORD = re.compile(r"[A-Za-z0-9']+")
_ABOUT_PERSON = re.compile(r"\bthe (?:person|user)\b", re.IGNORECASE)
_ASSISTANT = re.compile(r"\bas an? (?:AI|language model|(?:helpful )?assistant)\b|\bI(?:'m| am) (?:just )?an? "
                        r"(?:AI|language model|assistant)\b", re.IGNORECASE)
_TO_PERSON = re.compile(r"\byou(?:r|rs|rself|'re|'ve|'ll|'d)?\b", re.IGNORECASE)


def _cue_like(text: str, persona: Persona) -> bool:
    if strip_cues(text) != text.strip():
        return True
    names = "|".join(re.escape(label) for label in speaker_labels(persona.name, persona.id))
    if re.match(rf"\s*(?:the\s+)?(?:{names})\b(?!\s*[:(])", text, re.IGNORECASE):
        return True
    return bool(_ABOUT_PERSON.search(text)) and not _TO_PERSON.search(text)


def _substance(text: str) -> float:
    return min(1.0, len(_WORD.findall(text)) / SUBSTANCE_WORDS)


def _persona_fit(text: str, vector: Vector, own: str, descriptions: dict[str, Vector]) -> float:
    if _ASSISTANT.search(text):
        return 0.0
    if len(descriptions) < 2:
        return 1.0
    mine = cosine(vector, descriptions[own])
    others = [cosine(vector, v) for pid, v in descriptions.items() if pid != own]
    below = sum(1.0 if s < mine - 1e-9 else 0.5 if abs(s - mine) <= 1e-9 else 0.0 for s in others)
    return below / len(others)


def _weighted(terms: dict[str, float], weights: dict[str, float]) -> float:
    """100 times the weighted mean of the terms given (weights renormalised over them)."""
    total = sum(weights[name] for name in terms)
    return 100.0 * sum(weights[name] * terms[name] for name in terms) / total


class _Reply:
    """A persona reply candidate, read out of its speaker prompt."""

    def __init__(self, record: JudgedCandidate, roster: Roster) -> None:
        self.persona = _persona(record, roster)
        self.reply = record.reply.strip()
        system = next((m.content for m in record.prompt if m.role == "system"), "")
        task = _TASK.search(system)
        if task is None:
            raise ValueError(f"context {record.context_id}: the prompt is not a speaker prompt "
                             "(no 'The Director asks you to: ...' line in its system message)")
        self.direction = f"{task['action']} {task['tone']}"
        self.person = next((m.content for m in reversed(record.prompt) if m.role == "user"), "")
        answered = system[system.index(_ANSWERED) + len(_ANSWERED): task.start()] if _ANSWERED in system else ""
        self.others = _split_turns(answered, [p.name for p in roster.personas])
        self.format = roster_format_reward(roster, self.persona.id)([""], [self.reply])[0]
        self.fault = reply_fault(self.reply, person=self.person, voices=[text for _, text in self.others])

    @property
    def texts(self) -> list[str]:
        return [self.reply, self.person, *(text for _, text in self.others)]

    def overall(self, vectors: dict[str, Vector], descriptions: dict[str, Vector]) -> float:
        own = speaker_labels(self.persona.id, self.persona.name)
        if not self.reply or echoes(self.reply, self.direction, names=own):
            return 0.0
        if _cue_like(self.reply, self.persona) or self.fault:
            return 0.0
        vector = vectors[self.reply]
        terms = {
            "format": (self.format + 1.0) / 2.0,
            "substance": _substance(self.reply),
            "persona_fit": _persona_fit(self.reply, vector, self.persona.id, descriptions),
            "relevance": max(0.0, cosine(vector, vectors[self.person])) if self.person else 0.0,
        }
        if self.others:  # novelty only against someone: the first voice earns nothing for speaking first
            terms["novelty"] = 1.0 - max(max(0.0, cosine(vector, vectors[t])) for _, t in self.others)
        return _weighted(terms, REPLY_WEIGHTS)


class _Block:
    """A group-block candidate: its persona turns, read out of the rendered block."""

    def __init__(self, record: JudgedCandidate, roster: Roster) -> None:
        self.roster = roster
        turns = _split_turns(record.reply, [*roster.persona_ids, USER, "assistant"])
        self.turns = [(speaker, text) for speaker, text in turns if speaker in roster.persona_ids]
        self.person = next((m.content for m in reversed(record.prompt) if m.role == "user"), "")

    @property
    def texts(self) -> list[str]:
        return [text for _, text in self.turns] + ([self.person] if self.person else [])

    def overall(self, vectors: dict[str, Vector], descriptions: dict[str, Vector]) -> float:
        if not self.turns:
            return 0.0
        speakers = [speaker for speaker, _ in self.turns]
        embedded = [vectors[text] for _, text in self.turns]
        repeats = [max(cosine(v, w) for w in embedded[:i]) for i, v in enumerate(embedded) if i]
        bad = [_cue_like(t, self.roster.persona(s)) or reply_fault(t, voices=[u for _, u in self.turns[:i]])
               is not None for i, (s, t) in enumerate(self.turns)]
        person = vectors[self.person] if self.person else None
        terms = {
            "voices": len(set(speakers)) / len(speakers),
            "persona_fit": _mean([0.0 if b else _persona_fit(t, vectors[t], s, descriptions)
                                  for (s, t), b in zip(self.turns, bad, strict=True)]),
            "no_cues": _mean([0.0 if b else 1.0 for b in bad]),
            "substance": _mean([0.0 if b else _substance(t) for (_, t), b in zip(self.turns, bad, strict=True)]),
            "relevance": _mean([max(0.0, cosine(vectors[t], person)) if person is not None else 0.0
                                for _, t in self.turns]),
        }
        if repeats:  # novelty only where a turn follows another
            terms["novelty"] = 1.0 - sum(max(0.0, r) for r in repeats) / len(repeats)
        return _weighted(terms, BLOCK_WEIGHTS)


def _mean(values: list[float]) -> float:
    return sum(values) / len(values)


def _persona(record: JudgedCandidate, roster: Roster) -> Persona:
    try:
        return roster.persona(record.persona)
    except KeyError as exc:
        raise ValueError(f"context {record.context_id}: {exc.args[0]}") from None


def _split_turns(text: str, labels: Sequence[str]) -> list[tuple[str, str]]:
    """``label: text`` paragraphs (``transcript``, ``render_block``) as (label, text) pairs."""
    if not text.strip():
        return []
    names = "|".join(re.escape(label) for label in sorted(labels, key=len, reverse=True))
    starts = list(re.finditer(rf"(?:^|\n\n)(?P<label>{names})(?: \(you\))?: ", text))
    return [(match["label"], text[match.end(): following.start() if following else len(text)].strip())
            for match, following in zip(starts, [*starts[1:], None], strict=True)]


def metric_overalls(
    records: Sequence[JudgedCandidate], roster: Roster, *, embedder: Embedder | None = None
) -> list[float]:
    """The metric judge's overall score (0-100) of each candidate; see the module docstring.

    Args:
        records: Judged candidates: persona replies (their prompt is a speaker prompt) or
            group blocks (persona ``group``).
        roster: The roster they were played with.
        embedder: Defaults to ``default_embedder()``; every distinct text is
            embedded once.

    Returns:
        One score per record, in order.

    Raises:
        ValueError: if a reply's persona is not in the roster or its prompt is not a
            speaker prompt.
    """
    embedder = embedder or default_embedder()
    items = [_Block(r, roster) if r.persona == GROUP else _Reply(r, roster) for r in records]
    texts = list(dict.fromkeys(t for item in items for t in item.texts))
    described = [describe_persona(p) for p in roster.personas]
    encoded = embedder.encode(texts + described)
    vectors = dict(zip(texts, encoded, strict=False))
    descriptions = dict(zip(roster.persona_ids, encoded[len(texts):], strict=True))
    return [item.overall(vectors, descriptions) for item in items]


def metric_overall(record: JudgedCandidate, roster: Roster, embedder: Embedder | None = None) -> float:
    """The metric judge's overall score (0-100) of one candidate (see ``metric_overalls``)."""
    return metric_overalls([record], roster, embedder=embedder)[0]


def combine_overall(judge_overall: float, metric_overall: float, metric_weight: float) -> float:
    """The label of a candidate: ``(1 - W) * judge_overall + W * metric_overall``.

    Raises:
        ValueError: if ``metric_weight`` is not in [0, 1].
    """
    _check_weight(metric_weight)
    return (1.0 - metric_weight) * judge_overall + metric_weight * metric_overall


def with_metric_overall(
    records: Sequence[JudgedCandidate], roster: Roster, metric_weight: float, *, embedder: Embedder | None = None
) -> list[JudgedCandidate]:
    """Candidates whose ``overall`` mixes the judge's with the metric judge's.

    A failed judgement (``overall`` ``None``) stays failed. Each mixed candidate's
    ``judgement`` keeps the provenance: ``judge_overall``, ``metric_overall`` and
    ``metric_weight`` are added to it.

    Raises:
        ValueError: if ``metric_weight`` is not in [0, 1], or as ``metric_overalls``.
    """
    _check_weight(metric_weight)
    judged = [r for r in records if r.overall is not None]
    metric = dict(zip(map(id, judged), metric_overalls(judged, roster, embedder=embedder), strict=True))
    mixed = []
    for record in records:
        if record.overall is None:
            mixed.append(record)
            continue
        score = metric[id(record)]
        provenance = {**record.judgement, "judge_overall": record.overall, "metric_overall": round(score, 4),
                      "metric_weight": metric_weight}
        overall = min(100.0, max(0.0, combine_overall(record.overall, score, metric_weight)))
        mixed.append(record.model_copy(update={"overall": overall, "judgement": provenance}))
    return mixed


def _check_weight(weight: float) -> None:
    if not 0.0 <= weight <= 1.0:
        raise ValueError(f"metric_weight={weight}: must be in [0, 1] (0: judge only, 1: metric only)")
