"""Judge sanity sets: the shipped sets load as the judge sees training targets, accuracy counts
ties and failures as wrong, and `mascot judge --sanity` reports what its scores say."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from fakes import PromptChat

from mascot.cli import main
from mascot.graphs.direction import StageDirection
from mascot.graphs.prompts import speaker_messages
from mascot.messages import langchain_message, openai_messages
from mascot.rosters import Roster, load_roster
from mascot.testing.stub_server import start_stub_server
from mascot.training.judging.judge import Judge
from mascot.training.judging.judge_sanity import (
    SANITY_THRESHOLD,
    SanityReport,
    read_sanity_report,
    run_sanity,
    sanity_metric_weight,
)
from mascot.training.judging.rubric import load_rubric
from mascot.training.judging.sanity_set import KINDS, SanityError, SanitySet, list_sanity_sets, load_sanity_set
from mascot.training.judging.targets import BlockTarget, ReplyTarget

ROSTERS = ["emotional_support", "workplace_meeting"]
SHIPPED = Path(__file__).parent.parent / "mascot" / "training" / "judging" / "sanity"


@pytest.mark.parametrize("roster_id", ROSTERS)
@pytest.mark.parametrize(("target", "least"), [("reply", 12), ("block", 6)])
def test_shipped_sets_load_with_every_contrast(roster_id: str, target: str, least: int) -> None:
    roster = load_roster(roster_id)
    sanity = load_sanity_set(roster, target)  # type: ignore[arg-type]
    assert sanity.roster == roster_id and len(sanity.pairs) >= least
    assert {p.kind for p in sanity.pairs} == set(KINDS[target])
    assert len({p.id for p in sanity.pairs}) == len(sanity.pairs)
    kind = ReplyTarget if target == "reply" else BlockTarget
    for pair in sanity.pairs:
        assert isinstance(pair.better, kind) and isinstance(pair.worse, kind)
        assert pair.better.body() != pair.worse.body(), pair.id
        assert pair.better.shared() == pair.worse.shared(), pair.id  # the same context
        assert pair.better_candidate.prompt == pair.worse_candidate.prompt
        assert pair.better_candidate.reply != pair.worse_candidate.reply


def test_shipped_sets_are_the_shipped_rosters() -> None:
    assert list_sanity_sets() == ROSTERS


def test_reply_sides_are_what_training_judges(roster: Roster) -> None:
    pair = next(p for p in load_sanity_set(roster, "reply").pairs if p.id == "catalyst-new-team/echoed_cue")
    better = pair.better
    assert isinstance(better, ReplyTarget) and better.persona.id == "catalyst"
    assert [t.speaker for t in better.context] == ["user", "anchor"]
    assert better.direction and better.direction["speaker"] == "catalyst"
    # the candidate's prompt is the speaker's prompt of the graph
    context = [{"role": "user", "content": better.context[0].text},
               {"role": "assistant", "name": "anchor", "content": better.context[1].text}]
    direction = StageDirection.model_validate(better.direction)
    history = [langchain_message(m["role"], m["content"], m.get("name")) for m in context]
    expected = openai_messages(speaker_messages(roster, roster.persona("catalyst"), direction, history))
    assert [m.model_dump() for m in pair.better_candidate.prompt] == expected


def test_block_sides_read_as_sibling_blocks(roster: Roster) -> None:
    pair = next(p for p in load_sanity_set(roster, "block").pairs if p.kind == "one_voice")
    assert isinstance(pair.worse, BlockTarget) and {t.speaker for t in pair.worse.block} == {"anchor"}
    assert pair.better_candidate.persona == "group"
    # the paragraphs of targets.render_block: persona id, colon, text
    assert re.fullmatch(r"anchor: .+\n\ncatalyst: .+\n\naction_guide: .+", pair.better_candidate.reply, re.DOTALL)


def _user_roster(tmp_path: Path, roster_id: str) -> Path:
    data = yaml.safe_load((Path(__file__).parent.parent / "mascot" / "rosters" / "data" / "emotional_support" /
                           "roster.yaml").read_text())
    data["id"] = roster_id
    path = tmp_path / "roster.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_a_roster_without_a_set_is_one_error_and_a_file_fills_in(tmp_path: Path) -> None:
    roster = load_roster(_user_roster(tmp_path, "my_support"))
    with pytest.raises(SanityError, match="no shipped sanity set for roster 'my_support'.*emotional_support"):
        load_sanity_set(roster, "reply")
    data = yaml.safe_load((SHIPPED / "emotional_support.yaml").read_text())
    data["roster"] = "my_support"
    own = tmp_path / "sanity.yaml"
    own.write_text(yaml.safe_dump(data))
    shipped = load_sanity_set(load_roster("emotional_support"), "reply")
    assert sorted(p.id for p in load_sanity_set(roster, "reply", path=own).pairs) == sorted(p.id for p in shipped.pairs)


@pytest.mark.parametrize(("change", "message"), [
    (lambda d: d["replies"][0].update(persona="nobody"), "reply 'anchor-driving-test': unknown persona 'nobody'"),
    (lambda d: d["replies"][0]["worse"].update(rude="No."), "unknown contrast 'rude'; valid: echoed_cue"),
    (lambda d: d["blocks"][0]["better"].append({"narrator": "x"}), "unknown speaker 'narrator'"),
    (lambda d: d.update(roster="workplace_meeting"), "of roster 'workplace_meeting', not 'emotional_support'"),
    (lambda d: d["replies"][0].pop("better"), "field 'replies.0.better': Field required"),
])
def test_a_bad_sanity_file_is_one_line(roster: Roster, tmp_path: Path, change, message: str) -> None:
    data = yaml.safe_load((SHIPPED / "emotional_support.yaml").read_text())
    change(data)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SanityError) as caught:
        for target in ("reply", "block"):
            load_sanity_set(roster, target, path=path)  # type: ignore[arg-type]
    assert message in str(caught.value) and "\n" not in str(caught.value)


def _body(prompt: str) -> str:
    """The judged reply or block of a judge prompt."""
    return re.search(r"## The (?:reply|block) to judge\n(.*?)\n\nAnswer with only", prompt, re.DOTALL).group(1)


def _judge(roster: Roster, rubric: str, level: callable) -> Judge:
    ids = load_rubric(rubric).criterion_ids

    def reply(prompt: str) -> str:
        return json.dumps({"rationale": "fake", "scores": dict.fromkeys(ids, level(_body(prompt)))})

    return Judge(rubric, PromptChat(reply=reply), model_name="fake-judge")


def _recomputed(report: SanityReport) -> float:
    right = [p.better.overall is not None and p.worse.overall is not None and p.better.overall > p.worse.overall
             for p in report.pairs]
    return sum(right) / len(right)


def test_a_judge_that_scores_alike_gets_nothing_right(roster: Roster) -> None:
    sanity = load_sanity_set(roster, "reply")
    report = run_sanity(_judge(roster, "persona", lambda body: 3), sanity, concurrency=4)
    assert report.accuracy == 0.0 and not report.passed  # ties count as wrong
    # each item's better reply is judged once, not once per contrast
    assert report.judgements == len(sanity.targets()) == len({p.better.model_dump_json() for p in sanity.pairs}) + len(
        sanity.pairs) and report.failed_judgements == 0
    assert sanity_metric_weight(report) == 1.0  # not trusted: the metric judge labels alone


def test_a_judge_that_likes_length_is_scored_pair_by_pair(roster: Roster) -> None:
    sanity = load_sanity_set(roster, "reply")
    report = run_sanity(_judge(roster, "persona", lambda body: min(5, 1 + len(body.split()) // 10)), sanity)
    assert report.by_kind["one_word"].right == report.by_kind["one_word"].total >= 5
    assert report.accuracy == pytest.approx(_recomputed(report), abs=1e-4)
    assert sum(t.right for t in report.by_kind.values()) == report.right
    assert report.passed == (report.accuracy >= SANITY_THRESHOLD and report.p_value < 0.01)


def test_failed_judgements_count_as_wrong(roster: Roster) -> None:
    sanity = load_sanity_set(roster, "block")
    judge = Judge("group", PromptChat(reply=lambda prompt: "no idea"), model_name="mute", max_attempts=1)
    report = run_sanity(judge, sanity)
    assert report.failed_judgements == report.judgements == len(sanity.targets()) and report.accuracy == 0.0
    assert all(p.better.error and p.better.overall is None for p in report.pairs)


def test_rubric_and_set_must_judge_the_same_kind(roster: Roster) -> None:
    with pytest.raises(ValueError, match="rubric 'group' judges a block; this sanity set holds reply pairs"):
        run_sanity(_judge(roster, "group", lambda body: 3), load_sanity_set(roster, "reply"))


@pytest.mark.parametrize("rubric", ["persona", "group"])
def test_cli_reports_the_accuracy_its_scores_give(rubric: str, tmp_path: Path,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    report_file = tmp_path / "sanity.json"
    with start_stub_server() as server:
        code = main(["judge", "--sanity", "--rubric", rubric, "--roster", "workplace_meeting", "--base-url",
                     server.url, "--model", "stub-judge", "--out", str(report_file)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = read_sanity_report(report_file)
    assert report.judge == "stub-judge" and report.rubric == rubric and report.rubric_version == 1
    shipped = load_sanity_set(load_roster("workplace_meeting"), "reply" if rubric == "persona" else "block")
    assert report.total == len(shipped.pairs) >= 30 and report.failed_judgements == 0
    assert report.accuracy == pytest.approx(_recomputed(report), abs=1e-4)
    assert f"judge sanity: {rubric} rubric, {report.right}/{report.total} pairs right" in captured.out
    assert report.metric_judge is not None and report.metric_judge.total == report.total
    assert f"metric judge ({report.metric_judge.judge}): " in captured.out


@pytest.mark.parametrize(("argv", "message"), [
    (["judge", "--rubric", "persona", "--roster", "emotional_support"], "--in and --out are required"),
    (["judge", "--sanity", "--in", "x.jsonl", "--rubric", "persona", "--roster", "emotional_support"],
     "leave out --in"),
    (["judge", "--sanity-set", "x.yaml", "--in", "x.jsonl", "--out", "y.jsonl", "--rubric", "persona",
      "--roster", "emotional_support"], "--sanity-set needs --sanity"),
])
def test_cli_usage_errors(argv: list[str], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1


def test_cli_names_the_missing_set(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["judge", "--sanity", "--rubric", "persona", "--roster", str(_user_roster(tmp_path, "mine")),
                 "--model", "unused"])
    err = capsys.readouterr().err
    assert code == 2 and "no shipped sanity set for roster 'mine'" in err and len(err.strip().splitlines()) == 1


def test_a_report_that_is_not_one_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"accuracy": 0.9}))
    with pytest.raises(SanityError, match="not a judge sanity report"):
        read_sanity_report(path)


@pytest.mark.real_model
def test_two_sanity_pairs_on_the_real_model(offline_model: Path, roster: Roster) -> None:
    from mascot.policies import Policies, PolicySpec

    policies = Policies.single(PolicySpec(model=str(offline_model), temperature=0.0), roster, seed=0)
    judge = Judge("persona", policies.chat_model("judge"), model_name="offline", structured_output=True)
    full = load_sanity_set(roster, "reply")
    report = run_sanity(judge, SanitySet(full.roster, full.target, full.source, full.pairs[:2]), concurrency=1)
    assert report.total == 2 and report.judgements == 3  # the shared better reply is judged once
    assert report.failed_judgements == 0, [p.better.error or p.worse.error for p in report.pairs]
    for pair in report.pairs:
        for side in (pair.better, pair.worse):
            assert set(side.scores) == set(judge.rubric.criterion_ids) and 0 <= side.overall <= 100
    assert SanityReport.model_validate_json(report.model_dump_json()) == report


def test_a_judge_is_trusted_only_beyond_chance() -> None:
    """8 of 12 (the old sets' size) cannot tell a judge from a coin; the rule needs 75 % and p < 0.01."""
    from mascot.training.judging.judge_sanity import binomial_p, trusted

    assert binomial_p(8, 12) == pytest.approx(0.1938, abs=1e-4) and not trusted(8, 12)
    assert binomial_p(12, 12) == pytest.approx(1 / 4096) and trusted(12, 12)
    assert binomial_p(0, 5) == 1.0 and binomial_p(5, 5) == pytest.approx(1 / 32)
    assert binomial_p(24, 32) == pytest.approx(0.0035, abs=1e-4) and trusted(24, 32)  # 75 % of 32
    assert not trusted(23, 32)  # 72 %: under the accuracy bar
    assert not trusted(9, 10)  # 90 % of 10: p = 0.011, a coin could


def test_several_modes_on_a_server_each_get_a_client_of_their_own_loop(tmp_path: Path,
                                                                         capsys: pytest.CaptureFixture[str]) -> None:
    # each mode runs in its own event loop: a client kept from the first one failed the
    # second with "Event loop is closed"
    report_file = tmp_path / "sanity.json"
    with start_stub_server() as server:
        code = main(["judge", "--sanity", "--rubric", "persona", "--roster", "workplace_meeting", "--base-url",
                     server.url, "--model", "stub-judge", "--modes", "absolute,ranking", "--out", str(report_file)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = read_sanity_report(report_file)
    assert set(report.modes) == {"absolute", "ranking"} and report.modes["absolute"].total == report.total
