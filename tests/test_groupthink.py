"""Groupthink measures: the judge's strict parsing, the rule scorer, the gate, the aggregation,
and the confederate round on the real compiled graph (scripted models, no real model)."""

from __future__ import annotations

import asyncio
import json

import pytest
from fakes import PromptChat, ScriptedChat, speaker_fake
from langchain_core.messages import HumanMessage

from mascot.rosters import load_roster
from mascot.rosters.probes import GroupthinkProbe, load_labelled_replies, load_probes
from mascot.training.evaluation.groupthink import (
    JUDGE_ATTEMPTS,
    JudgeScorer,
    ReplyCase,
    RuleScorer,
    Verdict,
    check_scorer,
    choose_scorer,
    parse_verdict,
)
from mascot.training.evaluation.groupthink_rates import ProbeRound, groupthink_scores, paired_difference, score_rounds
from mascot.training.evaluation.probe_rounds import aplay_probe, build_system
from mascot.training.judging.judge_sanity import binomial_p

ROSTER = load_roster("emotional_support")
PROBES = load_probes(ROSTER)
LABELLED = load_labelled_replies(ROSTER)
PROBE = PROBES[0]


def case(text: str = "I hear you.", after: bool = False) -> ReplyCase:
    return ReplyCase(PROBE, text, after)


# --- the judge ----------------------------------------------------------------------------

def test_judge_reads_a_verdict_and_sees_probe_concerns_and_confederate() -> None:
    model = ScriptedChat(replies=['{"endorses_only": false, "concern": 2}'])
    verdict, = JudgeScorer(model).score([case("Could you look for work quietly first?", after=True)])
    assert (verdict.status, verdict.endorses_only, verdict.concern) == ("ok", False, 2)
    assert verdict.measure("raises_concern") is True and verdict.measure("conforms") is False
    prompt = "\n".join(m.text for m in model.calls[0])
    assert PROBE.message in prompt and PROBE.confederate in prompt and all(c in prompt for c in PROBE.concerns)
    assert "Could you look for work quietly first?" in prompt


def test_judge_prompt_leaves_out_the_confederate_in_a_plain_round() -> None:
    model = ScriptedChat(replies=['{"endorses_only": true, "concern": null}'])
    verdict, = JudgeScorer(model).score([case()])
    assert PROBE.confederate not in "\n".join(m.text for m in model.calls[0])
    assert verdict.measure("conforms") is None and verdict.measure("endorses_only") is True


def test_bad_judge_answer_is_asked_again_with_the_reason() -> None:
    model = ScriptedChat(replies=["sure, it only endorses", '{"endorses_only": true, "concern": null}'])
    verdict, = JudgeScorer(model).score([case()])
    assert verdict.status == "ok" and verdict.endorses_only is True
    assert len(model.calls) == 2 and "could not be used" in model.calls[1][-1].text


def test_judge_that_fails_twice_is_recorded_as_failed_never_invented() -> None:
    model = ScriptedChat(replies=["{not json", '{"endorses_only": "yes", "concern": null}', '{"endorses_only": true,'
                                  ' "concern": null}'])
    verdict, = JudgeScorer(model).score([case()])
    assert JUDGE_ATTEMPTS == 2 and len(model.calls) == 2 and len(model.replies) == 1
    assert verdict.status == "failed" and verdict.endorses_only is None and verdict.concern is None
    assert "endorses_only must be true or false" in (verdict.error or "")
    assert all(verdict.measure(m) is None for m in ("endorses_only", "raises_concern", "conforms"))


@pytest.mark.parametrize("answer, reason", [
    ('{"endorses_only": true, "concern": 1}', "raises none"),
    ('{"endorses_only": false, "concern": 9}', "integer 0-3"),
    ('{"endorses_only": false, "concern": true}', "integer 0-3"),
    ('{"endorses_only": false, "concern": null, "why": "x"}', "exactly the keys"),
    ('{"endorses_only": false}', "exactly the keys"),
])
def test_strict_parsing_refuses(answer: str, reason: str) -> None:
    with pytest.raises(ValueError, match=reason):
        parse_verdict(answer, case())


# --- the rule scorer ----------------------------------------------------------------------

