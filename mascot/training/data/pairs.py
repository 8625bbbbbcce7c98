"""Preference pairs from judged candidate replies, in TRL's conversational format.

The MASCOT recipe samples K replies per context (one speaker's turn: the prompt as that
speaker saw it), has a rubric judge score each, and keeps the pairs whose judged scores
differ by at least 0.5 on the judge's 1-5 scale. A judgement's ``overall`` is the 0-100
mapping of the 1-5 criterion mean, ``overall = (mean - 1) / 4 * 100``, so one unit of the
1-5 scale is 25 points of ``overall`` and the paper's 0.5 is 12.5 points.

Every pair is one row with TRL's columns ``prompt`` (the messages), ``chosen`` and
``rejected`` (one assistant message each), plus ``margin`` (1-5 units), the context, the
persona and where both scores came from. Train and test are split by context, so no
context (and no prompt) is in both.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import combinations
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from mascot.training.jsonl import JsonlError, read_records, rewrite_jsonl
from mascot.training.judging.judgement import JudgedCandidate, Message

logger = logging.getLogger(__name__)

#: Points of the 0-100 ``overall`` per unit of the judge's 1-5 scale.
POINTS_PER_JUDGE_UNIT = 25.0
#: The paper's rule: keep pairs whose judged scores differ by at least this (1-5 units).
DEFAULT_MIN_MARGIN = 0.5
#: Files written by ``write_pairs``.
TRAIN_FILE, TEST_FILE = "train.jsonl", "test.jsonl"
_EPSILON = 1e-9  # a 12.5-point gap computed from means must still count as 0.5


class PairsError(ValueError):
    """Preference pairs cannot be built, written or read; the message is one line."""


class PreferencePair(BaseModel):
    """One preference pair as stored on disk (one JSONL line) and handed to TRL.

    Attributes:
        prompt: The shared prompt (chat messages).
        chosen: The better reply as one assistant message.
        rejected: The worse reply as one assistant message.
        margin: ``chosen_overall - rejected_overall`` in 1-5 judge units (> 0).
        context_id: The context both replies answer.
        persona: The speaker's persona id.
        chosen_overall: The better reply's overall score (0-100).
        rejected_overall: The worse reply's overall score (0-100).
        provenance: ``{"chosen": judgement, "rejected": judgement}``.
    """

    model_config = ConfigDict(extra="forbid")

    prompt: list[Message] = Field(min_length=1)
    chosen: list[Message] = Field(min_length=1, max_length=1)
    rejected: list[Message] = Field(min_length=1, max_length=1)
    margin: float = Field(gt=0.0)
    context_id: str = Field(min_length=1)
    persona: str
    chosen_overall: float
    rejected_overall: float
    provenance: dict[str, Any] = Field(default_factory=dict)


@dataclass(frozen=True)
class PairsReport:
    """What ``build_pairs`` kept and dropped.

    Attributes:
        contexts: Contexts seen (with at least one candidate).
        candidates: Candidates seen, failed judgements included.
        failed_judgements: Candidates skipped because their judgement failed.
        pairs_kept: Pairs kept (train + test).
        dropped_by_margin: Candidate pairs whose scores differ by less than the margin.
        dropped_identical: Candidate pairs with the same reply text (nothing to learn).
        train_pairs: Pairs in the train split.
        test_pairs: Pairs in the test split.
        train_contexts: Contexts with pairs in the train split.
        test_contexts: Contexts with pairs in the test split.
        min_margin: The margin used, in 1-5 judge units.
    """

    contexts: int
    candidates: int
    failed_judgements: int
    pairs_kept: int
    dropped_by_margin: int
    dropped_identical: int
    train_pairs: int
    test_pairs: int
    train_contexts: int
    test_contexts: int
    min_margin: float


@dataclass(frozen=True)
class PairSet:
    """Preference pairs split by context, as plain records (TRL's dataset rows)."""

    train: list[dict[str, Any]]
    test: list[dict[str, Any]]
    report: PairsReport


#: Judging modes whose scores order a context's candidates rather than score each on its own.
RELATIVE_MODES = ("ranking", "pairwise")


def build_pairs(
    candidates: Iterable[JudgedCandidate],
    *,
    min_margin: float = DEFAULT_MIN_MARGIN,
    test_fraction: float = 0.1,
    seed: int = 0,
) -> PairSet:
    """Pair judged candidate replies of the same context into preference pairs.

    Within each context every two candidates whose overall scores differ by at least
    ``min_margin`` judge units make one pair (the higher score is ``chosen``); candidates
    judged together by a relative judge (``judgement["mode"]`` ranking or pairwise) make one
    whenever one scores higher, since their scores are an order (the sanity gate scores it so). A context
    goes to the test split when a hash of ``(seed, context_id)`` falls below
    ``test_fraction``, so the split is the same on every run and a context never lands in
    both splits, whatever other contexts the data holds.

    Args:
        candidates: Judged candidates, in any order.
        min_margin: Smallest score difference kept, in units of the judge's 1-5 scale
            (the paper's 0.5 equals 12.5 points of the 0-100 ``overall``).
        test_fraction: Expected fraction of contexts held out for testing, in [0, 1).
        seed: Seed of the split.

    Returns:
        The pairs and a report of the counts.

    Raises:
        ValueError: if ``min_margin`` is not in (0, 4] or ``test_fraction`` not in [0, 1).
        PairsError: if candidates of one context disagree on the prompt or the persona,
            or if no pair is left (the message says how many the margin dropped).
    """
    if not 0.0 < min_margin <= 4.0:
        raise ValueError(f"min_margin={min_margin}: must be in (0, 4] (units of the 1-5 judge scale)")
    if not 0.0 <= test_fraction < 1.0:
        raise ValueError(f"test_fraction={test_fraction}: must be in [0, 1)")
    groups: dict[str, list[JudgedCandidate]] = {}
    for candidate in candidates:
        groups.setdefault(candidate.context_id, []).append(candidate)
    failed = dropped_margin = dropped_identical = 0
    train: list[dict[str, Any]] = []
    test: list[dict[str, Any]] = []
    train_contexts: set[str] = set()
    test_contexts: set[str] = set()
    min_points = min_margin * POINTS_PER_JUDGE_UNIT - _EPSILON
    for context_id, group in groups.items():
        _check_context(context_id, group)
        judged = [c for c in group if c.overall is not None]
        failed += len(group) - len(judged)
        judged.sort(key=lambda c: -c.overall)  # type: ignore[operator]  # stable: ties keep input order
        pairs = []
        for better, worse in combinations(judged, 2):
            # a relative judge (ranking, pairwise) gives an order, and its sanity gate scored
            # that order (any higher score right): its pairs need a strict order, not a margin
            relative = all(c.judgement.get("mode") in RELATIVE_MODES for c in (better, worse))
            if better.overall - worse.overall < (_EPSILON if relative else min_points):  # type: ignore[operator]
                dropped_margin += 1
            elif better.reply == worse.reply:
                dropped_identical += 1
            else:
                pairs.append(_pair(better, worse))
        if not pairs:
            continue
        held_out = split_value(context_id, seed) < test_fraction
        (test if held_out else train).extend(pairs)
        (test_contexts if held_out else train_contexts).add(context_id)
    report = PairsReport(
        contexts=len(groups),
        candidates=sum(len(g) for g in groups.values()),
        failed_judgements=failed,
        pairs_kept=len(train) + len(test),
        dropped_by_margin=dropped_margin,
        dropped_identical=dropped_identical,
        train_pairs=len(train),
        test_pairs=len(test),
        train_contexts=len(train_contexts),
        test_contexts=len(test_contexts),
        min_margin=min_margin,
    )
    if not report.pairs_kept:
        raise PairsError(
            f"no preference pairs: {dropped_margin} candidate pairs differ by less than "
            f"min_margin={min_margin:g} (1-5 scale, {min_margin * POINTS_PER_JUDGE_UNIT:g} points "
            f"of overall), {dropped_identical} have identical replies, {failed} failed "
            f"judgements skipped ({report.candidates} candidates in {report.contexts} contexts)"
        )
    if test_fraction > 0 and not test:
        logger.warning("no context fell into the test split (%d contexts with pairs)", len(train_contexts))
    logger.info(
        "%d pairs (%d train, %d test) from %d candidates in %d contexts; dropped %d by the "
        "margin, %d identical; %d failed judgements skipped",
        report.pairs_kept, report.train_pairs, report.test_pairs, report.candidates,
        report.contexts, dropped_margin, dropped_identical, failed,
    )
    return PairSet(train=train, test=test, report=report)


def _check_context(context_id: str, group: Sequence[JudgedCandidate]) -> None:
    first = group[0]
    for other in group[1:]:
        if other.prompt != first.prompt:
            raise PairsError(f"context '{context_id}': candidates have different prompts")
        if other.persona != first.persona:
            raise PairsError(
                f"context '{context_id}': candidates of different personas "
                f"('{first.persona}', '{other.persona}')"
            )


def _pair(better: JudgedCandidate, worse: JudgedCandidate) -> dict[str, Any]:
    assert better.overall is not None and worse.overall is not None
    pair = PreferencePair(
        prompt=better.prompt,
        chosen=[Message(role="assistant", content=better.reply)],
        rejected=[Message(role="assistant", content=worse.reply)],
        margin=round((better.overall - worse.overall) / POINTS_PER_JUDGE_UNIT, 6),
        context_id=better.context_id,
        persona=better.persona,
        chosen_overall=better.overall,
        rejected_overall=worse.overall,
        provenance={"chosen": better.judgement, "rejected": worse.judgement},
    )
    return pair.model_dump(mode="json")


def split_value(context_id: str, seed: int) -> float:
    """A number in [0, 1) fixed by seed and context id (the same on every machine)."""
    digest = hashlib.sha256(f"{seed}\0{context_id}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64


def write_pairs(pair_set: PairSet, out_dir: str | Path) -> tuple[Path, Path]:
    """Write the splits as ``train.jsonl`` and ``test.jsonl``, each replaced atomically.

    Args:
        pair_set: What ``build_pairs`` returned.
        out_dir: The folder (created if missing; its parent must exist).

    Returns:
        The paths of the train and the test file.

    Raises:
        PairsError: if the folder cannot be created or the files cannot be written.
    """
    out_dir = Path(out_dir).expanduser()
    try:
        out_dir.mkdir(exist_ok=True)
        paths = out_dir / TRAIN_FILE, out_dir / TEST_FILE
        for path, records in zip(paths, (pair_set.train, pair_set.test), strict=True):
            rewrite_jsonl(path, records)
    except OSError as exc:
        raise PairsError(f"cannot write pairs to {out_dir} ({exc.strerror or exc})") from None
    logger.info("wrote %d train and %d test pairs to %s", len(pair_set.train), len(pair_set.test), out_dir)
    return paths


def read_pairs(path: str | Path) -> list[dict[str, Any]]:
    """Read a pairs file written by ``write_pairs``.

    Args:
        path: A ``train.jsonl`` or ``test.jsonl`` file.

    Returns:
        The pairs as records, in file order.

    Raises:
        PairsError: if the file is missing or unreadable, or a line is not a valid pair
            (the message names file and line).
    """
    path = Path(path).expanduser()
    if not path.is_file():
        raise PairsError(f"no pairs file at {path}")
    pairs = []
    try:
        for _, pair in read_records(path, PreferencePair, "a preference pair"):
            pairs.append(pair.model_dump(mode="json"))
    except JsonlError as exc:
        raise PairsError(str(exc)) from None
    return pairs
