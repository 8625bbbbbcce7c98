"""LLM judges: rubric scores for persona replies and conversation blocks, cached and retried.

A ``Judge`` asks a chat model to score a target (``ReplyTarget``: one persona turn in its
context; ``BlockTarget``: N consecutive turns) on every criterion of a ``Rubric``, 1..5.
Output is parsed strictly; a malformed answer is re-asked with a short correction, and
after ``max_attempts`` the result is a ``failed`` Judgement with the reason, never a
made-up score. The overall score is ``(mean - 1) / 4 * 100`` of the criterion scores.
Final judgements are cached in a JSONL file keyed by (content hash of the prompt, rubric
id and version, judge model), so a rerun makes no model calls for what it already holds.
``JudgePanel`` judges with several models and reports their agreement (``agreement``).
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable
from pydantic import BaseModel, ConfigDict

from mascot.training.judging.agreement import agreement
from mascot.training.judging.judgement import (
    Judgement,
    JudgementCache,
    JudgeOutputError,
    content_hash,
    judge_json,
    parse_scores,
)
from mascot.training.judging.rubric import LEVELS, Rubric, load_rubric
from mascot.training.judging.targets import Target
from mascot.training.retry import aretry_transient, retry_transient, transient_error

logger = logging.getLogger(__name__)

_CORRECTION = "Your answer could not be used: {reason}. Reply again with only the JSON object asked for."


class Comparison(BaseModel):
    """A pairwise verdict: which of two targets is better under the rubric.

    The judge is asked twice with the positions swapped; ``winner`` is ``a`` or ``b``
    only when both orders agree, else ``tie``; ``None`` when an order failed.
    ``votes`` holds each order's vote (A-first, then B-first) in terms of a/b.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    winner: Literal["a", "b", "tie"] | None
    votes: list[Literal["a", "b", "tie"] | None]
    rationales: list[str]
    rubric: str
    rubric_version: int
    judge_model: str
    status: Literal["ok", "failed"]
    error: str | None = None


class _Ask:
    """One question to the judge model, re-asked with a correction on a malformed answer."""

    def __init__(self, messages: list[BaseMessage], parse: Callable[[Any], Any], max_attempts: int) -> None:
        self.messages, self.parse, self.max_attempts = messages, parse, max_attempts
        self.calls, self.result, self.error = 0, None, None

    def answer(self, output: Any) -> bool:
        """Take the model's output; whether the question is settled (parsed or given up)."""
        self.calls += 1
        message, parsed = _model_output(output)
        try:
            self.result, self.error = self.parse(parsed if parsed is not None else message.text), None
            return True
        except JudgeOutputError as exc:
            self.error = str(exc)
            logger.info("judge answer %d/%d unusable: %s", self.calls, self.max_attempts, exc)
        correction = HumanMessage(_CORRECTION.format(reason=self.error))
        self.messages = [*self.messages, AIMessage(message.text), correction]
        return self.calls >= self.max_attempts


def _model_output(output: Any) -> tuple[AIMessage, dict[str, Any] | None]:
    """The raw message and (with structured output) the parsed object of a model call."""
    if isinstance(output, AIMessage):
        return output, None
    # with_structured_output(include_raw=True) returns {"raw", "parsed", "parsing_error"}
    return output["raw"], output["parsed"] if isinstance(output.get("parsed"), dict) else None


def _run(model: Runnable, ask: _Ask, tries: int) -> _Ask:
    while not ask.answer(retry_transient(lambda: model.invoke(ask.messages), tries)):
        pass
    return ask


async def _arun(model: Runnable, ask: _Ask, tries: int) -> _Ask:
    while not ask.answer(await aretry_transient(lambda: model.ainvoke(ask.messages), tries)):
        pass
    return ask


def _one_line(error: BaseException) -> str:
    text = " ".join(str(error).split())[:300]
    return f"{type(error).__name__}: {text}" if text else type(error).__name__


_COMPARE_SCHEMA: dict[str, Any] = {
    "title": "comparison",
    "description": "Which of the two is better under the rubric.",
    "type": "object",
    "properties": {"rationale": {"type": "string"}, "winner": {"type": "string", "enum": ["A", "B", "tie"]}},
    "required": ["rationale", "winner"],
    "additionalProperties": False,
}