def test_rule_scorer_names_the_concern_a_reply_states_and_endorsement_without_cues() -> None:
    scorer = RuleScorer(similarity=0.6, cues=1)
    concern, endorse = scorer.score([case(PROBE.concerns[1]), case("Good for you. You deserve this so much.")])
    assert concern.concern == 1 and concern.endorses_only is False
    assert endorse.concern is None and endorse.endorses_only is True


def test_rule_scorer_thresholds_come_from_dev_replies_only() -> None:
    dev_probes = {p.id for p in PROBES if p.split == "dev"}
    fitted = RuleScorer.fit(LABELLED, PROBES)
    changed = [r if r.probe in dev_probes else r.model_copy(update={"endorses_only": not r.endorses_only,
                                                                    "concern": None}) for r in LABELLED]
    refitted = RuleScorer.fit(changed, PROBES)
    assert (fitted.similarity, fitted.cues) == (refitted.similarity, refitted.cues)
    with pytest.raises(ValueError, match="no labelled reply answers a dev probe"):
        RuleScorer.fit([r for r in LABELLED if r.probe not in dev_probes], PROBES)


def test_rule_scorer_on_labelled_replies_beats_a_constant() -> None:
    report = check_scorer(RuleScorer.fit(LABELLED, PROBES), LABELLED, PROBES, split="dev")
    majority = max(sum(r.endorses_only for r in LABELLED if _split(r) == "dev"),
                   sum(not r.endorses_only for r in LABELLED if _split(r) == "dev"))
    assert report.measures["endorses_only"].right > majority


def _split(reply) -> str:
    return next(p.split for p in PROBES if p.id == reply.probe)


# --- the gate -----------------------------------------------------------------------------

class Oracle:
    name = "oracle"

    def __init__(self, flip: bool = False) -> None:
        self.labels = {r.text: r for r in LABELLED}
        self.flip = flip

    def score(self, cases: list[ReplyCase]) -> list[Verdict]:
        out = []
        for c in cases:
            label = self.labels[c.text]
            out.append(Verdict(endorses_only=label.endorses_only, concern=label.concern,
                               after_confederate=c.after_confederate))
        return out


class Constant:
    name = "constant"

    def score(self, cases: list[ReplyCase]) -> list[Verdict]:
        return [Verdict(endorses_only=False, concern=0, after_confederate=c.after_confederate) for c in cases]


def test_a_scorer_that_is_always_right_passes_the_gate() -> None:
    report = check_scorer(Oracle(), LABELLED, PROBES)
    assert report.trusted and report.split == "test" and report.failed == 0
    held_out = [r for r in LABELLED if _split(r) == "test"]
    assert report.replies == len(held_out)
    check = report.measures["conforms"]
    assert check.total == sum(r.after_confederate for r in held_out) and check.accuracy == 1.0
    assert check.p_value == binomial_p(check.total, check.total)
    assert choose_scorer(report, report)[0] == "judge"


def test_a_constant_scorer_fails_the_gate_and_the_rules_are_chosen() -> None:
    report = check_scorer(Constant(), LABELLED, PROBES)
    assert not report.trusted and "not trusted" in report.verdict()
    assert report.measures["endorses_only"].accuracy < 0.75
    chosen, reason = choose_scorer(report, check_scorer(Oracle(), LABELLED, PROBES))
    assert chosen == "rules" and "constant" in reason and "not trusted" in reason


# --- the aggregation ----------------------------------------------------------------------

class ByWord:
    """Endorses only when the reply says 'agree'; raises concern 0 otherwise."""

    name = "by-word"

    def score(self, cases: list[ReplyCase]) -> list[Verdict]:
        return [Verdict(endorses_only="agree" in c.text, concern=None if "agree" in c.text else 0,
                        after_confederate=c.after_confederate) for c in cases]


def _round(system: str, probe: GroupthinkProbe, variant: str, texts: list[str]) -> ProbeRound:
    turns = [{"voice": "anchor", "text": probe.confederate, "position": 1, "scripted": True}] \
        if variant == "confederate" else []
    turns += [{"voice": f"v{i}", "text": t, "position": len(turns) + i + 1, "scripted": False}
              for i, t in enumerate(texts)]
    return ProbeRound(system=system, roster=ROSTER.id, probe=probe.id, variant=variant, turns=turns)  # type: ignore[arg-type]


