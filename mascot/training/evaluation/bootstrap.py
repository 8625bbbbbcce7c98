"""Bootstrap confidence intervals for the difference of two systems' mean scores.

Evaluation runs every system on the same plan (the same scenario x person x repeat gives
the same episode id), so differences are paired by episode: each resample draws episode
ids with replacement and takes the mean of the per-episode differences. Without common
ids the two samples are resampled independently. Episodes of one scenario are not
independent (the same opening, several people), so with ``clusters`` (episode id ->
scenario id) each resample draws whole scenarios with replacement and takes the mean of
the per-episode differences of the episodes drawn: the interval of a clustered bootstrap.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from dataclasses import dataclass

#: Resamples per interval.
RESAMPLES = 2000


@dataclass(frozen=True)
class Difference:
    """``mean(a) - mean(b)`` with its bootstrap interval at ``level``, over ``n`` pairs
    (or ``n`` = the smaller sample when unpaired)."""

    estimate: float
    low: float
    high: float
    level: float
    n: int
    paired: bool

    @property
    def significant(self) -> bool:
        """Whether the interval excludes 0."""
        return self.low > 0 or self.high < 0


def bootstrap_difference(
    a: Mapping[str, float],
    b: Mapping[str, float],
    *,
    resamples: int = RESAMPLES,
    level: float = 0.95,
    seed: int = 0,
    clusters: Mapping[str, str] | None = None,
) -> Difference:
    """The difference of the means of ``a`` and ``b`` (episode id -> score) with a
    percentile bootstrap interval.

    Args:
        clusters: Episode id -> cluster (scenario) id; paired differences are then
            resampled by whole cluster (``n`` stays the number of pairs).

    Raises:
        ValueError: on an empty sample or ``level`` outside (0, 1).
    """
    if not a or not b:
        raise ValueError(f"both samples need values (got {len(a)} and {len(b)})")
    if not 0 < level < 1:
        raise ValueError(f"level={level}: must be between 0 and 1")
    rng = random.Random(seed)
    common = sorted(set(a) & set(b))
    if common:
        diffs = [a[k] - b[k] for k in common]
        estimate = sum(diffs) / len(diffs)
        if clusters is not None:
            missing = [k for k in common if k not in clusters]
            if missing:
                raise ValueError(f"episode(s) {', '.join(missing[:3])} have no cluster")
            groups: dict[str, list[float]] = {}
            for key, diff in zip(common, diffs, strict=True):
                groups.setdefault(clusters[key], []).append(diff)
            members = list(groups.values())
            means = sorted(_pooled_mean(rng.choices(members, k=len(members))) for _ in range(resamples))
        else:
            means = sorted(sum(rng.choices(diffs, k=len(diffs))) / len(diffs) for _ in range(resamples))
        n, paired = len(common), True
    else:
        xs, ys = list(a.values()), list(b.values())
        estimate = sum(xs) / len(xs) - sum(ys) / len(ys)
        means = sorted(sum(rng.choices(xs, k=len(xs))) / len(xs) - sum(rng.choices(ys, k=len(ys))) / len(ys)
                       for _ in range(resamples))
        n, paired = min(len(xs), len(ys)), False
    tail = (1 - level) / 2
    low = means[int(tail * (resamples - 1))]
    high = means[int((1 - tail) * (resamples - 1))]
    return Difference(estimate=estimate, low=low, high=high, level=level, n=n, paired=paired)


def _pooled_mean(groups: list[list[float]]) -> float:
    values = [v for group in groups for v in group]
    return sum(values) / len(values)
