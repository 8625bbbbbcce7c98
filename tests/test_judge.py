"""Rubrics as data, the LLM judge (strict parsing, retries, cache), panels, pairwise mode."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from importlib import resources
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from fakes import ScriptedChat
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_openai import ChatOpenAI
from pydantic import Field

from mascot.rosters import Roster
from mascot.training.episodes.episode import Episode, EpisodeMessage, EpisodeSource
from mascot.training.jsonl import JsonlError
from mascot.training.judging.agreement import agreement
from mascot.training.judging.judge import Judge, JudgePanel
from mascot.training.judging.judgement import JudgementCache, JudgeOutputError, parse_scores, read_judgements
from mascot.training.judging.rubric import RubricError, list_rubrics, load_rubric
from mascot.training.judging.targets import block_targets, reply_target, reply_targets

PERSONA_IDS = ["emotional_expressiveness", "empathetic_support", "persona_consistency",
               "response_relevance", "social_contribution"]
GROUP_IDS = ["persona_fidelity", "engagement_contribution", "originality_specificity", "relevance_coherence"]


def answer(*values: Any, ids: list[str] = PERSONA_IDS, rationale: str = "because") -> str:
    """A well-formed judge answer; the values default to 4 for every criterion."""
    scores = dict(zip(ids, values or [4] * len(ids), strict=True))
    return json.dumps({"rationale": rationale, "scores": scores})


class FunctionChat(BaseChatModel):
    """Answers ``reply(prompt text)`` and counts its calls."""

    reply: Callable[[str], str]
    calls: list[str] = Field(default_factory=list)

    @property
    def _llm_type(self) -> str:
        return "function"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kw: Any) -> ChatResult:
        prompt = "\n".join(m.text for m in messages)
        self.calls.append(prompt)
        return ChatResult(generations=[ChatGeneration(message=AIMessage(self.reply(prompt)))])


class FailingChat(BaseChatModel):
    """Raises ``error`` on every call."""

    error: BaseException

    @property
    def _llm_type(self) -> str:
        return "failing"

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kw: Any) -> ChatResult:
        raise self.error


def make_episode(roster_id: str = "emotional_support") -> Episode:
    """A system prompt, then 8 turns: person, anchor, catalyst, person, beacon, action guide,
    person, anchor (persona turns at message indices 2, 3, 5, 6, 8)."""
    turns = [
        ("system", None, "a system note"),
        ("user", None, "I failed my driving test again."),
        ("assistant", "anchor", "That sounds deflating, especially after all the practice."),
        ("assistant", "catalyst", "What makes 'again' feel like a verdict rather than a second try?"),
        ("user", None, "I guess I just panic when the examiner watches me."),
        ("assistant", "beacon", "Noticing the panic is already a step toward handling it."),
        ("assistant", "action_guide", "Could you book two mock tests with a stranger in the passenger seat?"),
        ("user", None, "Maybe. My brother could find someone."),
        ("assistant", "anchor", "It sounds like some hope is creeping back in."),
    ]
    return Episode(
        id="ep1", roster=roster_id, source=EpisodeSource(kind="rollout", seed=0, repeat=0),
        messages=[
            EpisodeMessage(role=role, name=name, content=text,
                           stage_direction={"speaker": name, "action": "respond", "tone": "warm"} if name else None)
            for role, name, text in turns
        ],
    )


# --- rubrics -------------------------------------------------------------------------------


def test_shipped_rubrics_load_with_every_anchor() -> None:
    assert list_rubrics() == ["direction", "group", "persona"]
    persona, group, direction = load_rubric("persona"), load_rubric("group"), load_rubric("direction")
    assert (persona.target, group.target, direction.target) == ("reply", "block", "reply")
    assert direction.criterion_ids == ["direction_compliance"] and all(
        set(c.anchors) == {1, 2, 3, 4, 5} for c in direction.criteria)
    assert persona.criterion_ids == PERSONA_IDS and group.criterion_ids == GROUP_IDS
    assert [c.name for c in persona.criteria] == [
        "Emotional Expressiveness", "Empathetic Support Quality", "Persona Consistency",
        "Response Relevance", "Social Contribution"]
    assert [c.name for c in group.criteria] == [
        "Persona Fidelity", "Engagement & Contribution", "Originality & Specificity", "Relevance & Coherence"]
    for rubric in (persona, group):
        assert rubric.version >= 1
        assert all(sorted(c.anchors) == [1, 2, 3, 4, 5] and all(c.anchors.values()) for c in rubric.criteria)


def _rubric_file(tmp_path: Path, change: Callable[[dict], None]) -> Path:
    data = yaml.safe_load(resources.files("mascot.training.judging").joinpath("rubrics", "persona.yaml").read_text())
    change(data)
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_user_rubric_file_loads(tmp_path: Path) -> None:
    path = _rubric_file(tmp_path, lambda d: d.update(id="mine", version=3))
    rubric = load_rubric(path)
    assert (rubric.id, rubric.version, rubric.criterion_ids) == ("mine", 3, PERSONA_IDS)


def test_missing_anchor_level_names_file_and_criterion(tmp_path: Path) -> None:
    path = _rubric_file(tmp_path, lambda d: d["criteria"][2]["anchors"].pop(3))
    with pytest.raises(RubricError) as error:
        load_rubric(path)
    message = str(error.value)
    assert str(path) in message and "persona_consistency" in message and "level 3" in message
    assert "\n" not in message


@pytest.mark.parametrize(("change", "expected"), [
    (lambda d: d.update(scale="1-10"), "field 'scale': unknown field"),
    (lambda d: d["criteria"][0].update(weight=2),
     "criterion 'emotional_expressiveness', field 'criteria.0.weight': unknown field"),
    (lambda d: d.update(target="episode"), "field 'target'"),
    (lambda d: d["criteria"][1].update(id="emotional_expressiveness"), "duplicate criterion id"),
    (lambda d: d["criteria"][4]["anchors"].update({6: "beyond"}), "unknown level 6"),
])
def test_invalid_rubric_fields(tmp_path: Path, change: Callable[[dict], None], expected: str) -> None:
    with pytest.raises(RubricError, match="mine.yaml") as error:
        load_rubric(_rubric_file(tmp_path, change))
    assert expected in str(error.value)


def test_unknown_rubric_lists_shipped() -> None:
    with pytest.raises(RubricError, match=r"not a shipped rubric \(direction, group, persona\)"):
        load_rubric("nonexistent")


@pytest.mark.parametrize(("scores", "overall"), [
    ([1, 1, 1, 1, 1], 0.0),
    ([5, 5, 5, 5, 5], 100.0),
    ([5, 4, 3, 2, 1], 50.0),  # mean 3 -> (3 - 1) / 4 * 100
    ([5, 5, 4, 4, 4], 85.0),  # mean 4.4 -> 3.4 / 4 * 100
    ([2, 2, 2, 2, 1], 20.0),  # mean 1.8 -> 0.8 / 4 * 100
])
def test_overall_is_the_mean_mapped_to_0_100(scores: list[int], overall: float) -> None:
    assert load_rubric("persona").overall(dict(zip(PERSONA_IDS, scores, strict=True))) == overall


def test_overall_refuses_incomplete_scores() -> None:
    with pytest.raises(ValueError, match="exactly the criteria"):
        load_rubric("persona").overall(dict.fromkeys(PERSONA_IDS[:4], 3))


# --- parsing and retries -------------------------------------------------------------------

GOOD = answer(5, 4, 3, 2, 1)
PARSED = dict(zip(PERSONA_IDS, [5, 4, 3, 2, 1], strict=True))

USABLE = [
    pytest.param(GOOD, id="bare JSON"),
    pytest.param(f"Here is my verdict:\n{GOOD}\nI hope this helps.", id="JSON in prose"),
    pytest.param(f"```json\n{GOOD}\n```", id="code fence"),
    pytest.param(f"<think>weigh {{it}}</think>{GOOD}", id="reasoning block"),
    pytest.param(json.dumps({"rationale": "r",
                             "scores": dict(zip(PERSONA_IDS, ["5", 4.0, " 3 ", 2, {"score": 1}], strict=True))}),
                 id="string, float and nested scores"),
    pytest.param(json.dumps({"Emotional Expressiveness": 5, "Empathetic Support Quality": 4,
                             "persona_consistency": 3, "Response Relevance": 2, "social_contribution": 1}),
                 id="flat, by criterion name"),
]
MALFORMED = [
    pytest.param(json.dumps({"scores": dict(zip(PERSONA_IDS[:4], [4] * 4, strict=True))}),
                 "missing criteria: social_contribution",
                 id="missing criterion"),
    pytest.param(answer(6, 4, 4, 4, 4), "got 6", id="score 6"),
    pytest.param(answer(4, 0, 4, 4, 4), "got 0", id="score 0"),
    pytest.param(answer(4, 4, 3.5, 4, 4), "got 3.5", id="score 3.5"),
    pytest.param(answer(4, 4, "high", 4, 4), 'got "high"', id="score in words"),
    pytest.param(answer(4, 4, 4, True, 4), "got true", id="boolean score"),
    pytest.param(json.dumps({"scores": {**PARSED, "humour": 3}}), "unknown criteria: humour", id="unknown criterion"),
    pytest.param("I would give it a solid four overall.", "not JSON", id="not JSON"),
    pytest.param(json.dumps({"scores": [4, 4, 4, 4, 4]}), "'scores' is not an object", id="scores as list"),
]


@pytest.mark.parametrize("output", USABLE)
def test_usable_outputs_parse(output: str) -> None:
    scores, _ = parse_scores(output, load_rubric("persona"))
    assert scores == PARSED


@pytest.mark.parametrize(("output", "reason"), MALFORMED)
def test_malformed_outputs_are_refused(output: str, reason: str) -> None:
    with pytest.raises(JudgeOutputError, match=reason.replace("(", r"\(")):
        parse_scores(output, load_rubric("persona"))


@pytest.mark.parametrize(("output", "reason"), MALFORMED)
def test_malformed_output_is_reasked_and_second_answer_used(roster: Roster, output: str, reason: str) -> None:
    model = ScriptedChat(replies=[output, GOOD])
    judgement = Judge("persona", model, model_name="fake").judge(reply_targets(make_episode(), roster)[0])
    assert judgement.status == "ok" and judgement.scores == PARSED and judgement.attempts == 2
    assert judgement.overall == 50.0 and judgement.rationale == "because"
    retry = model.calls[1]  # the first prompt, the bad answer, and a correction naming the reason
    assert len(retry) == len(model.calls[0]) + 2 and retry[-2].text == output
    assert "could not be used" in retry[-1].text and reason in retry[-1].text


@pytest.mark.parametrize("output", USABLE)
def test_usable_output_needs_one_call(roster: Roster, output: str) -> None:
    model = ScriptedChat(replies=[output])
    judgement = Judge("persona", model, model_name="fake").judge(reply_targets(make_episode(), roster)[0])
    assert (judgement.status, judgement.scores, judgement.attempts) == ("ok", PARSED, 1)


def test_all_attempts_bad_gives_failed_judgement_without_scores(roster: Roster) -> None:
    bad = answer(6, 4, 4, 4, 4)
    model = ScriptedChat(replies=["not json at all", answer(4, 4, 3.5, 4, 4), bad])
    judgement = Judge("persona", model, model_name="fake", max_attempts=3).judge(
        reply_targets(make_episode(), roster)[1])
    assert judgement.status == "failed" and judgement.attempts == 3 and len(model.calls) == 3
    assert judgement.scores == {} and judgement.overall is None
    assert judgement.error == "score of 'emotional_expressiveness' must be an integer 1-5, got 6"
    assert (judgement.episode_id, judgement.turn, judgement.persona) == ("ep1", 3, "catalyst")


def test_transient_fault_fails_the_judgement_and_a_bug_raises(roster: Roster) -> None:
    target = reply_targets(make_episode(), roster)[0]
    failing = FailingChat(error=ConnectionError("refused"))
    judgement = Judge("persona", failing, model_name="fake", fault_tries=2).judge(target)
    assert judgement.status == "failed" and judgement.error == "ConnectionError: refused"
    with pytest.raises(RuntimeError, match="bug"):
        Judge("persona", FailingChat(error=RuntimeError("bug")), model_name="fake").judge(target)


class FlakyChat(ScriptedChat):
    """Raises a transient fault on the first ``faults`` calls, then answers its script."""

    faults: int = 2
    tries: int = 0

    def _generate(self, messages: list[BaseMessage], stop: Any = None, run_manager: Any = None,
                  **kw: Any) -> ChatResult:
        self.tries += 1
        if self.tries <= self.faults:
            raise ConnectionError("dropped")
        return super()._generate(messages, stop, run_manager, **kw)


@pytest.mark.parametrize("asynchronous", [False, True])
def test_transient_faults_are_retried_within_the_run(roster: Roster, asynchronous: bool) -> None:
    target = reply_targets(make_episode(), roster)[0]
    model = FlakyChat(replies=[GOOD])
    judge = Judge("persona", model, model_name="fake", fault_tries=3)
    judgement = asyncio.run(judge.ajudge(target)) if asynchronous else judge.judge(target)
    assert judgement.status == "ok" and model.tries == 3


def test_rubric_and_target_kind_must_match(roster: Roster) -> None:
    judge = Judge("group", ScriptedChat(replies=[]), model_name="fake")
    with pytest.raises(ValueError, match="rubric 'group' judges a block, not a reply"):
        judge.judge(reply_targets(make_episode(), roster)[0])


def test_judge_needs_a_model_name() -> None:
    with pytest.raises(ValueError, match="pass model_name="):
        Judge("persona", ScriptedChat(replies=[]))


def test_structured_output_over_http(roster: Roster) -> None:
    """ChatOpenAI with json_schema structured output against a mock OpenAI server."""
    bodies: list[dict] = []
    contents = iter([answer(4, 4, 4, 4, 9), answer(3, 3, 3, 3, 3)])  # first breaks the schema's range

    def handler(request: httpx.Request) -> httpx.Response:
        bodies.append(json.loads(request.content))
        return httpx.Response(200, json={
            "id": "x", "object": "chat.completion", "created": 0, "model": "judge-model",
            "choices": [{"index": 0, "finish_reason": "stop",
                         "message": {"role": "assistant", "content": next(contents)}}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    model = ChatOpenAI(model="judge-model", api_key="k", base_url="http://127.0.0.1:9/v1", max_retries=0,
                       http_client=httpx.Client(transport=httpx.MockTransport(handler)))
    judgement = Judge("persona", model, structured_output=True).judge(reply_targets(make_episode(), roster)[0])
    assert (judgement.status, judgement.overall, judgement.attempts) == ("ok", 50.0, 2)
    assert judgement.judge_model == "judge-model"
    schema = bodies[0]["response_format"]["json_schema"]["schema"]
    assert bodies[0]["response_format"]["type"] == "json_schema"
    assert schema["properties"]["scores"]["required"] == PERSONA_IDS
    assert "got 9" in bodies[1]["messages"][-1]["content"]


# --- cache ---------------------------------------------------------------------------------


def test_rerun_with_cache_makes_zero_calls(roster: Roster, tmp_path: Path) -> None:
    path = tmp_path / "judgements.jsonl"
    targets = reply_targets(make_episode(), roster)
    scores = {t.reply: [1 + (len(t.reply) + i) % 5 for i in range(5)] for t in targets}

    def reply(prompt: str) -> str:
        return answer(*next(v for text, v in scores.items() if f"judge\n{text}" in prompt))

    first = FunctionChat(reply=reply)
    with JudgementCache(path) as cache:
        before = asyncio.run(Judge("persona", first, model_name="m", cache=cache).ajudge_many(targets, concurrency=3))
    assert len(first.calls) == len(targets) and all(j.status == "ok" for j in before)

    again = FunctionChat(reply=reply)
    with JudgementCache(path) as cache:
        judge = Judge("persona", again, model_name="m", cache=cache)
        after = asyncio.run(judge.ajudge_many(targets)) + [judge.judge(t) for t in targets]
    assert again.calls == []
    assert after == before + before
    assert len(read_judgements(path)) == len(targets)

    other = FunctionChat(reply=reply)  # another judge model misses the cache
    with JudgementCache(path) as cache:
        Judge("persona", other, model_name="other", cache=cache).judge(targets[0])
    assert len(other.calls) == 1


def test_failed_judgements_are_retried_next_run(roster: Roster, tmp_path: Path) -> None:
    path = tmp_path / "judgements.jsonl"
    target = reply_targets(make_episode(), roster)[0]
    with JudgementCache(path) as cache:
        failed = Judge("persona", ScriptedChat(replies=["no"]), model_name="m", max_attempts=1,
                       cache=cache).judge(target)
    assert failed.status == "failed" and read_judgements(path) == []
    model = ScriptedChat(replies=[GOOD])
    with JudgementCache(path) as cache:
        assert Judge("persona", model, model_name="m", cache=cache).judge(target).status == "ok"
    assert len(model.calls) == 1 and len(read_judgements(path)) == 1


def test_cache_has_one_writer(tmp_path: Path) -> None:
    path = tmp_path / "judgements.jsonl"
    with JudgementCache(path), pytest.raises(JsonlError, match="another run"):
        JudgementCache(path)


# --- panel agreement -----------------------------------------------------------------------


def test_agreement_perfect() -> None:
    assert agreement([[1, 2, 3, 5], [1, 2, 3, 5], [1, 2, 3, 5]]) == {"krippendorff_alpha": 1.0, "spearman": 1.0}


def test_agreement_hand_computed() -> None:
    # Rater A: 1 2 3 4; rater B: 1 2 4 3. Interval alpha, n = 8 pairable values.
    # D_o: within-unit ordered pairs (v_i - v_j)^2 / (m_u - 1): 0 + 0 + 2*1 + 2*1 = 4; / n -> 0.5
    # D_e: values 1,1,2,2,3,4,4,3, mean 2.5, squared deviations 2.25+2.25+.25+.25+.25+2.25+2.25+.25 = 10;
    #      ordered pairs sum = 2 n * 10 = 160; / (n (n - 1)) = 160 / 56
    # alpha = 1 - 0.5 / (160 / 56) = 1 - 28 / 160 = 0.825
    # Spearman: ranks 1 2 3 4 vs 1 2 4 3, d^2 = 0+0+1+1 = 2, rho = 1 - 6*2 / (4*15) = 0.8
    result = agreement([[1, 2, 3, 4], [1, 2, 4, 3]])
    assert result["krippendorff_alpha"] == pytest.approx(0.825)
    assert result["spearman"] == pytest.approx(0.8)


def test_agreement_with_ties_hand_computed() -> None:
    # A: 1 2 2 5 -> ranks 1, 2.5, 2.5, 4; B: 2 2 3 5 -> ranks 1.5, 1.5, 3, 4 (both mean 2.5)
    # rank deviations A: -1.5 0 0 1.5, B: -1 -1 .5 1.5; sum of products 1.5 + 2.25 = 3.75;
    # squares 4.5 and 4.5 -> rho = 3.75 / 4.5 = 5/6
    # alpha: D_o = (2*1 + 0 + 2*1 + 0) / 8 = 0.5; values 1,2,2,2,2,3,5,5 (mean 2.75) have squared
    # deviations 15.5 -> D_e = 2 * 8 * 15.5 / (8 * 7) = 31/7; alpha = 1 - 0.5 * 7 / 31 = 27.5 / 31
    result = agreement([[1, 2, 2, 5], [2, 2, 3, 5]])
    assert result["spearman"] == pytest.approx(5 / 6)
    assert result["krippendorff_alpha"] == pytest.approx(27.5 / 31)


def test_agreement_published_example_with_missing_values() -> None:
    # Krippendorff (2011), "Computing Krippendorff's alpha-reliability", 4 coders x 12 units:
    # interval alpha = 0.849
    data = [
        [1, 2, 3, 3, 2, 1, 4, 1, 2, None, None, None],
        [1, 2, 3, 3, 2, 2, 4, 1, 2, 5, None, 3],
        [None, 3, 3, 3, 2, 3, 4, 2, 2, 5, 1, None],
        [1, 2, 3, 3, 2, 4, 4, 1, 2, 5, 1, None],
    ]
    assert agreement(data)["krippendorff_alpha"] == pytest.approx(0.849, abs=5e-4)


def test_agreement_undefined_and_opposed() -> None:
    assert agreement([[3, 3, 3], [3, 3, 3]]) == {"krippendorff_alpha": None, "spearman": None}
    opposed = agreement([[1, 2, 3], [3, 2, 1]])
    assert opposed["spearman"] == pytest.approx(-1.0) and opposed["krippendorff_alpha"] < 0
    with pytest.raises(ValueError, match="row lengths"):
        agreement([[1, 2], [1]])


def test_panel_reports_agreement_per_criterion(roster: Roster) -> None:
    targets = block_targets(make_episode(), roster, block_turns=3)  # 3 blocks
    table = {  # judge -> per block, scores of the 4 group criteria
        "a": [[1, 2, 3, 4], [2, 3, 4, 5], [3, 4, 5, 5]],
        "b": [[1, 2, 4, 3], [2, 3, 4, 5], [3, 4, 5, 5]],
    }

    def judge(name: str) -> Judge:
        def reply(prompt: str) -> str:
            block = next(i for i, t in enumerate(targets) if f"judge\n{t.body()}\n" in prompt)
            return answer(*table[name][block], ids=GROUP_IDS)
        return Judge("group", FunctionChat(reply=reply), model_name=name)

    panel = JudgePanel([judge("a"), judge("b")])
    results = asyncio.run(panel.ajudge_many(targets))
    assert [[j.judge_model for j in row] for row in results] == [["a", "b"]] * 3
    report = panel.agreement(results)
    assert report["persona_fidelity"] == {"krippendorff_alpha": 1.0, "spearman": 1.0}
    assert report["originality_specificity"] == agreement([[3, 4, 5], [4, 4, 5]])
    assert report["overall"] == agreement([[j.overall for j in col] for col in zip(*results, strict=True)])
    with pytest.raises(ValueError, match="distinct model names"):
        JudgePanel([judge("a"), judge("a")])


# --- pairwise mode -------------------------------------------------------------------------


def _two_replies(roster: Roster) -> tuple[Any, Any]:
    episode = make_episode()
    base = {"roster": roster, "episode_id": "ep1", "persona": "catalyst", "context": episode.chat()[:3],
            "direction": {"action": "probe", "tone": "curious"}}
    return (reply_target(**base, reply="What makes it feel like a verdict?", sample=0),
            reply_target(**base, reply="You will pass next time, don't worry!", sample=1))


def test_pairwise_position_bias_gives_a_tie(roster: Roster) -> None:
    always_first = FunctionChat(reply=lambda prompt: json.dumps({"rationale": "first is best", "winner": "A"}))
    result = Judge("persona", always_first, model_name="biased").compare(*_two_replies(roster))
    assert result.votes == ["a", "b"] and result.winner == "tie" and result.status == "ok"
    assert len(always_first.calls) == 2


def test_pairwise_consistent_preference_wins(roster: Roster) -> None:
    a, b = _two_replies(roster)

    def prefers_question(prompt: str) -> str:
        first = prompt.split("## Reply A\n")[1].split("\n")[0]
        return json.dumps({"rationale": "r", "winner": "A" if first.endswith("?") else "B"})

    model = FunctionChat(reply=prefers_question)
    judge = Judge("persona", model, model_name="fair")
    assert judge.compare(b, a).winner == "b" and judge.compare(a, b).winner == "a"
    assert asyncio.run(judge.acompare(a, b)).votes == ["a", "a"]
    with pytest.raises(ValueError, match="share their context"):
        judge.compare(a, reply_targets(make_episode(), roster)[0])


# --- targets -------------------------------------------------------------------------------


def test_reply_targets_one_per_persona_turn(roster: Roster) -> None:
    episode = make_episode()
    targets = reply_targets(episode, roster)
    persona_turns = [i for i, m in enumerate(episode.messages) if m.role == "assistant"]
    assert [t.turn for t in targets] == persona_turns == [2, 3, 5, 6, 8]
    assert [t.persona.id for t in targets] == ["anchor", "catalyst", "beacon", "action_guide", "anchor"]
    second = targets[1]
    assert [(c.label, c.text) for c in second.context] == [
        ("Person", "I failed my driving test again."),
        ("The Anchor", "That sounds deflating, especially after all the practice."),
    ]  # the system message is not part of the conversation
    assert second.reply.startswith("What makes") and second.direction["tone"] == "warm"


def test_block_targets_of_n_turns(roster: Roster) -> None:
    episode = make_episode()
    blocks = block_targets(episode, roster, block_turns=3)
    assert [(b.start, b.end) for b in blocks] == [(1, 4), (4, 7), (7, 9)]  # 8 turns: 3 + 3 + 2
    assert [len(b.block) for b in blocks] == [3, 3, 2]
    assert [len(b.context) for b in blocks] == [0, 3, 6]
    assert [t.speaker for t in blocks[1].block] == ["user", "beacon", "action_guide"]
    assert [(b.start, b.end) for b in block_targets(episode, roster, block_turns=4)] == [(1, 5), (5, 9)]
    assert len(block_targets(episode, roster, block_turns=1)) == 5  # person-only blocks are left out
    with pytest.raises(ValueError, match="block_turns"):
        block_targets(episode, roster, block_turns=0)


def test_targets_check_roster_and_persona(roster: Roster) -> None:
    with pytest.raises(ValueError, match="of roster 'workplace_meeting', not 'emotional_support'"):
        reply_targets(make_episode("workplace_meeting"), roster)
    with pytest.raises(ValueError, match="unknown persona 'skeptic'"):
        reply_target(roster, episode_id="x", persona="skeptic", context=[], reply="hm")