def test_aggregation_finds_a_known_difference() -> None:
    probes = PROBES[:4]
    rounds = []
    for p in probes:
        rounds += [_round("yes", p, "confederate", ["I agree, go for it.", "I agree completely."]),
                   _round("no", p, "confederate", ["Wait, what about rent?", "I agree, but check first."]),
                   _round("no", p, "plain", ["Have you thought about your savings?"])]
    score_rounds(rounds, {p.id: p for p in probes}, ByWord())
    report = groupthink_scores(rounds, probes, scorer="by-word", reason="test")
    yes, no = report["systems"]["yes"]["confederate"], report["systems"]["no"]["confederate"]
    assert yes["rates"]["conforms"]["mean"] == 100 and no["rates"]["conforms"]["mean"] == 50
    assert no["by_position"]["2"]["conforms"]["mean"] == 0 and no["by_position"]["3"]["conforms"]["mean"] == 100
    assert yes["rates"]["conforms"]["probes"] == 4 and yes["guards"]["replies_per_round"] == 2
    assert report["systems"]["no"]["plain"]["rates"]["conforms"] is None
    assert report["systems"]["no"]["plain"]["rates"]["raises_concern"]["mean"] == 100
    difference = paired_difference(rounds, "yes", "no", "conforms", variant="confederate")
    assert difference["estimate"] == 50 and difference["low"] == 50 and difference["probes"] == 4


def test_aggregation_refuses_unscored_rounds() -> None:
    with pytest.raises(ValueError, match="not scored"):
        groupthink_scores([_round("a", PROBE, "plain", ["x y z"])], PROBES, scorer="x", reason="y")


# --- the confederate round on the real graph -------------------------------------------------

def _direction(speaker: str) -> str:
    return json.dumps({"speaker": speaker, "action": "Answer the person in your own way.", "tone": "calm"})


def test_confederate_round_asks_the_director_next_and_the_confederate_does_not_speak_again() -> None:
    first = ROSTER.personas[0].id
    director = ScriptedChat(replies=[_direction(first), _direction("catalyst"), _direction("user")])
    speakers = PromptChat(reply=lambda prompt: "What would change if you waited a day?")
    graph = build_system("director", ROSTER, director=director, speakers=speakers)
    played = asyncio.run(aplay_probe(graph, "director", ROSTER, PROBE, "confederate"))
    assert [t["voice"] for t in played.turns][0] == first and played.turns[0]["scripted"]
    assert first not in [t["voice"] for t in played.replies]
    assert [t["position"] for t in played.replies] == [t["position"] for t in played.turns[1:]] != []
    first_call = "\n".join(m.text for m in director.calls[0])
    assert PROBE.confederate in first_call and "1 of at most 3 voices have spoken" in first_call
    assert f"- {first}:" not in first_call  # not offered again
    assert played.directions[0]["rationale"] == "scripted confederate"


def test_confederate_round_of_round_robin_and_single() -> None:
    speakers = speaker_fake()
    robin = asyncio.run(aplay_probe(build_system("round_robin", ROSTER, director=None, speakers=speakers),
                                    "round_robin", ROSTER, PROBE, "confederate"))
    assert [t["voice"] for t in robin.turns] == ROSTER.persona_ids[:3]
    heard = []
    single_model = PromptChat(reply=lambda prompt: heard.append(prompt) or "Let's slow down and look at rent first.")
    single = asyncio.run(aplay_probe(build_system("single", ROSTER, director=None, speakers=single_model),
                                     "single", ROSTER, PROBE, "confederate"))
    assert [t["voice"] for t in single.turns] == [ROSTER.personas[0].id, "assistant"]
    assert len(heard) == 1 and PROBE.confederate in heard[0]


def test_blind_voices_do_not_see_the_confederate() -> None:
    heard: list[str] = []
    speakers = PromptChat(reply=lambda prompt: heard.append(prompt) or "Maybe sleep on it first?")
    director = ScriptedChat(replies=[_direction("beacon"), _direction("user")])
    graph = build_system("director_blind", ROSTER, director=director, speakers=speakers)
    played = asyncio.run(aplay_probe(graph, "director_blind", ROSTER, PROBE, "confederate"))
    assert [t["voice"] for t in played.replies] == ["beacon"]
    assert heard and PROBE.confederate not in heard[0]


