"""Learning by selection: rank the samples that passed the checks by measured outcomes, keep
the best per group for fine-tuning, and pair best with worst for DPO, without a reward model.

Expert iteration with verifiers (ReST-EM, RAFT): ``mascot samples`` draws several
directions per decision point and replies per persona turn from the policy and a teacher and
drops every one a fault verifier rejects (``graphs.faults``); this module orders the rest by
what can be measured of them, not by a model fitted on a handful of labels:

- a **reply**: how well it tells its persona apart from the others (``IDENTIFY_WEIGHT``: the
  cosine to its own persona's description minus the best other's), how much it differs
  from the voices before it in the round (``NOVELTY_WEIGHT``: one minus its highest cosine
  to them), and whether its length is in ``LENGTH_BAND`` (``LENGTH_PENALTY`` per word
  outside);
- a **direction**: the same measures of the reply its voice gave when the direction was
  played as a one-turn block (``mascot samples --play``), a faulty block reply scoring
  ``FAULTY``; a direction that was not played scores 0 (the hand-back too).

A turn a safety rule governs, and a reply that agrees with despair (``unsafe``), is never
learned from. ``select_rows`` keeps the ``keep`` best distinct passing samples of each context (the SFT
rows of one iteration); ``pool_pairs`` pairs, per context, the best passing sample with a
faulty one (or, with none, the worst passing one at least ``min_margin`` below it): the
preference pairs of the DPO stage, hundreds from the same pools. ``selection_counts`` says
per source and role how many were sampled, passed, kept, and why the rest were dropped.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.graphs.faults import reply_faults
from mascot.graphs.reply import word_count
from mascot.rosters import Roster
from mascot.training.data.pairs import split_value
from mascot.training.jsonl import read_jsonl
from mascot.training.measures import cosine

#: Weight of persona identifiability (own description's cosine minus the best other's).
IDENTIFY_WEIGHT = 1.0
#: Weight of novelty (one minus the highest cosine to an earlier voice of the round).
NOVELTY_WEIGHT = 1.0
#: Words a reply should have: two to four sentences.
LENGTH_BAND = (20, 90)
#: Score lost per word outside ``LENGTH_BAND``.
LENGTH_PENALTY = 0.02
#: The score of a direction whose played reply had a fault.
FAULTY = -1.0
#: Share of the contexts whose pairs are held out as the test split (by context id).
TEST_SHARE = 0.1


@dataclass(frozen=True)
class Scored:
    """A sample with its measured score (``None`` for one with a fault)."""

    row: dict[str, Any]
    score: float | None

    @property
    def passed(self) -> bool:
        return self.row.get("fault") is None and bool(self.row.get("completion")) and not unsafe(self.row)


#: The line a speaker's prompt carries when a safety rule governs the round (``prompts.speaker_messages``).
GUARDED = "Safety comes first now"


def unsafe(row: Mapping[str, Any]) -> bool:
    """A sample selection never learns from, whatever its checks said: a turn a safety rule
    governs (its reply is the route's to fix, and a check of style cannot tell a harmful
    agreement), or a reply (or a played block's reply) that agrees with despair."""
    prompt = row.get("prompt") or []
    if any(GUARDED in str(m.get("content", "")) for m in prompt if isinstance(m, Mapping)):
        return True
    said = [str(row.get("completion") or "")] if row.get("role") == "speakers" else [str(row.get("block_reply") or "")]
    return any("affirms_despair" in reply_faults(text) for text in said if text)


def score_samples(rows: Sequence[Mapping[str, Any]], roster: Roster, *,
                  embedder: Embedder | None = None) -> list[Scored]:
    """Every sample of a samples file with its measured score (see the module docstring).

    Args:
        rows: The rows of ``samples.jsonl`` (``mascot samples``).
        roster: Their roster (the persona descriptions).
        embedder: Defaults to ``default_embedder()``.

    Returns:
        One ``Scored`` per row, in order; a faulty sample has score ``None``.
    """
    embedder = embedder or default_embedder()
    descriptions = {p.id: f"{p.name}, the {p.role}. {p.persona} {p.style}" for p in roster.personas}
    texts: list[str] = list(descriptions.values())
    jobs: list[tuple[int, str, str, list[str]]] = []  # (row, persona, text, earlier voices)
    for index, row in enumerate(rows):
        if row.get("fault") is not None or not row.get("completion") or unsafe(row):
            continue
        if row.get("role") == "speakers":
            jobs.append((index, str(row["persona"]), str(row["completion"]), list(row.get("voices") or [])))
        elif row.get("block_reply") and row.get("block_speaker") in descriptions and not row.get("block_faults"):
            jobs.append((index, str(row["block_speaker"]), str(row["block_reply"]),
                         list(row.get("block_voices") or [])))
    for _, _, text, voices in jobs:
        texts += [text, *voices]
    vectors = embedder.encode(texts) if jobs else []
    own = {pid: vectors[i] for i, pid in enumerate(descriptions)} if jobs else {}
    at = len(descriptions)
    scores: dict[int, float] = {}
    for index, persona, text, voices in jobs:
        vector, earlier = vectors[at], vectors[at + 1: at + 1 + len(voices)]
        at += 1 + len(voices)
        mine = cosine(vector, own[persona])
        others = max((cosine(vector, v) for pid, v in own.items() if pid != persona), default=0.0)
        novelty = 1.0 - max((cosine(vector, v) for v in earlier), default=0.0)
        words = word_count(text)
        outside = max(LENGTH_BAND[0] - words, words - LENGTH_BAND[1], 0)
        scores[index] = IDENTIFY_WEIGHT * (mine - others) + NOVELTY_WEIGHT * novelty - LENGTH_PENALTY * outside
    scored = []
    for index, row in enumerate(rows):
        if row.get("fault") is not None or not row.get("completion") or unsafe(row):
            scored.append(Scored(dict(row), None))
        elif row.get("role") == "director":
            played = row.get("block_reply") is not None
            scored.append(Scored(dict(row), scores.get(index, FAULTY if played and row.get("block_faults") else 0.0)))
        else:
            scored.append(Scored(dict(row), scores.get(index, 0.0)))
    return scored


def select_rows(path: str | Path, roster: Roster, *, keep: int = 1,
                embedder: Embedder | None = None) -> dict[str, list[dict[str, Any]]]:
    """The SFT rows of a samples file: per context the ``keep`` best distinct passing samples.

    Args:
        path: The samples file.
        roster: Its roster.
        keep: Rows per context at most.
        embedder: For the measures (defaults to ``default_embedder()``).

    Returns:
        ``{"director": [...], "speakers": [...]}`` of TRL prompt-completion rows (with
        ``persona`` and ``context_id``), best first per context.

    Raises:
        ValueError: on ``keep`` below 1.
    """
    if keep < 1:
        raise ValueError(f"keep={keep}: must be at least 1")
    rows: dict[str, list[dict[str, Any]]] = {"director": [], "speakers": []}
    for item in _selected(score_samples([r for _, r in read_jsonl(path)], roster, embedder=embedder), keep):
        rows[item.row["role"]].append(_sft_row(item))
    return rows


def _selected(scored: Sequence[Scored], keep: int) -> list[Scored]:
    """The ``keep`` best distinct passing samples of each context, best first."""
    chosen = []
    for group in _groups(scored).values():
        seen: set[str] = set()
        for item in _best_first(group):
            text = " ".join(str(item.row["completion"]).lower().split())
            if text in seen:
                continue
            seen.add(text)
            chosen.append(item)
            if len(seen) >= keep:
                break
    return chosen


def pool_pairs(path: str | Path, roster: Roster, *, min_margin: float = 0.2, embedder: Embedder | None = None,
               seed: int = 0) -> dict[str, list[dict[str, Any]]]:
    """Preference pairs from the samples' own groups: per context the best passing sample
    (chosen) against a faulty one (rejected; the first drawn), or with none, the worst
    passing one when it scores at least ``min_margin`` lower.

    Returns:
        ``{"train": [...], "test": [...]}`` of TRL conversational pairs (``prompt``,
        ``chosen``, ``rejected``) with ``persona``, ``context_id``, ``provenance`` and the
        measured scores as ``chosen_overall`` and ``rejected_overall`` (a faulty sample's is
        ``FAULTY``; ``margin`` their difference); whole contexts go to test (``TEST_SHARE``, by
        a hash of the id and ``seed``).
    """
    pairs: dict[str, list[dict[str, Any]]] = {"train": [], "test": []}
    for context_id, group in _groups(score_samples([r for _, r in read_jsonl(path)], roster,
                                                   embedder=embedder)).items():
        ranked = _best_first(group)
        if not ranked:
            continue
        best = ranked[0]
        faulty = [g for g in group if not g.passed and g.row.get("completion")]
        if faulty and best.score > FAULTY:
            worse, low, why = faulty[0], FAULTY, f"fault: {faulty[0].row.get('fault')}"
        elif len(ranked) > 1 and best.score - ranked[-1].score >= min_margin and best.score > ranked[-1].score:
            worse, low, why = ranked[-1], ranked[-1].score, "lower measured score"
        else:
            continue
        prompt = best.row["prompt"]
        split = "test" if split_value(context_id, seed) < TEST_SHARE else "train"
        pairs[split].append({
            "prompt": prompt,
            "chosen": [{"role": "assistant", "content": str(best.row["completion"])}],
            "rejected": [{"role": "assistant", "content": str(worse.row["completion"])}],
            "persona": best.row["persona"], "context_id": context_id, "margin": best.score - low,
            "chosen_overall": best.score, "rejected_overall": low,
            "provenance": {"chosen": {"source": best.row.get("source"), "sample": best.row.get("sample"),
                                      "score": best.score},
                           "rejected": {"source": worse.row.get("source"), "sample": worse.row.get("sample"),
                                        "why": why}},
        })
    return pairs


def selection_counts(path: str | Path, roster: Roster, *, keep: int = 1,
                     embedder: Embedder | None = None) -> dict[str, dict[str, int]]:
    """Per ``source/role``: samples drawn, passed the checks, kept for SFT (the best ``keep``
    of their context), and each fault's count."""
    rows = [r for _, r in read_jsonl(path)]
    chosen = {(s.row.get("context_id"), s.row.get("source"), s.row.get("sample"))
              for s in _selected(score_samples(rows, roster, embedder=embedder), keep)}
    counts: dict[str, dict[str, int]] = {}
    for row in rows:
        entry = counts.setdefault(f"{row.get('source')}/{row.get('role')}", {"sampled": 0, "passed": 0, "kept": 0})
        entry["sampled"] += 1
        if row.get("fault") is None:
            entry["passed"] += 1
            entry["kept"] += (row.get("context_id"), row.get("source"), row.get("sample")) in chosen
        else:
            entry[str(row["fault"])] = entry.get(str(row["fault"]), 0) + 1
    return counts


def _groups(scored: Sequence[Scored]) -> dict[str, list[Scored]]:
    groups: dict[str, list[Scored]] = {}
    for item in scored:
        groups.setdefault(str(item.row.get("context_id")), []).append(item)
    return groups


def _best_first(group: Sequence[Scored]) -> list[Scored]:
    """The passing samples of a group, best first (ties: by source name, then sample index)."""
    passed = [g for g in group if g.passed and g.score is not None]
    return sorted(passed, key=lambda g: (-g.score, str(g.row.get("source")), int(g.row.get("sample") or 0)))


def _sft_row(item: Scored) -> dict[str, Any]:
    row = item.row
    return {"prompt": row["prompt"], "completion": [{"role": "assistant", "content": row["completion"]}],
            "persona": row["persona"], "context_id": row["context_id"]}
