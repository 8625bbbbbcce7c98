"""Relative judging: ranking and pairwise modes score a context's candidates against each other,
averaged over both orders, so a judge that favours a position gains nothing; the sanity check
measures each mode and the one that passes the gate labels."""

from __future__ import annotations

import asyncio
import json
import math
import re
from pathlib import Path
from typing import Any

import pytest
from fakes import PromptChat
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult

from mascot.cli import main
from mascot.rosters import Roster
from mascot.training.judging.judge import Judge
from mascot.training.judging.judge_sanity import (
    choose_mode,
    read_sanity_report,
    run_relative_sanity,
    run_sanity,
)
from mascot.training.judging.judgement import Judgement, JudgeOutputError
from mascot.training.judging.relative import RANK_MAX, RelativeJudge, chance_of_a
from mascot.training.judging.sanity_set import load_sanity_set
from mascot.training.judging.targets import reply_target

GOOD = "What made this one feel like a verdict on you, rather than one bad morning?"
BAD = "I'm sorry, but I can't help with that."


def _targets(roster: Roster, replies: list[str]) -> list[Any]:
    context = [{"role": "user", "content": "I failed my driving test again"}]
    return [reply_target(roster, episode_id="ctx", persona="catalyst", context=context, reply=reply, turn=1, sample=i)
            for i, reply in enumerate(replies)]


def _shown(prompt: str, marker: str) -> list[str]:
    """The candidates' texts in the order the prompt shows them (``## Reply 1`` / ``## Reply A``)."""
    return [m.strip() for m in re.findall(rf"## (?:Reply|Block) {marker}\n(.*?)(?=\n\n## |\n\nCompare|\n\nWhich)",
                                          prompt, re.DOTALL)]


def _ranker(prefer: Any) -> PromptChat:
    """A ranking judge: each shown candidate's score is ``prefer(text, position)``."""
    def reply(prompt: str) -> str:
        shown = _shown(prompt, r"\d+")
        return json.dumps({"rationale": "fake", "scores": {str(i): prefer(t, i) for i, t in enumerate(shown, 1)}})
    return PromptChat(reply=reply)


class LogprobChat(BaseChatModel):
    """A pairwise judge: P("A") = ``p_a(text A, text B)``, reported as an OpenAI server does."""

    p_a: Any

    @property
    def _llm_type(self) -> str:
        return "logprob-fake"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kw: Any) -> ChatResult:
        assert kw.get("logprobs") is True and kw.get("max_tokens") == 1  # what the pairwise judge asks for
        a, b = _shown(messages[-1].text, "[AB]")
        p = self.p_a(a, b)
        top = [{"token": "A", "logprob": math.log(p)}, {"token": " B", "logprob": math.log(1 - p)}]
        return ChatResult(generations=[ChatGeneration(message=AIMessage(
            "A" if p >= 0.5 else "B", response_metadata={"logprobs": {"content": [{"token": "A", "logprob": 0.0,
                                                                                    "top_logprobs": top}]}}))])


def _relative(model: BaseChatModel, mode: str, rubric: str = "persona") -> RelativeJudge:
    return RelativeJudge(Judge(rubric, model, model_name="fake-judge"), model, mode)


def test_ranking_reads_both_orders_so_position_earns_nothing(roster: Roster) -> None:
    targets = _targets(roster, [BAD, GOOD, "Maybe book another lesson."])
    fair = asyncio.run(_relative(_ranker(lambda text, i: 9 if text == GOOD else 2), "ranking").ajudge_group(targets))
    assert [j.status for j in fair] == ["ok"] * 3 and all(j.mode == "ranking" for j in fair)
    assert fair[1].overall == 90.0 and fair[0].overall == fair[2].overall == 20.0
    # a judge that always scores whatever it shows first highest: the orders cancel out
    biased = asyncio.run(_relative(_ranker(lambda text, i: RANK_MAX if i == 1 else 0), "ranking").ajudge_group(targets))
    assert biased[0].overall == biased[2].overall == 50.0 and biased[1].overall == 0.0
    assert [j.episode_id for j in fair] == ["ctx"] * 3 and [j.sample for j in fair] == [0, 1, 2]


def test_a_malformed_ranking_fails_the_group_with_the_reason(roster: Roster) -> None:
    judged = asyncio.run(_relative(PromptChat(reply=lambda p: '{"scores": {"1": 11}}'), "ranking")
                         .ajudge_group(_targets(roster, [BAD, GOOD])))
    assert all(j.status == "failed" and j.overall is None for j in judged)
    assert 'needs "1": a number 0-10, got 11' in judged[0].error