def _parse_vote(output: str | Mapping[str, Any]) -> tuple[str, str]:
    """``("A" | "B" | "tie", rationale)`` from a comparison answer."""
    data = judge_json(output)
    match = re.fullmatch(r"(?:reply |block )?(a|b|tie)", str(data.get("winner", "")).strip().lower())
    if match is None:
        raise JudgeOutputError(f"'winner' must be \"A\", \"B\" or \"tie\", got {json.dumps(data.get('winner'))}")
    vote = "tie" if match.group(1) == "tie" else match.group(1).upper()
    rationale = data.get("rationale")
    return vote, rationale.strip() if isinstance(rationale, str) else ""


#: Longest rationale a judge may write under structured output (characters): two or three
#: sentences, so that a weak model's verdict fits the judge's reply budget.
RATIONALE_MAX_CHARS = 400


class Judge:
    """Scores targets under one rubric with one chat model, cached and retried."""

    def __init__(
        self,
        rubric: Rubric | str | Path,
        model: BaseChatModel,
        *,
        model_name: str | None = None,
        structured_output: bool = False,
        max_attempts: int = 3,
        fault_tries: int = 5,
        cache: JudgementCache | None = None,
    ) -> None:
        """Set up the judge; nothing is called yet.

        Args:
            rubric: A rubric, a shipped rubric id or a rubric YAML file.
            model: The judge's chat model.
            model_name: Name recorded in judgements and cache keys (default: the
                model's own, e.g. ``ChatOpenAI(model=...)``).
            structured_output: Ask for JSON-schema structured output
                (``with_structured_output(method="json_schema")``, OpenAI-compatible
                servers) instead of prompting for a JSON object.
            max_attempts: Model calls per question; a malformed answer is re-asked.
            fault_tries: Tries per model call when the server fails transiently (5xx,
                429, timeouts, dropped connections), with backoff; then the judgement
                fails and is retried by the next run.
            cache: Where final judgements are kept and looked up.

        Raises:
            RubricError: if the rubric cannot be loaded.
            ValueError: if ``max_attempts`` or ``fault_tries`` < 1, or the model's name is unknown.
        """
        self.rubric = rubric if isinstance(rubric, Rubric) else load_rubric(rubric)
        if min(max_attempts, fault_tries) < 1:
            raise ValueError(f"max_attempts and fault_tries must be >= 1, got {max_attempts} and {fault_tries}")
        # chat models report their model name (for tracing) through _get_ls_params
        self.model_name: str = model_name or model._get_ls_params().get("ls_model_name") or ""
        if not self.model_name:
            raise ValueError(f"cannot tell the name of the {type(model).__name__} judge model; pass model_name=")
        self.max_attempts, self.fault_tries = max_attempts, fault_tries
        self.cache = cache
        self._scorer: Runnable = model
        self._comparer: Runnable = model
        if structured_output:
            self._scorer = model.with_structured_output(self._schema(), method="json_schema", include_raw=True)
            self._comparer = model.with_structured_output(_COMPARE_SCHEMA, method="json_schema", include_raw=True)

    def prompt(self, target: Target) -> list[BaseMessage]:
        """The judge's prompt for a target.

        Raises:
            ValueError: if the rubric judges the other kind of target.
        """
        self._check(target)
        example = {"rationale": "two or three sentences", "scores": dict.fromkeys(self.rubric.criterion_ids, "1-5")}
        return [
            SystemMessage(self._system()),
            HumanMessage(f"{target.shared()}\n\n## The {target.kind} to judge\n{target.body()}\n\n"
                         f"Answer with only a JSON object: {json.dumps(example)}"),
        ]

    async def ajudge(self, target: Target) -> Judgement:
        """Judge one target (from the cache when it holds it).

        Returns:
            The judgement: ``ok``, or ``failed`` with the reason when no answer parsed
            within ``max_attempts`` or the server kept failing (transient faults).

        Raises:
            ValueError: if the rubric judges the other kind of target.
            Exception: a model error that is not a transient server fault.
        """
        messages, cached = self._lookup(target)
        if cached is not None:
            return cached
        ask = _Ask(messages, lambda out: parse_scores(out, self.rubric), self.max_attempts)
        try:
            await _arun(self._scorer, ask, self.fault_tries)
        except Exception as exc:
            if not transient_error(exc):
                raise
            ask.error = _one_line(exc)
        return self._finish(target, messages, ask)

    def judge(self, target: Target) -> Judgement:
        """Judge one target synchronously; see ``ajudge``."""
        messages, cached = self._lookup(target)
        if cached is not None:
            return cached
        ask = _Ask(messages, lambda out: parse_scores(out, self.rubric), self.max_attempts)
        try:
            _run(self._scorer, ask, self.fault_tries)
        except Exception as exc:
            if not transient_error(exc):
                raise
            ask.error = _one_line(exc)
        return self._finish(target, messages, ask)

    async def ajudge_many(
        self,
        targets: Sequence[Target],
        *,
        concurrency: int = 8,
        on_judgement: Callable[[Judgement], None] | None = None,
    ) -> list[Judgement]:
        """Judge many targets, ``concurrency`` at a time.

        Args:
            targets: The targets.
            concurrency: Targets judged at once.
            on_judgement: Called with each judgement when it is done (progress).

        Returns:
            The judgements, in the order of ``targets``.

        Raises:
            ValueError: if ``concurrency`` < 1 or a target does not fit the rubric.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        limit = asyncio.Semaphore(concurrency)

        async def one(target: Target) -> Judgement:
            async with limit:
                judgement = await self.ajudge(target)
            if on_judgement is not None:
                on_judgement(judgement)
            return judgement

        return list(await asyncio.gather(*(one(t) for t in targets)))

    async def acompare(self, a: Target, b: Target) -> Comparison:
        """Which of two targets with the same context is better, asked in both orders.

        Returns:
            The comparison; ``winner`` is set only when both orders agree.

        Raises:
            ValueError: if the targets differ in kind or context, or do not fit the rubric.
        """
        asks = [self._compare_ask(a, b), self._compare_ask(b, a)]
        for ask in asks:
            await _arun(self._comparer, ask, self.fault_tries)
        return self._comparison(asks)

    def compare(self, a: Target, b: Target) -> Comparison:
        """Synchronous ``acompare``."""
        asks = [self._compare_ask(a, b), self._compare_ask(b, a)]
        for ask in asks:
            _run(self._comparer, ask, self.fault_tries)
        return self._comparison(asks)

    def _system(self) -> str:
        return (
            "You are a strict, impartial judge of conversations between a person and an ensemble of "
            f"persona voices. {self.rubric.description}\n\nScore the {self.rubric.target} on each criterion "
            "with an integer from 1 to 5, using the anchors. Judge substance, not politeness: agreement, "
            "praise and reassurance earn nothing by themselves.\n\nCriteria:\n" + self.rubric.render()
        )

    def _schema(self) -> dict[str, Any]:
        score = {"type": "integer", "enum": list(LEVELS)}
        ids = self.rubric.criterion_ids
        scores = {"type": "object", "properties": dict.fromkeys(ids, score), "required": ids,
                  "additionalProperties": False}
        return {"title": "judgement", "description": f"Scores under the '{self.rubric.id}' rubric.",
                "type": "object", "properties": {"rationale": {"type": "string", "maxLength": RATIONALE_MAX_CHARS},
                                                 "scores": scores},
                "required": ["rationale", "scores"], "additionalProperties": False}

    def _check(self, target: Target) -> None:
        if target.kind != self.rubric.target:
            raise ValueError(
                f"rubric '{self.rubric.id}' judges a {self.rubric.target}, not a {target.kind} "
                f"(use a {'ReplyTarget' if self.rubric.target == 'reply' else 'BlockTarget'})"
            )

    def _lookup(self, target: Target) -> tuple[list[BaseMessage], Judgement | None]:
        messages = self.prompt(target)
        if self.cache is None:
            return messages, None
        cached = self.cache.get((content_hash(messages), self.rubric.id, self.rubric.version, self.model_name))
        # the same text may occur in another episode: same verdict, that target's identity
        return messages, cached.model_copy(update=target.identity()) if cached else None

    def _finish(self, target: Target, messages: list[BaseMessage], ask: _Ask) -> Judgement:
        common = dict(rubric=self.rubric.id, rubric_version=self.rubric.version, judge_model=self.model_name,
                      content_hash=content_hash(messages), attempts=ask.calls, **target.identity())
        if ask.result is None:
            logger.warning("judging %s failed after %d calls: %s", target.episode_id, ask.calls, ask.error)
            return Judgement(status="failed", error=ask.error, **common)
        scores, rationale = ask.result
        judgement = Judgement(status="ok", scores=scores, rationale=rationale,
                              overall=self.rubric.overall(scores), **common)
        if self.cache is not None:
            self.cache.put(judgement)
        return judgement

    def _compare_ask(self, first: Target, second: Target) -> _Ask:
        self._check(first)
        if type(first) is not type(second) or first.shared() != second.shared():
            raise ValueError("targets to compare must be of the same kind and share their context")
        what = first.kind
        text = (f"{first.shared()}\n\n## {what.capitalize()} A\n{first.body()}\n\n## {what.capitalize()} B\n"
                f"{second.body()}\n\nWhich {what} is better under the rubric as a whole? Answer with only a "
                'JSON object: {"rationale": "two or three sentences", "winner": "A" or "B" or "tie"}')
        return _Ask([SystemMessage(self._system()), HumanMessage(text)], _parse_vote, self.max_attempts)

    def _comparison(self, asks: list[_Ask]) -> Comparison:
        # order 1 shows a as A; order 2 shows b as A
        names = [{"A": "a", "B": "b", "tie": "tie"}, {"A": "b", "B": "a", "tie": "tie"}]
        votes = [names[i][ask.result[0]] if ask.result else None for i, ask in enumerate(asks)]
        errors = [ask.error for ask in asks if ask.result is None]
        winner = None if errors else votes[0] if votes[0] == votes[1] else "tie"
        return Comparison(
            winner=winner, votes=votes, rationales=[ask.result[1] if ask.result else "" for ask in asks],
            rubric=self.rubric.id, rubric_version=self.rubric.version, judge_model=self.model_name,
            status="failed" if errors else "ok", error="; ".join(e or "" for e in errors) or None,
        )


class JudgePanel:
    """Several judges (one model each, same rubric) on the same targets, with agreement."""

    def __init__(self, judges: Sequence[Judge]) -> None:
        """Hold the judges.

        Raises:
            ValueError: with fewer than two judges, different rubrics (id and version),
                or two judges of the same model name.
        """
        if len(judges) < 2:
            raise ValueError(f"a panel needs at least two judges, got {len(judges)}")
        rubrics = {(j.rubric.id, j.rubric.version) for j in judges}
        if len(rubrics) > 1:
            raise ValueError(f"the judges of a panel must share one rubric; got {sorted(rubrics)}")
        names = [j.model_name for j in judges]
        if len(set(names)) < len(names):
            raise ValueError(f"the judges of a panel need distinct model names; got {', '.join(names)}")
        self.judges = list(judges)
        self.rubric = judges[0].rubric

    def judge(self, target: Target) -> list[Judgement]:
        """Every judge's judgement of one target, in judge order."""
        return [judge.judge(target) for judge in self.judges]

    async def ajudge(self, target: Target) -> list[Judgement]:
        """Every judge's judgement of one target, in judge order, judged concurrently."""
        return list(await asyncio.gather(*(judge.ajudge(target) for judge in self.judges)))

    async def ajudge_many(self, targets: Sequence[Target], *, concurrency: int = 8) -> list[list[Judgement]]:
        """Per target, every judge's judgement (``concurrency`` targets per judge at once)."""
        columns = await asyncio.gather(*(j.ajudge_many(targets, concurrency=concurrency) for j in self.judges))
        return [list(row) for row in zip(*columns, strict=True)]

    def agreement(self, results: Sequence[Sequence[Judgement]]) -> dict[str, dict[str, float | None]]:
        """Agreement of the judges per criterion and on ``overall`` (see ``agreement``).

        Args:
            results: Per target, the judgements of every judge in judge order (as
                ``judge``/``ajudge_many`` return them); failed judgements count as missing.

        Returns:
            Criterion id (and ``overall``) -> ``{"krippendorff_alpha", "spearman"}``.

        Raises:
            ValueError: if a row does not hold one judgement per judge.
        """
        if any(len(row) != len(self.judges) for row in results):
            raise ValueError(f"every row of results needs one judgement per judge ({len(self.judges)})")
        by_judge = list(zip(*results, strict=True))
        report = {}
        for criterion in [*self.rubric.criterion_ids, "overall"]:
            report[criterion] = agreement([
                [j.overall if criterion == "overall" else j.scores.get(criterion) for j in column]
                for column in by_judge
            ])
        return report
