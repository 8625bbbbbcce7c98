"""Preference pairs: the margin rule in judge units, the split by context, files on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mascot.training.data.pairs import (
    PairsError,
    build_pairs,
    read_pairs,
    write_pairs,
)
from mascot.training.judging.judgement import JudgedCandidate

PROMPT = [
    {"role": "system", "content": "You are Anchor, the emotional validator."},
    {"role": "user", "content": "I failed my driving test again."},
]


def candidate(context: str, reply: str, overall: float | None, persona: str = "anchor") -> JudgedCandidate:
    return JudgedCandidate(
        context_id=context,
        prompt=PROMPT + [{"role": "user", "content": f"(context {context})"}],
        persona=persona,
        reply=reply,
        overall=overall,
        judgement={"judge": "fake-judge", "rubric": "persona@1", "reply": reply},
    )


def test_margin_is_in_judge_units_and_inclusive() -> None:
    # 1-5 units: one unit is 25 points, so the paper's 0.5 is 12.5 points
    scores = {"a": 80.0, "b": 70.0, "c": 62.5, "d": 50.0}
    pairs = build_pairs([candidate("c1", r, s) for r, s in scores.items()], test_fraction=0.0)
    kept = {(p["chosen"][0]["content"], p["rejected"][0]["content"]): p["margin"] for p in pairs.train}
    assert kept == {("a", "c"): 0.7, ("a", "d"): 1.2, ("b", "d"): 0.8, ("c", "d"): 0.5}
    assert pairs.report.dropped_by_margin == 2  # a-b (10 points) and b-c (7.5 points)
    assert pairs.report.pairs_kept == 4 and pairs.test == []

    wide = build_pairs([candidate("c1", r, s) for r, s in scores.items()], min_margin=1.0, test_fraction=0.0)
    assert [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in wide.train] == [("a", "d")]
    assert wide.report.dropped_by_margin == 5


def test_pairs_are_trl_conversational_rows_with_provenance() -> None:
    candidates = [candidate("c1", "worse", 20.0), candidate("c1", "better", 90.0)]
    pair = build_pairs(candidates, test_fraction=0.0).train[0]
    assert pair["prompt"] == PROMPT + [{"role": "user", "content": "(context c1)"}]
    assert pair["chosen"] == [{"role": "assistant", "content": "better"}]
    assert pair["rejected"] == [{"role": "assistant", "content": "worse"}]
    assert pair["margin"] == pytest.approx(70 / 25)
    assert (pair["context_id"], pair["persona"]) == ("c1", "anchor")
    assert (pair["chosen_overall"], pair["rejected_overall"]) == (90.0, 20.0)
    assert pair["provenance"]["chosen"]["reply"] == "better"
    assert pair["provenance"]["rejected"]["reply"] == "worse"


def test_failed_judgements_and_identical_replies_are_skipped() -> None:
    candidates = [
        candidate("c1", "good", 90.0),
        candidate("c1", "failed", None),
        candidate("c1", "bad", 10.0),
        candidate("c1", "bad", 30.0),  # same text, different score: nothing to learn between them
    ]
    pairs = build_pairs(candidates, test_fraction=0.0)
    report = pairs.report
    assert (report.contexts, report.candidates, report.failed_judgements) == (1, 4, 1)
    assert report.dropped_identical == 1 and report.pairs_kept == 2
    assert all("failed" not in (p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs.train)


def test_split_is_by_context_and_deterministic() -> None:
    candidates = [candidate(f"ctx-{i}", reply, score) for i in range(200) for reply, score in
                  (("high", 90.0), ("mid", 60.0), ("low", 20.0))]
    first = build_pairs(candidates, test_fraction=0.25, seed=7)
    again = build_pairs(reversed(candidates), test_fraction=0.25, seed=7)
    other = build_pairs(candidates, test_fraction=0.25, seed=8)

    def contexts(rows: list[dict]) -> set[str]:
        return {row["context_id"] for row in rows}

    train, test = contexts(first.train), contexts(first.test)
    assert train and test and not train & test
    assert len(train | test) == 200
    assert 30 <= len(test) <= 70  # ~50 expected
    assert (first.report.train_contexts, first.report.test_contexts) == (len(train), len(test))
    assert len(first.test) == 3 * len(test)  # every pair of a context goes with it
    assert (contexts(again.train), contexts(again.test)) == (train, test)  # order does not matter
    assert contexts(other.test) != test


def test_no_pairs_error_counts_what_the_margin_dropped() -> None:
    candidates = [candidate("c1", "x", 50.0), candidate("c1", "y", 55.0), candidate("c1", "z", 60.0),
                  candidate("c2", "w", None)]
    with pytest.raises(PairsError) as caught:
        build_pairs(candidates)
    message = str(caught.value)
    assert "3 candidate pairs differ by less than min_margin=0.5" in message
    assert "12.5 points" in message and "1 failed judgements" in message
    assert "\n" not in message


def test_inconsistent_contexts_and_bad_arguments_fail() -> None:
    other_persona = candidate("c1", "b", 10.0, persona="catalyst")
    with pytest.raises(PairsError, match="context 'c1': candidates of different personas"):
        build_pairs([candidate("c1", "a", 90.0), other_persona])
    other_prompt = candidate("c1", "b", 10.0).model_copy(update={"prompt": PROMPT[:1]})
    with pytest.raises(PairsError, match="different prompts"):
        build_pairs([candidate("c1", "a", 90.0), other_prompt])
    with pytest.raises(ValueError, match="min_margin=0"):
        build_pairs([], min_margin=0)
    with pytest.raises(ValueError, match="test_fraction=1"):
        build_pairs([], test_fraction=1.0)
    with pytest.raises(ValueError):
        candidate("c1", "a", 120.0)  # overall is 0-100


def test_write_and_read_round_trip(tmp_path: Path) -> None:
    candidates = [candidate(f"ctx-{i}", reply, score) for i in range(40) for reply, score in
                  (("high", 90.0), ("low", 20.0))]
    pairs = build_pairs(candidates, test_fraction=0.3)
    train_path, test_path = write_pairs(pairs, tmp_path / "pairs")
    assert (train_path.name, test_path.name) == ("train.jsonl", "test.jsonl")
    assert read_pairs(train_path) == pairs.train
    assert read_pairs(test_path) == pairs.test
    assert sorted(p.name for p in (tmp_path / "pairs").iterdir()) == ["test.jsonl", "train.jsonl"]  # no temp files

    with pytest.raises(PairsError, match="cannot write pairs to .*missing"):
        write_pairs(pairs, tmp_path / "missing" / "pairs")

    fewer = build_pairs(candidates[:10], test_fraction=0.0)
    write_pairs(fewer, tmp_path / "pairs")  # replaces both files
    assert read_pairs(train_path) == fewer.train and read_pairs(test_path) == []


def test_read_pairs_names_the_bad_line(tmp_path: Path) -> None:
    path = tmp_path / "train.jsonl"
    good = build_pairs([candidate("c1", "a", 90.0), candidate("c1", "b", 10.0)], test_fraction=0.0).train[0]
    bad = {**good, "chosen": "not messages"}
    path.write_text(json.dumps(good) + "\n" + json.dumps(bad) + "\n")
    with pytest.raises(PairsError, match=r"train.jsonl:2: not a preference pair \(field 'chosen'"):
        read_pairs(path)
    with pytest.raises(PairsError, match="no pairs file"):
        read_pairs(tmp_path / "missing.jsonl")


def test_a_relative_judges_order_makes_pairs_without_a_margin() -> None:
    # pairwise scores sit near 50 (100 x the chance of winning, both orders averaged): an order,
    # which the sanity gate scored as right whenever the better side was higher
    def relative(context: str, reply: str, overall: float, mode: str | None = "pairwise") -> JudgedCandidate:
        c = candidate(context, reply, overall)
        return c.model_copy(update={"judgement": {**c.judgement, **({"mode": mode} if mode else {})}})

    pairs = build_pairs([relative("c1", "a", 51.5), relative("c1", "b", 48.5), relative("c2", "c", 50.0),
                         relative("c2", "d", 50.0), relative("c3", "e", 53.0, None), relative("c3", "f", 47.0, None)],
                        test_fraction=0.0)
    kept = [(p["chosen"][0]["content"], p["rejected"][0]["content"]) for p in pairs.train]
    assert kept == [("a", "b")]  # the tie and the absolute 6-point gap (under 12.5) make none
    assert pairs.report.dropped_by_margin == 2