def test_pairwise_reads_the_first_token_probabilities_in_both_orders(roster: Roster) -> None:
    targets = _targets(roster, [BAD, GOOD])
    sure = asyncio.run(_relative(LogprobChat(p_a=lambda a, b: 0.9 if a == GOOD else 0.1), "pairwise")
                       .ajudge_group(targets))
    assert sure[1].overall == pytest.approx(90.0) and sure[0].overall == pytest.approx(10.0)
    # always "A" with 0.8: the second order gives it back, a tie
    biased = asyncio.run(_relative(LogprobChat(p_a=lambda a, b: 0.8), "pairwise").ajudge_group(targets))
    assert biased[0].overall == pytest.approx(50.0) == biased[1].overall


def test_chance_of_a_sums_spellings_and_refuses_a_judge_without_logprobs() -> None:
    def reply(top: list[tuple[str, float]]) -> AIMessage:
        return AIMessage("A", response_metadata={"logprobs": {"content": [{"token": top[0][0], "logprob": top[0][1],
            "top_logprobs": [{"token": t, "logprob": math.log(p)} for t, p in top]}]}})

    assert chance_of_a(reply([("A", 0.3), (" a", 0.1), ('"B', 0.4), ("The", 0.2)])) == pytest.approx(0.5)
    with pytest.raises(JudgeOutputError, match="neither A nor B"):
        chance_of_a(reply([("The", 0.6), ("Reply", 0.4)]))
    with pytest.raises(JudgeOutputError, match="reported no token log-probabilities"):
        chance_of_a(AIMessage("A"))


def test_a_relative_judgement_has_an_overall_score_and_no_criteria() -> None:
    common = dict(episode_id="e", rubric="persona", rubric_version=1, judge_model="j", content_hash="h", attempts=1)
    assert Judgement(status="ok", overall=40.0, mode="pairwise", **common).record()["mode"] == "pairwise"
    assert "mode" not in Judgement(status="ok", overall=40.0, scores={"x": 3}, **common).record()
    with pytest.raises(ValueError, match="the criterion scores"):
        Judgement(status="ok", overall=40.0, **common)  # absolute without its scores


def test_relative_judging_needs_two_candidates_of_one_context(roster: Roster) -> None:
    judge = _relative(_ranker(lambda text, i: 5), "ranking")
    with pytest.raises(ValueError, match="two or more candidates"):
        asyncio.run(judge.ajudge_group(_targets(roster, [GOOD])))
    other = reply_target(roster, episode_id="other", persona="catalyst", reply=GOOD, turn=1, sample=0,
                         context=[{"role": "user", "content": "My boss shouted at me"}])
    with pytest.raises(ValueError, match="same kind and context"):
        asyncio.run(judge.ajudge_group([*_targets(roster, [BAD]), other]))


def _better_sides(roster: Roster, target: str) -> set[str]:
    return {p.better.body() for p in load_sanity_set(roster, target).pairs}


@pytest.mark.parametrize(("rubric", "target"), [("persona", "reply"), ("group", "block")])
def test_sanity_measures_each_mode_and_the_best_that_passes_labels(roster: Roster, rubric: str, target: str) -> None:
    sanity = load_sanity_set(roster, target)
    better = _better_sides(roster, target)

    def shown_better(text: str) -> bool:
        return text.strip() in {b.strip() for b in better}

    knows = _relative(LogprobChat(p_a=lambda a, b: 0.7 if shown_better(a) else 0.3), "pairwise", rubric)
    pairwise = run_relative_sanity(knows, sanity, concurrency=4)
    assert pairwise.mode == "pairwise" and pairwise.accuracy == 1.0 and pairwise.passed
    assert pairwise.judgements == 2 * len(sanity.pairs) and pairwise.failed_judgements == 0
    first = run_relative_sanity(_relative(_ranker(lambda text, i: RANK_MAX if i == 1 else 0), "ranking", rubric),
                                sanity)
    assert first.accuracy == 0.0 and not first.passed  # position alone: every pair a tie
    ids = Judge(rubric, PromptChat(reply=lambda p: "{}"), model_name="x").rubric.criterion_ids
    alike = run_sanity(Judge(rubric, PromptChat(reply=lambda p: json.dumps({"rationale": "r", "scores": dict.fromkeys(
        ids, 3)})), model_name="fake-judge"), sanity)
    chosen = choose_mode([alike, first, pairwise])
    assert chosen.mode == "pairwise" and chosen.passed and set(chosen.modes) == {"absolute", "ranking", "pairwise"}
    assert chosen.modes["absolute"].accuracy == 0.0 and chosen.modes["pairwise"].passed
    assert chosen.summary().startswith("pairwise mode: ") and f"pairwise {len(sanity.pairs)}/" in chosen.summary()
    none = choose_mode([alike, first])
    assert none.mode == "absolute" and not none.passed  # none passed: the metric judge labels


