"""Metric judges: automatic 0-100 scores rank the sanity sets' better sides above the worse,
mix with the LLM judge's by the documented weight, and change which pairs `mascot pairs` keeps."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mascot.cli import main
from mascot.graphs.embeddings import LexicalEmbedder
from mascot.rosters import Roster, load_roster
from mascot.training.judging import metric_judge
from mascot.training.judging.judge_sanity import metric_sanity
from mascot.training.judging.judgement import JudgedCandidate
from mascot.training.judging.metric_judge import (
    combine_overall,
    metric_overall,
    metric_overalls,
    with_metric_overall,
)
from mascot.training.judging.sanity_set import load_sanity_set
from mascot.training.measures import cosine, describe_persona

LEXICAL = LexicalEmbedder()


# measured with the lexical embedder: replies 44/46 and blocks 28/30 (emotional_support), 36/39
# and 25/30 (workplace_meeting); the misses are off-topic contrasts (a lexical embedding sees
# little of relevance)
@pytest.mark.parametrize("roster_id", ["emotional_support", "workplace_meeting"])
@pytest.mark.parametrize(("target", "least"), [("reply", 0.9), ("block", 0.8)])
def test_metric_judge_prefers_the_better_sides_of_the_sanity_set(roster_id: str, target: str, least: float) -> None:
    roster = load_roster(roster_id)
    report = metric_sanity(load_sanity_set(roster, target), roster, embedder=LEXICAL)  # type: ignore[arg-type]
    assert report.accuracy >= least, report.summary()
    assert report.judge == "metric:lexical" and report.failed_judgements == 0


def _pair(roster: Roster, pair_id: str, target: str = "reply") -> tuple[JudgedCandidate, JudgedCandidate]:
    pair = next(p for p in load_sanity_set(roster, target).pairs if p.id == pair_id)  # type: ignore[arg-type]
    return pair.better_candidate, pair.worse_candidate


def test_an_echoed_or_empty_reply_scores_zero(roster: Roster) -> None:
    good, echo = _pair(roster, "anchor-driving-test/echoed_cue")
    assert metric_overall(echo, roster, LEXICAL) == 0.0 < metric_overall(good, roster, LEXICAL)
    third_person = good.model_copy(update={"reply": "The Anchor warmly names the shame of failing a third time."})
    empty = good.model_copy(update={"reply": "  "})
    assert metric_overalls([third_person, empty], roster, embedder=LEXICAL) == [0.0, 0.0]


def test_assistant_boilerplate_loses_persona_fit(roster: Roster) -> None:
    good, _ = _pair(roster, "anchor-driving-test/off_persona")
    boilerplate = good.model_copy(update={"reply": "As an AI language model, I would say: " + good.reply})
    assert metric_overall(boilerplate, roster, LEXICAL) < metric_overall(good, roster, LEXICAL)


def test_a_prompt_that_is_not_a_speaker_prompt_is_refused(roster: Roster) -> None:
    record = JudgedCandidate(context_id="c1", prompt=[{"role": "user", "content": "hi"}], persona="anchor",
                             reply="Hello there, it is good to hear from you today.")
    with pytest.raises(ValueError, match="context c1: the prompt is not a speaker prompt"):
        metric_overall(record, roster, LEXICAL)


def test_one_voice_scores_below_the_same_turns_by_three_voices(roster: Roster) -> None:
    varied, _ = _pair(roster, "grief-garage/one_voice", "block")
    paragraphs = varied.reply.split("\n\n")
    one_voice = varied.model_copy(update={"reply": "\n\n".join("anchor: " + p.split(": ", 1)[1] for p in paragraphs)})
    assert metric_overall(one_voice, roster, LEXICAL) < metric_overall(varied, roster, LEXICAL)
    # a turn may hold paragraphs of its own ("Decided: ..." is no speaker)
    notes = varied.model_copy(update={"reply": varied.reply + "\n\nDecided: nothing yet.\n\nOpen: the garage."})
    assert metric_overall(notes, roster, LEXICAL) > 0


@pytest.mark.parametrize(("weight", "expected"), [(0.0, 80.0), (1.0, 40.0), (0.25, 70.0), (0.5, 60.0)])
def test_combine_overall_weights_the_metric(weight: float, expected: float) -> None:
    assert combine_overall(80.0, 40.0, weight) == pytest.approx(expected)


def test_combine_overall_refuses_a_weight_outside_0_1() -> None:
    with pytest.raises(ValueError, match="metric_weight=1.5: must be in \\[0, 1\\]"):
        combine_overall(80.0, 40.0, 1.5)


def test_mixed_candidates_keep_their_provenance(roster: Roster) -> None:
    good, echo = _pair(roster, "anchor-driving-test/echoed_cue")
    judged = [good.model_copy(update={"overall": 60.0, "judgement": {"judge_model": "m"}}),
              echo.model_copy(update={"overall": 75.0}), good.model_copy(update={"reply": "x", "overall": None})]
    mixed = with_metric_overall(judged, roster, 0.5, embedder=LEXICAL)
    assert mixed[1].overall == 37.5 and mixed[1].judgement == {"judge_overall": 75.0, "metric_overall": 0.0,
                                                               "metric_weight": 0.5}
    assert mixed[0].judgement["judge_model"] == "m" and mixed[0].overall == pytest.approx(
        0.5 * 60 + 0.5 * mixed[0].judgement["metric_overall"], abs=1e-3)
    assert mixed[2].overall is None and mixed[2].judgement == {}


def _judged_file(roster: Roster, path: Path) -> Path:
    """One context: the judge prefers the echoed cue (75) to the real answer (60)."""
    good, echo = _pair(roster, "anchor-driving-test/echoed_cue")
    provenance = {"rubric": "persona", "judge_model": "weak-judge"}
    rows = [c.model_copy(update={"overall": o, "judgement": provenance}).model_dump(mode="json")
            for c, o in ((good, 60.0), (echo, 75.0))]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _chosen(folder: Path) -> list[str]:
    return [json.loads(line)["chosen"][0]["content"][:20] for line in (folder / "train.jsonl").read_text().splitlines()]


def _report(path: Path, right: int, total: int = 10, judge: str = "weak-judge") -> Path:
    """A sanity report as written before p-values were recorded: the rule is applied to its pairs."""
    path.write_text(json.dumps({
        "judge": judge, "rubric": "persona", "rubric_version": 1, "roster": "emotional_support", "target": "reply",
        "sanity_set": "shipped", "right": right, "total": total, "accuracy": right / total, "threshold": 0.7,
        "passed": right / total >= 0.7, "by_kind": {}, "judgements": 0, "failed_judgements": 0, "seconds": 1.0,
        "pairs": []}))
    return path


def test_pairs_metric_weight_changes_the_chosen_reply(roster: Roster, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(metric_judge, "default_embedder", lambda: LEXICAL)
    judged = _judged_file(roster, tmp_path / "judged.jsonl")
    common = ["pairs", "--in", str(judged), "--test-fraction", "0"]
    assert main([*common, "--out", str(tmp_path / "judge-only")]) == 0
    assert "labels: judge only" in capsys.readouterr().out
    assert _chosen(tmp_path / "judge-only") == ["Acknowledge the sham"]  # the echo wins on the judge alone
    assert main([*common, "--metric-weight", "0.5", "--roster", "emotional_support",
                 "--out", str(tmp_path / "mixed")]) == 0
    assert "labels: 0.5 x judge + 0.5 x metric judge (--metric-weight)" in capsys.readouterr().out
    assert _chosen(tmp_path / "mixed") == ["Three times, after a"]
    pair = json.loads((tmp_path / "mixed" / "train.jsonl").read_text().splitlines()[0])
    assert pair["provenance"]["rejected"]["judge_overall"] == 75.0 and pair["rejected_overall"] == 37.5


@pytest.mark.parametrize(("right", "total", "chosen", "why"), [
    (4, 10, "Three times, after a", "judge sanity 4/10 (40%, p = 0.83)"),
    # 80 % of 10 is no evidence (p = 0.055): the metric judge labels alone
    (8, 10, "Three times, after a", "judge sanity 8/10 (80%, p = 0.055)"),
    (27, 32, "Acknowledge the sham", "judge sanity 27/32 (84%, p = 5.7e-05)"),
])
def test_pairs_takes_the_weight_from_a_sanity_report(roster: Roster, tmp_path: Path, right: int, total: int,
                                                     chosen: str, why: str, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(metric_judge, "default_embedder", lambda: LEXICAL)
    judged = _judged_file(roster, tmp_path / "judged.jsonl")
    report = _report(tmp_path / "sanity.json", right, total)
    assert main(["pairs", "--in", str(judged), "--sanity", str(report), "--roster", "emotional_support",
                 "--test-fraction", "0", "--out", str(tmp_path / "pairs")]) == 0
    printed = capsys.readouterr().out
    assert why in printed and _chosen(tmp_path / "pairs") == [chosen], printed
    assert ("not trusted" in printed) == (chosen != "Acknowledge the sham")


@pytest.mark.parametrize(("extra", "message"), [
    (["--metric-weight", "0.5"], "--roster is needed to mix in the metric judge (metric weight 0.5, --metric-weight)"),
    (["--sanity", "REPORT"], "--roster is needed to mix in the metric judge"),
    (["--sanity", "OTHER", "--roster", "emotional_support"], "the report is of judge strong-judge"),
])
def test_pairs_usage_errors(roster: Roster, tmp_path: Path, extra: list[str], message: str,
                            capsys: pytest.CaptureFixture[str]) -> None:
    judged = _judged_file(roster, tmp_path / "judged.jsonl")
    paths = {"REPORT": str(_report(tmp_path / "r.json", 3)),
             "OTHER": str(_report(tmp_path / "o.json", 3, judge="strong-judge"))}
    code = main(["pairs", "--in", str(judged), *[paths.get(a, a) for a in extra], "--out", str(tmp_path / "p")])
    err = capsys.readouterr().err
    assert code == 2 and message in err, err


def test_pairs_metric_weight_is_a_share(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        main(["pairs", "--in", "x.jsonl", "--metric-weight", "1.5", "--out", str(tmp_path / "p")])
    assert "must be in [0, 1], got 1.5" in capsys.readouterr().err


def test_a_refusal_a_copy_or_assistant_talk_scores_zero(roster: Roster) -> None:
    """The metric judge gave a one-line refusal full substance; now every reply fault is 0."""
    good, _ = _pair(roster, "anchor-driving-test/echoed_cue")
    faults = [good.model_copy(update={"reply": text}) for text in (
        "I'm sorry, but I can't assist with that.", "As an AI language model, I understand how you feel.",
        "User: I failed again and I hate it.")]
    assert metric_overalls(faults, roster, embedder=LEXICAL) == [0.0, 0.0, 0.0]
    assert metric_overall(good, roster, LEXICAL) > 0


def test_speaking_first_earns_no_novelty(roster: Roster) -> None:
    """Novelty applies only where another voice answered: the first voice is scored on the
    other four terms, so an answer gets the same score whether novelty could reward it or not."""
    good, _ = _pair(roster, "anchor-driving-test/echoed_cue")
    system = next(m.content for m in good.prompt if m.role == "system")
    assert "The other voices have already answered it" not in system
    scores = metric_judge._Reply(good, roster)
    assert not scores.others
    vectors = dict(zip(scores.texts, LEXICAL.encode(scores.texts), strict=True))
    described = dict(zip(roster.persona_ids, LEXICAL.encode([describe_persona(p) for p in roster.personas]),
                         strict=True))
    terms = {"format": (scores.format + 1) / 2, "substance": metric_judge._substance(good.reply),
             "persona_fit": metric_judge._persona_fit(good.reply, vectors[good.reply], "anchor", described),
             "relevance": max(0.0, cosine(vectors[good.reply], vectors[scores.person]))}
    assert metric_overall(good, roster, LEXICAL) == pytest.approx(25.0 * sum(terms.values()))
