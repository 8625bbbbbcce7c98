"""Agreement between judges: Krippendorff's alpha (interval) and mean pairwise Spearman."""

from __future__ import annotations

from collections.abc import Sequence
from itertools import combinations
from math import fsum, sqrt


def agreement(scores: Sequence[Sequence[float | None]]) -> dict[str, float | None]:
    """Inter-rater agreement of a rater x unit score matrix.

    ``krippendorff_alpha`` is Krippendorff's alpha with the *interval* metric (squared
    differences), because the overall score already treats the 1-5 scale as interval
    (a plain mean). Over the units with at least two scores (n values in all)::

        alpha = 1 - D_o / D_e
        D_o = (1 / n) * sum over units u of  sum_{i != j in u} (v_i - v_j)^2 / (m_u - 1)
        D_e = sum_{i != j over all n values} (v_i - v_j)^2 / (n (n - 1))

    ``spearman`` is the mean Spearman rank correlation (average ranks for ties) over all
    pairs of raters, each on the units both of them scored.

    Args:
        scores: One row per rater (judge), one column per unit (target); ``None`` is a
            missing score (a failed judgement).

    Returns:
        ``{"krippendorff_alpha": ..., "spearman": ...}``; a value is ``None`` where it is
        undefined (no unit with two scores or no variation at all; no pair of raters
        with two common units that vary).

    Raises:
        ValueError: if the rows differ in length.
    """
    if len({len(row) for row in scores}) > 1:
        raise ValueError(f"every rater needs one score (or None) per unit; row lengths {[len(r) for r in scores]}")
    rows = [[None if v is None else float(v) for v in row] for row in scores]
    return {"krippendorff_alpha": _krippendorff_interval(rows), "spearman": _mean_spearman(rows)}


def _squares(values: Sequence[float]) -> float:
    """Sum of squared deviations from the mean."""
    mean = fsum(values) / len(values)
    return fsum((v - mean) ** 2 for v in values)


def _krippendorff_interval(rows: list[list[float | None]]) -> float | None:
    units = [[v for v in column if v is not None] for column in zip(*rows, strict=True)]
    units = [u for u in units if len(u) >= 2]
    if not units:
        return None
    n = sum(len(u) for u in units)
    # the sum over ordered pairs i != j of (v_i - v_j)^2 is 2 m times the squared deviations
    observed = fsum(2 * len(u) * _squares(u) / (len(u) - 1) for u in units) / n
    expected = 2 * n * _squares([v for u in units for v in u]) / (n * (n - 1))
    return None if expected == 0 else 1 - observed / expected


def _ranks(values: Sequence[float]) -> list[float]:
    """1-based ranks, tied values sharing their average rank."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    first = 0
    while first < len(order):
        last = first
        while last + 1 < len(order) and values[order[last + 1]] == values[order[first]]:
            last += 1
        for position in range(first, last + 1):
            ranks[order[position]] = (first + last) / 2 + 1
        first = last + 1
    return ranks


def _mean_spearman(rows: list[list[float | None]]) -> float | None:
    rhos = []
    for a, b in combinations(rows, 2):
        both = [(x, y) for x, y in zip(a, b, strict=True) if x is not None and y is not None]
        if len(both) < 2:
            continue
        x, y = _ranks([p[0] for p in both]), _ranks([p[1] for p in both])
        mx, my = fsum(x) / len(x), fsum(y) / len(y)
        sxx, syy = _squares(x), _squares(y)
        if sxx > 0 and syy > 0:
            rhos.append(fsum((p - mx) * (q - my) for p, q in zip(x, y, strict=True)) / sqrt(sxx * syy))
    return fsum(rhos) / len(rhos) if rhos else None
