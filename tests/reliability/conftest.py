"""The reliability suite: prints its tally as one screen when the run ends."""

from __future__ import annotations

from typing import Any

from suite_tally import ORDER, TALLY


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """One screen: faults injected, crashes survived, inputs tried, items done and lost."""
    if not TALLY:
        return
    terminalreporter.write_sep("=", "reliability suite")
    for key in (*ORDER, *sorted(set(TALLY) - set(ORDER))):
        terminalreporter.write_line(f"{key:>22}: {TALLY[key]:,}")
