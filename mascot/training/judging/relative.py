"""Relative judging: the judge compares the candidates of one context instead of scoring each alone.

Small judges give most candidates the same absolute rubric score; asked which of several
candidates is better, they separate them more often. Two modes beside ``absolute``
(``Judge``, the rubric's 1-5 scores):

- ``ranking`` (as ART's RULER does): every candidate of a context in one prompt, numbered;
  the judge scores each from 0 to 10 against the others. Asked twice, in the given order and
  reversed, and averaged, so that a judge that favours a position gains nothing from it.
- ``pairwise``: each two candidates of a context, "which is better, A or B?", read from the
  probabilities of the judge's first token ("A" against "B") rather than from its sampled
  answer; both orders averaged. A candidate's score is its mean chance of winning. The judge
  must report token log-probabilities (an OpenAI-compatible server such as vLLM, or the
  local backend; ``logprobs=True``).

Both write ordinary ``Judgement`` records (``mode`` set, ``overall`` 0-100 from the relative
score, no criterion scores), so ``mascot pairs`` reads them as it reads absolute ones. The
judge's sanity check (``judge_sanity.run_relative_sanity``) measures each mode on the same
pairs; the mode that passes the gate labels.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage, SystemMessage
from langchain_core.runnables import Runnable

from mascot.training.judging.judge import Judge, _arun, _Ask, _one_line
from mascot.training.judging.judgement import Judgement, JudgeOutputError, content_hash, judge_json
from mascot.training.judging.targets import Target
from mascot.training.retry import aretry_transient, transient_error

Mode = Literal["absolute", "ranking", "pairwise"]
#: Judging modes: the rubric's absolute scores, and the two relative ones.
MODES: tuple[Mode, ...] = ("absolute", "ranking", "pairwise")
#: The ranking mode's scale: 0 (worst) .. RANK_MAX (best).
RANK_MAX = 10
#: Alternatives of the first token a pairwise question reads.
TOP_LOGPROBS = 20


class RelativeJudge:
    """Judges the candidates of one context together (``ranking`` or ``pairwise``).

    It uses a ``Judge``'s rubric, model name, retries and system prompt, and the same chat
    model; relative verdicts are not cached (a group's scores depend on the whole group).
    """

    def __init__(self, judge: Judge, model: BaseChatModel, mode: Mode, *, structured_output: bool = False) -> None:
        """Set up the judge; nothing is called yet.

        Raises:
            ValueError: on a mode that is not relative.
        """
        if mode not in ("ranking", "pairwise"):
            raise ValueError(f"mode must be ranking or pairwise, got {mode!r}")
        self.judge, self.mode, self.model = judge, mode, model
        self.structured_output = structured_output

    async def ajudge_group(self, targets: Sequence[Target]) -> list[Judgement]:
        """Judge the candidates of one context, one judgement each, in order.

        A question whose answer never parses (or whose server keeps failing) fails every
        judgement of the group, with the reason, so that a rerun judges the group again.

        Raises:
            ValueError: on fewer than two targets, targets of different contexts, or a
                rubric for the other kind of target.
            Exception: a model error that is not a transient server fault.
        """
        if len(targets) < 2:
            raise ValueError(f"relative judging needs two or more candidates of a context, got {len(targets)}")
        for target in targets:
            self.judge._check(target)
        if len({(type(t), t.shared()) for t in targets}) != 1:
            raise ValueError("relative judging compares candidates of the same kind and context")
        try:
            scores = await (self._ranking(targets) if self.mode == "ranking" else self._pairwise(targets))
        except JudgeOutputError as exc:
            return [self._judgement(t, None, str(exc), len(targets)) for t in targets]
        except Exception as exc:
            if not transient_error(exc):
                raise
            return [self._judgement(t, None, _one_line(exc), len(targets)) for t in targets]
        return [self._judgement(t, score, None, len(targets)) for t, score in zip(targets, scores, strict=True)]

    async def ajudge_groups(
        self,
        groups: Sequence[Sequence[Target]],
        *,
        concurrency: int = 8,
        on_judgement: Callable[[Judgement], None] | None = None,
    ) -> list[list[Judgement]]:
        """``ajudge_group`` for every group, ``concurrency`` groups at once.

        Raises:
            ValueError: if ``concurrency`` < 1, or as ``ajudge_group``.
        """
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        limit = asyncio.Semaphore(concurrency)

        async def one(group: Sequence[Target]) -> list[Judgement]:
            async with limit:
                judged = await self.ajudge_group(group)
            for judgement in judged:
                if on_judgement is not None:
                    on_judgement(judgement)
            return judged

        return list(await asyncio.gather(*(one(g) for g in groups)))

    # ranking ---------------------------------------------------------------------------
    def ranking_prompt(self, ordered: Sequence[Target]) -> list[BaseMessage]:
        """The ranking question for the candidates in this order (numbered from 1)."""
        kind = ordered[0].kind
        shown = "".join(f"\n\n## {kind.capitalize()} {i}\n{t.body()}" for i, t in enumerate(ordered, start=1))
        example = {"rationale": "two or three sentences", "scores": {str(i): f"0-{RANK_MAX}"
                                                                     for i in range(1, len(ordered) + 1)}}
        return [SystemMessage(self._system()), HumanMessage(
            f"{ordered[0].shared()}{shown}\n\nCompare these {len(ordered)} {kind}s with each other and score each "
            f"from 0 (worst) to {RANK_MAX} (best) under the rubric as a whole: a clearly better {kind} scores "
            f"clearly higher, equally good ones score the same. Answer with only a JSON object: "
            f"{json.dumps(example)}")]

    async def _ranking(self, targets: Sequence[Target]) -> list[float]:
        n = len(targets)
        forward, backward = list(range(n)), list(reversed(range(n)))
        asks = [_Ask(self.ranking_prompt([targets[i] for i in order]), _rank_parser(n), self.judge.max_attempts)
                for order in (forward, backward)]
        runner = self._ranker(n)
        for ask in asks:
            await _arun(runner, ask, self.judge.fault_tries)
            if ask.result is None:
                raise JudgeOutputError(f"ranking: {ask.error}")
        totals = [0.0] * n
        for order, ask in zip((forward, backward), asks, strict=True):
            for position, index in enumerate(order):
                totals[index] += ask.result[position]
        return [100.0 * total / (2 * RANK_MAX) for total in totals]

    def _ranker(self, n: int) -> Runnable:
        if not self.structured_output:
            return self.model
        score = {"type": "integer", "enum": list(range(RANK_MAX + 1))}
        ids = [str(i) for i in range(1, n + 1)]
        schema = {"title": "ranking", "description": "Each candidate's score against the others.", "type": "object",
                  "properties": {"rationale": {"type": "string", "maxLength": 400},
                                 "scores": {"type": "object", "properties": dict.fromkeys(ids, score),
                                            "required": ids, "additionalProperties": False}},
                  "required": ["rationale", "scores"], "additionalProperties": False}
        return self.model.with_structured_output(schema, method="json_schema", include_raw=True)

    # pairwise --------------------------------------------------------------------------
    def pairwise_prompt(self, first: Target, second: Target) -> list[BaseMessage]:
        """The pairwise question: ``first`` shown as A, ``second`` as B."""
        kind = first.kind
        return [SystemMessage(self._system()), HumanMessage(
            f"{first.shared()}\n\n## {kind.capitalize()} A\n{first.body()}\n\n## {kind.capitalize()} B\n"
            f"{second.body()}\n\nWhich {kind} is better under the rubric as a whole? Answer with one letter: "
            f"A or B.")]

    async def _pairwise(self, targets: Sequence[Target]) -> list[float]:
        n = len(targets)
        wins = [0.0] * n
        asker = self.model.bind(logprobs=True, top_logprobs=TOP_LOGPROBS, max_tokens=1, temperature=0.0)
        for i, j in itertools.combinations(range(n), 2):
            first = await self._chance_a(asker, targets[i], targets[j])  # i shown as A
            second = await self._chance_a(asker, targets[j], targets[i])  # j shown as A
            i_wins = (first + (1.0 - second)) / 2
            wins[i] += i_wins
            wins[j] += 1.0 - i_wins
        return [100.0 * w / (n - 1) for w in wins]

    async def _chance_a(self, asker: Runnable, first: Target, second: Target) -> float:
        output = await aretry_transient(lambda: asker.ainvoke(self.pairwise_prompt(first, second)),
                                        self.judge.fault_tries)
        return chance_of_a(output)

    # shared ----------------------------------------------------------------------------
    def _system(self) -> str:
        rubric = self.judge.rubric
        return (
            "You are a strict, impartial judge of conversations between a person and an ensemble of persona "
            f"voices. {rubric.description}\n\nYou compare candidate {rubric.target}s for the same moment of a "
            "conversation under the criteria below (their anchors run from 1, poor, to 5, excellent). Judge "
            "substance, not politeness: agreement, praise and reassurance earn nothing by themselves.\n\n"
            "Criteria:\n" + rubric.render()
        )

    def _judgement(self, target: Target, score: float | None, error: str | None, group: int) -> Judgement:
        common = dict(rubric=self.judge.rubric.id, rubric_version=self.judge.rubric.version,
                      judge_model=self.judge.model_name, content_hash=content_hash(self.ranking_prompt([target])),
                      mode=self.mode,
                      attempts=1, **target.identity())
        if score is None:
            return Judgement(status="failed", error=error or "no answer", **common)
        return Judgement(status="ok", overall=round(min(100.0, max(0.0, score)), 4),
                         rationale=f"{self.mode} among {group} candidates of the context", **common)


def _rank_parser(n: int) -> Callable[[Any], list[float]]:
    def parse(output: str | Mapping[str, Any]) -> list[float]:
        data = judge_json(output)
        scores = data.get("scores")
        if not isinstance(scores, Mapping):
            raise JudgeOutputError('the answer needs "scores": an object of each candidate\'s number and score')
        found = []
        for i in range(1, n + 1):
            value = scores.get(str(i))
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= RANK_MAX:
                raise JudgeOutputError(f'"scores" needs "{i}": a number 0-{RANK_MAX}, got {json.dumps(value)}')
            found.append(float(value))
        return found
    return parse


def chance_of_a(output: AIMessage | Mapping[str, Any]) -> float:
    """P("A") / (P("A") + P("B")) from the first token's ``top_logprobs`` of a reply
    (``response_metadata["logprobs"]``, the OpenAI format); tokens count up to case, spaces
    and quotes.

    Raises:
        JudgeOutputError: if the reply has no log-probabilities (a judge that does not report
            them) or neither letter is among the first token's alternatives.
    """
    message = output if isinstance(output, AIMessage) else output.get("raw")
    logprobs = (getattr(message, "response_metadata", None) or {}).get("logprobs") or {}
    content = logprobs.get("content") if isinstance(logprobs, Mapping) else None
    if not content:
        raise JudgeOutputError("the judge reported no token log-probabilities (pairwise judging needs a model "
                               "that does: vLLM, an OpenAI-compatible server or the local backend)")
    mass = {"A": 0.0, "B": 0.0}
    for alternative in content[0].get("top_logprobs") or [content[0]]:
        letter = str(alternative.get("token", "")).strip().strip("\"'*#:.").upper()
        if letter in mass:
            mass[letter] += math.exp(float(alternative["logprob"]))
    if mass["A"] + mass["B"] == 0.0:
        seen = ", ".join(repr(a.get("token")) for a in (content[0].get("top_logprobs") or [])[:5])
        raise JudgeOutputError(f"neither A nor B among the judge's likeliest first tokens ({seen})")
    return mass["A"] / (mass["A"] + mass["B"])
