"""What the reliability suite did, added up across its tests and printed at the end."""

from __future__ import annotations

from collections import Counter
from collections.abc import Hashable, Iterable
from typing import Any

#: faults injected, crashes survived, inputs tried, items done (unique), items lost,
#: duplicated and unexpected (these three must stay 0: the session fails otherwise)
TALLY: Counter[str] = Counter()
ORDER = ("faults injected", "crashes survived", "inputs tried", "items done", "items lost", "items duplicated",
         "items unexpected")
MUST_BE_ZERO = ("items lost", "items duplicated", "items unexpected")


def count(**amounts: int) -> None:
    """Add to the tally: ``count(faults_injected=3, items_done=8)``."""
    for key, amount in amounts.items():
        TALLY[key.replace("_", " ")] += amount


def account(done: Iterable[Hashable], expected: Iterable[Hashable]) -> None:
    """Tally what a run wrote against what it was asked for, by item key.

    Args:
        done: The key of every item the run wrote, repeats included.
        expected: The keys it should have written, once each.
    """
    written, wanted = Counter(list(done)), set(expected)  # list(): a Counter takes a mapping as counts
    count(items_done=len(set(written) & wanted), items_lost=len(wanted - set(written)),
          items_duplicated=sum(n - 1 for n in written.values()), items_unexpected=len(set(written) - wanted))


def disagreements() -> list[str]:
    """The tally's counts that should be 0 and are not."""
    return [f"{key}: {TALLY[key]}" for key in MUST_BE_ZERO if TALLY[key]]


def fail_on_disagreement(session: Any) -> None:
    """Turn a passing pytest session into a failed one while ``disagreements()`` is not empty."""
    if disagreements() and session.exitstatus == 0:
        session.exitstatus = 1
