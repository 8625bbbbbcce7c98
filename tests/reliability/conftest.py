"""The reliability suite: prints its tally as one screen when the run ends."""

from __future__ import annotations

from typing import Any

from suite_tally import ORDER, TALLY, disagreements, fail_on_disagreement


def pytest_terminal_summary(terminalreporter: Any, exitstatus: int, config: Any) -> None:
    """One screen: faults injected, crashes survived, inputs tried, items done and lost."""
    if not TALLY:
        return
    terminalreporter.write_sep("=", "reliability suite")
    keys = (*ORDER, *sorted(set(TALLY) - set(ORDER)))
    width = max(map(len, keys))
    for key in keys:
        terminalreporter.write_line(f"{key:>{width}}: {TALLY[key]:,}")
    if disagreements():
        terminalreporter.write_line("reliability tally FAILED: " + ", ".join(disagreements()), red=True)


def pytest_sessionfinish(session: Any, exitstatus: int) -> None:
    """Items lost, written twice or never asked for fail the run even if each test passed."""
    fail_on_disagreement(session)