def test_plain_round_plays_the_probe_message() -> None:
    director = ScriptedChat(replies=[_direction("catalyst"), _direction("user")])
    graph = build_system("director", ROSTER, director=director, speakers=speaker_fake())
    played = asyncio.run(aplay_probe(graph, "director", ROSTER, PROBE, "plain"))
    assert [t["voice"] for t in played.turns] == ["catalyst"] and not played.turns[0]["scripted"]
    assert isinstance(graph.get_state({"configurable": {"thread_id": f"director/{ROSTER.id}/{PROBE.id}/plain"}})
                      .values["messages"][0], HumanMessage)


# --- groupthink in `mascot eval` -------------------------------------------------------------

def test_eval_groupthink_plays_every_system_scores_reports_and_resumes(tmp_path) -> None:
    from mascot.training.evaluation.groupthink_eval import evaluate_groupthink
    from mascot.training.evaluation.report import write_report

    def direct(prompt: str) -> str:
        return _direction("catalyst" if "0 of at most 3 voices have spoken" in prompt
                          else "beacon" if "1 of at most 3 voices have spoken" in prompt else "user")

    spoken: list[str] = []
    speakers = PromptChat(reply=lambda prompt: spoken.append(prompt) or "That sounds great, go for it!")
    judge = PromptChat(reply=lambda prompt: '{"endorses_only": true, "concern": null}')  # a constant: not trusted
    graphs = {"trained": build_system("director", ROSTER, director=PromptChat(reply=direct), speakers=speakers),
              "zero_shot": build_system("single", ROSTER, director=None, speakers=speakers)}
    results = evaluate_groupthink(ROSTER, graphs, judge=judge, judge_name="constant", probes=2, out=tmp_path)
    held = [p.id for p in PROBES if p.split == "test"][:2]
    assert results["probes"] == held and results["scorer"] == "rules"
    assert not results["judge_check"]["trusted"] and "not trusted" in results["reason"]
    lines = (tmp_path / "groupthink" / "rounds.jsonl").read_text().splitlines()
    assert sorted((json.loads(x)["system"], json.loads(x)["probe"], json.loads(x)["variant"]) for x in lines) == \
        sorted((s, p, v) for s in graphs for p in held for v in ("plain", "confederate"))
    trained = results["scores"]["systems"]["trained"]
    # every reply only endorses: the rule scorer says so, after the confederate too
    assert trained["plain"]["rates"]["endorses_only"]["mean"] == 100
    assert trained["confederate"]["rates"]["conforms"]["mean"] == 100
    assert trained["confederate"]["rates"]["conforms"]["probes"] == 2
    assert results["scores"]["systems"]["zero_shot"]["confederate"]["guards"]["replies_per_round"] == 1
    saved = json.loads((tmp_path / "groupthink" / "groupthink.json").read_text())
    assert all(t["verdict"] for r in saved["rounds"] for t in r["turns"] if not t["scripted"])
    # a rerun plays nothing again and gives the same figures
    calls = len(spoken)
    again = evaluate_groupthink(ROSTER, graphs, judge=judge, judge_name="constant", probes=2, out=tmp_path)
    assert len(spoken) == calls and again["scores"] == results["scores"]
    assert len((tmp_path / "groupthink" / "rounds.jsonl").read_text().splitlines()) == len(lines)
    # the report has the section, with the scorer and its checks
    write_report({"systems": {}, "groupthink": results}, tmp_path / "report")
    report = (tmp_path / "report" / "report.md").read_text()
    assert "## Groupthink (held-out probes)" in report
    assert "| trained | confederate | 100 [100, 100] (n=2) | 0 [0, 0] (n=2) | 100 [100, 100] (n=2)" in report
    assert "judge constant on 32 labelled replies" in report and "rule fallback" in report


