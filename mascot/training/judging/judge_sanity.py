"""Judge sanity: a judge run on a sanity set, scored, and gated before its labels are trained on.

``run_sanity`` judges every distinct target of a sanity set (``sanity_set``) once; accuracy
is the share of pairs in which the better side's overall score is higher. A tie or a failed
judgement of either side counts as wrong, so a judge that scores everything alike scores 0.
Each report carries the one-sided binomial p-value of its score against a coin
(``binomial_p``: 8 of 12 right has p = 0.19, no evidence at all). A judge is trusted with a
rubric's labels only at ``SANITY_THRESHOLD`` (75 %) or more with p below ``SANITY_P_VALUE``
(0.01); otherwise ``mascot pairs --sanity REPORT`` labels with the metric judge alone
(``sanity_metric_weight``, ``metric_judge``) and says so.

``run_relative_sanity`` measures a relative mode (``judging.relative``: ranking, pairwise) on
the same pairs, each pair one context of two candidates; ``choose_mode`` keeps the mode that
passes the gate with the highest accuracy, and its report says which mode labels and what
every mode scored (``modes``).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.rosters import Roster
from mascot.rosters.yaml_file import first_error_line
from mascot.training.judging.judge import Judge
from mascot.training.judging.judgement import Judgement
from mascot.training.judging.metric_judge import SANITY_FALLBACK_WEIGHT, metric_overalls
from mascot.training.judging.relative import RelativeJudge
from mascot.training.judging.sanity_set import SanityError, SanitySet, TargetKind

#: Least share of sanity pairs a judge must get right to be trusted with a rubric's labels.
SANITY_THRESHOLD = 0.75
#: Largest p-value (one-sided binomial against chance) of a trusted judge's score.
SANITY_P_VALUE = 0.01


class SideResult(BaseModel):
    """One side of a pair as judged: ``overall`` is ``None`` when the judgement failed."""

    model_config = ConfigDict(extra="forbid")
    overall: float | None
    scores: dict[str, int] = Field(default_factory=dict)
    rationale: str = ""
    error: str | None = None


class PairResult(BaseModel):
    """One judged pair; ``right`` when the better side scored strictly higher."""

    model_config = ConfigDict(extra="forbid")
    id: str
    kind: str
    better: SideResult
    worse: SideResult
    right: bool


class KindTally(BaseModel):
    """Pairs right out of all pairs of one contrast."""

    model_config = ConfigDict(extra="forbid")
    right: int = Field(ge=0)
    total: int = Field(ge=1)


class ModeTally(BaseModel):
    """One judging mode's result on a sanity set (``SanityReport.modes``)."""

    model_config = ConfigDict(extra="forbid")
    right: int = Field(ge=0)
    total: int = Field(ge=1)
    accuracy: float = Field(ge=0.0, le=1.0)
    p_value: float
    passed: bool
    failed_judgements: int = Field(ge=0)
    seconds: float = Field(ge=0.0)


class SanityReport(BaseModel):
    """A judge's result on a sanity set (the JSON ``mascot judge --sanity --out`` writes).

    Attributes:
        judge: The judge model's name (``metric:<embedder>`` for the metric judge).
        rubric, rubric_version: The rubric judged with (``metric``, ``None``: the metric judge).
        roster, target, sanity_set: Which sanity set (``target``: ``reply`` or ``block``).
        right, total, accuracy: Pairs right, pairs, their ratio.
        p_value: ``binomial_p(right, total)``: the chance a coin does as well (``None`` in
            reports written before it was recorded).
        threshold, passed: ``SANITY_THRESHOLD`` and whether the judge is trusted:
            ``accuracy >= threshold`` with ``p_value < SANITY_P_VALUE``.
        by_kind: Per contrast, pairs right and pairs.
        judgements, failed_judgements: Distinct targets judged, and how many failed.
        seconds: Wall time of the judging.
        pairs: Every pair with both sides' scores.
        metric_judge: The metric judge's report on the same set, when it was run.
    """

    model_config = ConfigDict(extra="forbid")
    judge: str
    rubric: str
    rubric_version: int | None
    roster: str
    target: TargetKind
    sanity_set: str
    right: int = Field(ge=0)
    total: int = Field(ge=1)
    accuracy: float = Field(ge=0.0, le=1.0)
    p_value: float | None = None
    threshold: float
    passed: bool
    by_kind: dict[str, KindTally]
    judgements: int = Field(ge=0)
    failed_judgements: int = Field(ge=0)
    seconds: float = Field(ge=0.0)
    pairs: list[PairResult]
    metric_judge: SanityReport | None = None
    mode: Literal["absolute", "ranking", "pairwise"] = "absolute"
    modes: dict[str, ModeTally] | None = None

    def summary(self) -> str:
        """One line: pairs right, accuracy and the tally per contrast (and per mode, when several were measured)."""
        kinds = ", ".join(f"{kind} {t.right}/{t.total}" for kind, t in self.by_kind.items())
        chance = f", p = {self.p_value:.2g} against chance" if self.p_value is not None else ""
        modes = "; modes: " + ", ".join(f"{name} {t.right}/{t.total}{' (passed)' if t.passed else ''}"
                                        for name, t in self.modes.items()) if self.modes else ""
        label = f"{self.mode} mode: " if self.mode != "absolute" or self.modes else ""
        return f"{label}{self.right}/{self.total} pairs right ({self.accuracy:.0%}{chance}); by kind: {kinds}{modes}"

    def verdict(self) -> str:
        """Whether the judge labels this rubric, and why, in words."""
        rule = f"needs {SANITY_THRESHOLD:.0%} with p < {SANITY_P_VALUE}"
        if self.passed:
            return f"trusted ({rule})"
        return f"not trusted ({rule}): the metric judge labels this rubric alone"


