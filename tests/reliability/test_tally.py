"""The tally counts unique items and fails the run when items are lost, repeated or unasked for."""

from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import pytest
import suite_tally


@pytest.fixture()
def fresh_tally(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    tally: Counter[str] = Counter()
    monkeypatch.setattr(suite_tally, "TALLY", tally)
    return tally


def test_account_counts_unique_items_and_what_disagrees(fresh_tally: Counter[str]) -> None:
    suite_tally.account(["a", "b", "b", "c", "x"], expected=["a", "b", "c", "d"])
    assert fresh_tally["items done"] == 3  # a duplicate is not a second item done
    assert fresh_tally["items lost"] == 1 and fresh_tally["items duplicated"] == 1
    assert fresh_tally["items unexpected"] == 1
    assert suite_tally.disagreements() == ["items lost: 1", "items duplicated: 1", "items unexpected: 1"]


def test_a_clean_run_has_no_disagreements(fresh_tally: Counter[str]) -> None:
    suite_tally.account(["a", "b"], expected={"b", "a"})
    assert fresh_tally["items done"] == 2 and suite_tally.disagreements() == []


def test_disagreeing_counts_fail_the_session(fresh_tally: Counter[str]) -> None:
    session = SimpleNamespace(exitstatus=0)
    suite_tally.fail_on_disagreement(session)
    assert session.exitstatus == 0
    suite_tally.account(["a", "a"], expected=["a"])
    suite_tally.fail_on_disagreement(session)
    assert session.exitstatus == 1