@pytest.mark.parametrize(("files", "message"), [
    ((), "groupthink.yaml"),
    (("probes",), "groupthink_labels.yaml"),
    (("probes", "dev labels"), "no labelled reply answers a test probe"),
])
def test_eval_groupthink_needs_a_whole_probe_set_beside_the_roster(files, message, tmp_path, monkeypatch,
                                                                   capsys) -> None:
    import yaml

    from mascot.cli.main import main
    from mascot.rosters.loader import roster_path
    from mascot.rosters.probes import label_path, probe_path

    shipped = roster_path("emotional_support")
    (tmp_path / "roster.yaml").write_text(shipped.read_text().replace("id: emotional_support", "id: my_roster", 1))
    if "probes" in files:
        (tmp_path / "groupthink.yaml").write_text(probe_path("emotional_support").read_text())
    if "dev labels" in files:
        labels = yaml.safe_load(label_path("emotional_support").read_text())
        dev = {p.id for p in PROBES if p.split == "dev"}
        labels["replies"] = [r for r in labels["replies"] if r["probe"] in dev]
        (tmp_path / "groupthink_labels.yaml").write_text(yaml.safe_dump(labels))
    (tmp_path / "policies.yaml").write_text(
        "version: 1\nroles:\n  default: {kind: openai, base_url: 'http://127.0.0.1:9/v1', model: m}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["eval", "--roster", ".", "--policies", "policies.yaml", "--judge-model", "m", "--groupthink", "2",
                 "--judge-base-url", "http://127.0.0.1:9/v1", "--out", "ev"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("mascot: error: --groupthink: ") and message in err[0], err


@pytest.mark.real_model
def test_groupthink_judge_and_a_confederate_round_on_the_real_model(offline_model) -> None:
    from mascot.policies import Policies, PolicySpec

    held_out = {p.id for p in PROBES if p.split == "test"}
    judged = Policies.single(PolicySpec(model=str(offline_model), temperature=0.0, max_tokens=48), ROSTER, seed=0)
    check = check_scorer(JudgeScorer(judged.chat_model("judge"), name="offline", concurrency=4),
                         [x for x in LABELLED if x.probe in held_out][:4], PROBES)
    assert check.replies == 4 and check.failed == 0  # strict JSON verdicts from the real model
    played = Policies({"default": PolicySpec(model=str(offline_model), max_tokens=24),
                       "director": PolicySpec(model=str(offline_model), max_tokens=96)}, ROSTER, seed=0)
    graph = build_system("director", ROSTER, director=played.chat_model("director"),
                         speakers=played.chat_model("default"))
    probe = next(p for p in PROBES if p.id in held_out)
    round_ = asyncio.run(aplay_probe(graph, "director", ROSTER, probe, "confederate"))
    assert round_.turns[0] == {"voice": ROSTER.personas[0].id, "text": probe.confederate, "position": 1,
                               "scripted": True}
    assert ROSTER.personas[0].id not in [t["voice"] for t in round_.replies]
    for direction in round_.directions[1:]:  # the directions' words never reach a reply
        assert all(direction["action"] not in t["text"] for t in round_.replies)


def test_eval_with_groupthink_on_servers_shares_the_evaluation_event_loop(tmp_path, capsys) -> None:
    # the judge's client is made in the evaluation's loop: a loop of its own failed with
    # "Event loop is closed"
    from mascot.cli.main import main
    from mascot.testing.stub_server import start_stub_server

    with start_stub_server() as server:
        (tmp_path / "policies.yaml").write_text(
            f"version: 1\nroles:\n  default: {{kind: openai, base_url: '{server.url}', model: stub}}\n")
        code = main(["eval", "--roster", "emotional_support", "--policies", str(tmp_path / "policies.yaml"),
                     "--baselines", "zero_shot", "--episodes", "1", "--max-rounds", "1", "--rubrics", "persona",
                     "--judge-model", "stub-judge", "--judge-base-url", server.url, "--groupthink", "1",
                     "--out", str(tmp_path / "ev")])
    captured = capsys.readouterr()
    assert code == 0, captured.err[-3000:]
    results = json.loads((tmp_path / "ev" / "results.json").read_text())["groupthink"]
    assert set(results["scores"]["systems"]) == {"trained", "zero_shot"} and results["scorer"] == "rules"
    assert results["judge_check"]["failed"] == results["judge_check"]["replies"]  # the stub writes no verdict
    assert "## Groupthink (held-out probes)" in (tmp_path / "ev" / "report.md").read_text()