def binomial_p(right: int, total: int) -> float:
    """One-sided binomial p-value: the chance of ``right`` or more of ``total`` pairs right
    by guessing (each pair 1/2)."""
    return sum(math.comb(total, k) for k in range(right, total + 1)) / 2 ** total


def trusted(right: int, total: int) -> bool:
    """Whether a judge with ``right`` of ``total`` sanity pairs right labels training data."""
    return right / total >= SANITY_THRESHOLD and binomial_p(right, total) < SANITY_P_VALUE


def _report(
    sanity_set: SanitySet,
    sides: Sequence[tuple[SideResult, SideResult]],
    *,
    judge: str,
    rubric: str,
    rubric_version: int | None,
    judgements: int,
    failed: int,
    seconds: float,
) -> SanityReport:
    results = []
    for pair, (better, worse) in zip(sanity_set.pairs, sides, strict=True):
        right = better.overall is not None and worse.overall is not None and better.overall > worse.overall
        results.append(PairResult(id=pair.id, kind=pair.kind, better=better, worse=worse, right=right))
    counts: dict[str, tuple[int, int]] = {}
    for result in results:
        right, total = counts.get(result.kind, (0, 0))
        counts[result.kind] = (right + result.right, total + 1)
    right = sum(r.right for r in results)
    accuracy = right / len(results)
    return SanityReport(
        judge=judge, rubric=rubric, rubric_version=rubric_version, roster=sanity_set.roster,
        target=sanity_set.target, sanity_set=sanity_set.source, right=right, total=len(results),
        accuracy=round(accuracy, 4), p_value=binomial_p(right, len(results)), threshold=SANITY_THRESHOLD,
        passed=trusted(right, len(results)),
        by_kind={kind: KindTally(right=r, total=t) for kind, (r, t) in counts.items()},
        judgements=judgements, failed_judgements=failed, seconds=round(seconds, 3), pairs=results,
    )


def _side(judgement: Judgement) -> SideResult:
    return SideResult(overall=judgement.overall, scores=judgement.scores, rationale=judgement.rationale,
                      error=judgement.error)


def run_sanity(
    judge: Judge,
    sanity_set: SanitySet,
    *,
    concurrency: int = 8,
    on_judgement: Callable[[Judgement], None] | None = None,
) -> SanityReport:
    """``arun_sanity`` in an event loop of its own."""
    return asyncio.run(arun_sanity(judge, sanity_set, concurrency=concurrency, on_judgement=on_judgement))


async def arun_sanity(
    judge: Judge,
    sanity_set: SanitySet,
    *,
    concurrency: int = 8,
    on_judgement: Callable[[Judgement], None] | None = None,
) -> SanityReport:
    """Judge both sides of every pair (each distinct target once) and score the judge.

    Args:
        judge: The judge; its rubric must judge the set's kind of target.
        sanity_set: From ``load_sanity_set``.
        concurrency: Targets judged at once.
        on_judgement: Called with each judgement when it is done (progress).

    Returns:
        The report: accuracy (ties and failed judgements count as wrong), per contrast,
        every pair's scores, and the seconds the judging took.

    Raises:
        ValueError: if the rubric judges the other kind of target, or ``concurrency`` < 1.
        Exception: a model error that is not a transient server fault (see ``Judge.ajudge``).
    """
    if judge.rubric.target != sanity_set.target:
        raise ValueError(f"rubric '{judge.rubric.id}' judges a {judge.rubric.target}; "
                         f"this sanity set holds {sanity_set.target} pairs")
    targets = sanity_set.targets()
    start = time.perf_counter()
    judged = await judge.ajudge_many(targets, concurrency=concurrency, on_judgement=on_judgement)
    seconds = time.perf_counter() - start
    by_key = {t.model_dump_json(): _side(j) for t, j in zip(targets, judged, strict=True)}
    sides = [(by_key[p.better.model_dump_json()], by_key[p.worse.model_dump_json()]) for p in sanity_set.pairs]
    return _report(sanity_set, sides, judge=judge.model_name, rubric=judge.rubric.id,
                   rubric_version=judge.rubric.version, judgements=len(judged),
                   failed=sum(j.status == "failed" for j in judged), seconds=seconds)


