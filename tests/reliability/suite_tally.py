"""What the reliability suite did, added up across its tests and printed at the end."""

from __future__ import annotations

from collections import Counter

#: faults injected, crashes survived, inputs tried, items done, items lost (must stay 0)
TALLY: Counter[str] = Counter()
ORDER = ("faults injected", "crashes survived", "inputs tried", "items done", "items lost")


def count(**amounts: int) -> None:
    """Add to the tally: ``count(faults_injected=3, items_done=8)``."""
    for key, amount in amounts.items():
        TALLY[key.replace("_", " ")] += amount