def test_cli_sanity_modes_then_labels_candidates_with_the_chosen_mode(roster: Roster, tmp_path: Path,
                                                                     tiny_model: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """On the local backend (a tiny random model): every mode runs end to end through the CLI,
    pairwise reading the backend's first-token log-probabilities."""
    report = tmp_path / "sanity.json"
    code = main(["judge", "--sanity", "--rubric", "persona", "--roster", "emotional_support", "--model",
                 str(tiny_model), "--modes", "pairwise,ranking", "--attempts", "1", "--out", str(report),
                 "--sanity-set", str(_small_set(tmp_path))])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    chosen = read_sanity_report(report)
    assert set(chosen.modes) == {"pairwise", "ranking"} and f"judge sanity: persona rubric, {chosen.mode} mode" in (
        captured.out)
    # the random model's first token is rarely a letter: a pairwise question without A or B fails, never guesses
    pairs = [p for p in chosen.pairs] if chosen.mode == "pairwise" else []
    assert all(p.better.error or p.better.overall is not None for p in pairs)
    candidates = tmp_path / "candidates.jsonl"
    context = [{"role": "user", "content": "I failed my driving test again"}]
    candidates.write_text("".join(json.dumps({
        "context_id": "c1", "episode_id": "e1", "turn": 1, "persona": "catalyst", "sample": i,
        "prompt": [{"role": "user", "content": "I failed my driving test again"}], "context": context, "reply": reply,
        "stage_direction": {"speaker": "catalyst", "action": "question the verdict", "tone": "curious"},
        }) + "\n" for i, reply in enumerate([BAD, GOOD])))
    out = tmp_path / "judged.jsonl"
    code = main(["judge", "--in", str(candidates), "--rubric", "persona", "--roster", "emotional_support",
                 "--model", str(tiny_model), "--mode", "ranking", "--attempts", "1", "--out", str(out)])
    captured = capsys.readouterr()
    assert "ranking mode" in captured.out, captured.err
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    assert len(rows) <= 2 and all(r["judgement"]["mode"] == "ranking" for r in rows)
    assert main(["judge", "--in", str(candidates), "--rubric", "persona", "--roster", "emotional_support",
                 "--model", str(tiny_model), "--mode", "ranking", "--mode-from", str(report), "--out",
                 str(out)]) == 2
    assert "either --mode or --mode-from" in capsys.readouterr().err


def _small_set(tmp_path: Path) -> Path:
    """Two reply contrasts of the shipped set, as a sanity file."""
    import yaml

    shipped = Path(__file__).parent.parent / "mascot" / "training" / "judging" / "sanity" / "emotional_support.yaml"
    data = yaml.safe_load(shipped.read_text())
    item = data["replies"][0]
    item["worse"] = dict(list(item["worse"].items())[:2])
    path = tmp_path / "small.yaml"
    path.write_text(yaml.safe_dump({**data, "replies": [item], "blocks": []}))
    return path


def test_local_backend_reports_the_first_token_alternatives(tiny_model: Path) -> None:
    from langchain_core.messages import HumanMessage

    from mascot.policies.local import LocalBackend
    from mascot.policies.local.chat_model import LocalChatModel

    backend = LocalBackend.load(str(tiny_model))
    top = backend.first_token_logprobs([{"role": "user", "content": "A or B?"}], top=5)
    assert len(top) == 5 and [lp for _, lp in top] == sorted((lp for _, lp in top), reverse=True)
    assert 0.0 < sum(math.exp(lp) for _, lp in top) <= 1.0 + 1e-5
    model = LocalChatModel(backend=backend, temperature=0, max_new_tokens=40)
    reply = model.bind(logprobs=True, top_logprobs=3, max_tokens=1).invoke([HumanMessage("A or B?")])
    assert reply.usage_metadata["output_tokens"] == 1  # the bound max_tokens is honoured
    alternatives = reply.response_metadata["logprobs"]["content"][0]["top_logprobs"]
    assert [a["token"] for a in alternatives] == [t for t, _ in top[:3]]
    assert "logprobs" not in model.invoke([HumanMessage("A or B?")]).response_metadata