def run_relative_sanity(
    judge: RelativeJudge,
    sanity_set: SanitySet,
    *,
    concurrency: int = 8,
    on_judgement: Callable[[Judgement], None] | None = None,
) -> SanityReport:
    """``arun_relative_sanity`` in an event loop of its own."""
    return asyncio.run(arun_relative_sanity(judge, sanity_set, concurrency=concurrency, on_judgement=on_judgement))


async def arun_relative_sanity(
    judge: RelativeJudge,
    sanity_set: SanitySet,
    *,
    concurrency: int = 8,
    on_judgement: Callable[[Judgement], None] | None = None,
) -> SanityReport:
    """A relative judge (ranking or pairwise) on a sanity set: each pair is one context of two
    candidates, judged together; the pair is right when the better side scores higher.

    Raises:
        ValueError: if the rubric judges the other kind of target, or ``concurrency`` < 1.
    """
    if judge.judge.rubric.target != sanity_set.target:
        raise ValueError(f"rubric '{judge.judge.rubric.id}' judges a {judge.judge.rubric.target}; "
                         f"this sanity set holds {sanity_set.target} pairs")
    start = time.perf_counter()
    judged = await judge.ajudge_groups([[p.better, p.worse] for p in sanity_set.pairs],
                                       concurrency=concurrency, on_judgement=on_judgement)
    seconds = time.perf_counter() - start
    sides = [(_side(better), _side(worse)) for better, worse in judged]
    report = _report(sanity_set, sides, judge=judge.judge.model_name, rubric=judge.judge.rubric.id,
                     rubric_version=judge.judge.rubric.version, judgements=2 * len(judged),
                     failed=sum(j.status == "failed" for group in judged for j in group), seconds=seconds)
    return report.model_copy(update={"mode": judge.mode})


def choose_mode(reports: Sequence[SanityReport]) -> SanityReport:
    """The report of the mode that labels: of the modes that passed the gate, the most
    accurate (the first given on a tie); when none passed, the first report (its rubric is
    then labelled by the metric judge). It lists what every mode scored in ``modes``.

    Raises:
        ValueError: on no reports.
    """
    if not reports:
        raise ValueError("choose_mode needs at least one report")
    passed = [r for r in reports if r.passed]
    chosen = max(passed, key=lambda r: r.accuracy) if passed else reports[0]
    tallies = {r.mode: ModeTally(right=r.right, total=r.total, accuracy=r.accuracy,
                                 p_value=r.p_value if r.p_value is not None else binomial_p(r.right, r.total),
                                 passed=r.passed, failed_judgements=r.failed_judgements, seconds=r.seconds)
               for r in reports}
    return chosen.model_copy(update={"modes": tallies})


def metric_sanity(sanity_set: SanitySet, roster: Roster, *, embedder: Embedder | None = None) -> SanityReport:
    """The metric judge (``metric_judge.metric_overalls``) on a sanity set, scored as a judge.

    Raises:
        ValueError: if the set is of another roster.
    """
    if roster.id != sanity_set.roster:
        raise ValueError(f"the sanity set is of roster '{sanity_set.roster}', not '{roster.id}'")
    embedder = embedder or default_embedder()
    start = time.perf_counter()
    candidates = [c for p in sanity_set.pairs for c in (p.better_candidate, p.worse_candidate)]
    scores = iter(metric_overalls(candidates, roster, embedder=embedder))
    sides = [(SideResult(overall=round(next(scores), 4)), SideResult(overall=round(next(scores), 4)))
             for _ in sanity_set.pairs]
    distinct = len({(c.context_id, c.reply) for c in candidates})
    return _report(sanity_set, sides, judge=f"metric:{embedder.name}", rubric="metric", rubric_version=None,
                   judgements=distinct, failed=0, seconds=time.perf_counter() - start)


def read_sanity_report(path: str | Path) -> SanityReport:
    """Read a report written by ``mascot judge --sanity --out``.

    Raises:
        SanityError: if the file is missing, not JSON or not a sanity report.
    """
    path = Path(path).expanduser()
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SanityError(f"{path}: cannot read the sanity report ({exc.strerror or exc})") from None
    try:
        return SanityReport.model_validate_json(text)
    except ValidationError as exc:
        raise SanityError(f"{path}: not a judge sanity report ({first_error_line(exc)})") from None


def sanity_metric_weight(report: SanityReport) -> float:
    """The metric judge's weight in the labels by the judge's sanity result: 0 (the judge
    alone) for a trusted judge, else ``SANITY_FALLBACK_WEIGHT`` (1: the metric judge alone).
    A report without a p-value is judged on its pairs again (``trusted``)."""
    return 0.0 if trusted(report.right, report.total) else SANITY_FALLBACK_WEIGHT
