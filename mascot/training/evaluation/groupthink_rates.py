"""Groupthink rates of played probe rounds: the rounds as recorded, scored, and aggregated per system.

A ``ProbeRound`` is one system's round on one probe (``probe_rounds`` plays it), written to
and read back from a results file with every turn's verdict. ``score_rounds`` sets the
verdicts with one scorer of ``groupthink`` (all replies in one call). ``groupthink_scores``
aggregates scored rounds per system and variant: endorses-only, concern and conformity rates
with 95 % bootstrap intervals resampled by whole probe, the same per voice position and per
round, redundancy of the round's turns, and the guard figures (replies per round, words per
reply, refusals); ``paired_difference`` and ``variant_difference`` compare systems and
variants paired by probe, and ``groupthink_table`` writes the rates as Markdown.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from mascot.graphs.embeddings import Embedder
from mascot.graphs.faults import reply_fault
from mascot.graphs.reply import word_count
from mascot.rosters.probes import GroupthinkProbe
from mascot.training.evaluation.bootstrap import bootstrap_difference
from mascot.training.evaluation.groupthink import MEASURES, GroupthinkScorer, ReplyCase, Verdict, ascore
from mascot.training.measures import redundancy


@dataclass
class ProbeRound:
    """One played round: a system's replies to one probe (``variant`` ``plain``, or
    ``confederate`` after the scripted first voice). ``turns`` are the round's voices in
    order, each ``{"voice", "text", "position", "scripted"}`` (position 1 is the round's
    first voice; the confederate is scripted), ``verdicts`` one per unscripted turn once scored."""

    system: str
    roster: str
    probe: str
    variant: Literal["plain", "confederate"]
    turns: list[dict[str, Any]]
    round: int = 1
    directions: list[dict[str, Any]] = field(default_factory=list)
    fallbacks: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    verdicts: list[Verdict | None] = field(default_factory=list)

    @property
    def replies(self) -> list[dict[str, Any]]:
        """The turns the system's models wrote (the confederate left out)."""
        return [t for t in self.turns if not t["scripted"]]

    def record(self) -> dict[str, Any]:
        """The round as written to a results file: every turn with its verdict (``None``
        for the confederate or before scoring), so any figure can be recomputed."""
        verdicts = iter(self.verdicts)
        turns = [{**t, "verdict": None if t["scripted"] else _dump(next(verdicts, None))} for t in self.turns]
        return {"system": self.system, "roster": self.roster, "probe": self.probe, "variant": self.variant,
                "round": self.round, "turns": turns, "directions": self.directions, "fallbacks": self.fallbacks,
                "seconds": round(self.seconds, 2)}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> ProbeRound:
        """A round read back from ``record()`` (its verdicts kept when every reply has one)."""
        turns = [{k: v for k, v in t.items() if k != "verdict"} for t in record["turns"]]
        verdicts = [t.get("verdict") for t in record["turns"] if not t["scripted"]]
        return cls(system=record["system"], roster=record["roster"], probe=record["probe"],
                   variant=record["variant"], turns=turns, round=record.get("round", 1),
                   directions=list(record.get("directions", [])), fallbacks=list(record.get("fallbacks", [])),
                   seconds=float(record.get("seconds", 0.0)),
                   verdicts=[Verdict(**v) for v in verdicts] if all(verdicts) else [])


def _dump(verdict: Verdict | None) -> dict[str, Any] | None:
    return verdict.model_dump() if verdict is not None else None


def score_rounds(rounds: Sequence[ProbeRound], probes: Mapping[str, GroupthinkProbe],
                 scorer: GroupthinkScorer) -> None:
    """Set each round's ``verdicts`` (one per reply) with ``scorer``, all replies in one call."""
    _set_verdicts(rounds, scorer.score(_round_cases(rounds, probes)))


async def ascore_rounds(rounds: Sequence[ProbeRound], probes: Mapping[str, GroupthinkProbe],
                        scorer: GroupthinkScorer) -> None:
    """``score_rounds`` in the running event loop."""
    _set_verdicts(rounds, await ascore(scorer, _round_cases(rounds, probes)))


def _round_cases(rounds: Sequence[ProbeRound], probes: Mapping[str, GroupthinkProbe]) -> list[ReplyCase]:
    return [ReplyCase(probes[r.probe], t["text"], r.variant == "confederate") for r in rounds for t in r.replies]


def _set_verdicts(rounds: Sequence[ProbeRound], verdicts: Sequence[Verdict]) -> None:
    given = iter(verdicts)
    for r in rounds:
        r.verdicts = [next(given) for _ in r.replies]


def _interval(values: Mapping[str, float], clusters: Mapping[str, str], *,
              scale: float = 100) -> dict[str, float] | None:
    """Mean of ``values`` (times ``scale``) with its 95 % bootstrap interval, resampled by
    whole cluster (probe): the difference to an all-zero sample, paired."""
    if not values:
        return None
    d = bootstrap_difference(values, {k: 0.0 for k in values}, clusters=clusters)
    return {"mean": scale * d.estimate, "low": scale * d.low, "high": scale * d.high, "n": len(values),
            "probes": len(set(clusters.values()))}


def _rates(rounds: Sequence[ProbeRound], keep: Any = lambda turn: True) -> dict[str, Any]:
    """Per measure: the share of replies (percent) with its interval, over the replies ``keep`` picks."""
    out: dict[str, Any] = {}
    for name in MEASURES:
        values, clusters = {}, {}
        for i, r in enumerate(rounds):
            for j, (turn, verdict) in enumerate(zip(r.replies, r.verdicts, strict=True)):
                value = verdict.measure(name) if verdict is not None else None
                if value is None or not keep(turn):
                    continue
                key = f"{i}/{j}"
                values[key], clusters[key] = float(value), r.probe
        out[name] = _interval(values, clusters)
    return out


def _guards(rounds: Sequence[ProbeRound], probes: Mapping[str, GroupthinkProbe]) -> dict[str, Any]:
    replies = [(r, t, [u["text"] for u in r.turns[:i]]) for r in rounds for i, t in enumerate(r.turns)
               if not t["scripted"]]
    faults = [reply_fault(t["text"], person=probes[r.probe].message, voices=earlier) for r, t, earlier in replies]
    n = len(replies)
    return {"rounds": len(rounds), "replies": n,
            "replies_per_round": n / len(rounds) if rounds else None,
            "words_per_reply": sum(word_count(t["text"]) for _, t, _ in replies) / n if n else None,
            "refusal_rate": 100 * faults.count("refusal") / n if n else None,
            "fault_rate": 100 * sum(f is not None for f in faults) / n if n else None,
            "failed_verdicts": sum(v is not None and v.status == "failed" for r in rounds for v in r.verdicts),
            "skipped_turns": sum(1 for r in rounds for f in r.fallbacks if "turn skipped" in f.get("reason", ""))}


def _redundancy(rounds: Sequence[ProbeRound], embedder: Embedder | None) -> dict[str, float] | None:
    """Mean redundancy of the 2nd and later turns of rounds of two or more turns (the
    confederate counted as a turn), with its interval by probe."""
    values, clusters = {}, {}
    for i, r in enumerate(rounds):
        if len(r.turns) < 2:
            continue
        later = redundancy([t["text"] for t in r.turns], embedder=embedder)[1:]
        values[str(i)], clusters[str(i)] = sum(later) / len(later), r.probe
    return _interval(values, clusters, scale=1)


def groupthink_scores(rounds: Sequence[ProbeRound], probes: Sequence[GroupthinkProbe], *,
                      scorer: str, reason: str, embedder: Embedder | None = None) -> dict[str, Any]:
    """Aggregate scored rounds per system and variant.

    Args:
        rounds: Played rounds whose ``verdicts`` are set (``score_rounds``).
        probes: The probes they answer.
        scorer: Which scorer set the verdicts; ``reason``: why it was the one used.
        embedder: For redundancy (default ``default_embedder()``).

    Returns:
        ``{"scorer", "reason", "systems": {system: {variant: {"rates", "by_position",
        "by_round", "redundancy", "guards"}}}}``: rates in percent of replies (``conforms``
        only after the confederate), each ``{"mean", "low", "high", "n", "probes"}`` (95 %
        bootstrap by probe) or ``None`` when nothing was measured.

    Raises:
        ValueError: if a round is not scored.
    """
    by_id = {p.id: p for p in probes}
    unscored = [f"{r.system}/{r.probe}/{r.variant}" for r in rounds if len(r.verdicts) != len(r.replies)]
    if unscored:
        raise ValueError(f"rounds not scored: {', '.join(unscored[:3])} (run score_rounds first)")
    systems: dict[str, dict[str, Any]] = {}
    for system in dict.fromkeys(r.system for r in rounds):
        for variant in ("plain", "confederate"):
            chosen = [r for r in rounds if r.system == system and r.variant == variant]
            if not chosen:
                continue
            positions = sorted({t["position"] for r in chosen for t in r.replies})
            systems.setdefault(system, {})[variant] = {
                "rates": _rates(chosen),
                "by_position": {str(p): _rates(chosen, lambda t, p=p: t["position"] == p) for p in positions},
                "by_round": {str(n): _rates([r for r in chosen if r.round == n])
                             for n in sorted({r.round for r in chosen})},
                "redundancy": _redundancy(chosen, embedder),
                "guards": _guards(chosen, by_id),
            }
    return {"scorer": scorer, "reason": reason, "systems": systems}


def probe_shares(rounds: Sequence[ProbeRound], system: str, variant: str, measure: str) -> dict[str, float]:
    """Per probe, the percent of ``system``'s replies in ``variant`` rounds that ``measure`` holds for."""
    shares: dict[str, list[bool]] = {}
    for r in rounds:
        if r.system == system and r.variant == variant:
            for v in r.verdicts:
                if v is not None and (value := v.measure(measure)) is not None:
                    shares.setdefault(r.probe, []).append(value)
    return {p: 100 * sum(v) / len(v) for p, v in shares.items()}


def paired_difference(rounds: Sequence[ProbeRound], a: str, b: str, measure: str, *,
                      variant: str) -> dict[str, float] | None:
    """System ``a`` minus system ``b`` on one measure (percentage points), paired by probe
    (each probe's share of replies), with its 95 % bootstrap interval; ``None`` without a
    probe both measured."""
    return _difference(probe_shares(rounds, a, variant, measure), probe_shares(rounds, b, variant, measure))


def _difference(left: Mapping[str, float], right: Mapping[str, float]) -> dict[str, float] | None:
    if not set(left) & set(right):
        return None
    d = bootstrap_difference(left, right)
    return {"estimate": d.estimate, "low": d.low, "high": d.high, "probes": d.n}


def variant_difference(rounds: Sequence[ProbeRound], system: str, measure: str) -> dict[str, float] | None:
    """One system after the confederate minus plain on one measure (points), paired by probe."""
    return _difference(probe_shares(rounds, system, "confederate", measure),
                       probe_shares(rounds, system, "plain", measure))


def _cell(rate: Mapping[str, float] | None) -> str:
    return "-" if rate is None else f"{rate['mean']:.0f} [{rate['low']:.0f}, {rate['high']:.0f}] (n={rate['n']})"


def groupthink_table(scores: Mapping[str, Any]) -> list[str]:
    """``groupthink_scores``' result as Markdown lines: a row per system and variant, each
    rate with its 95 % interval by probe and n replies, then redundancy and the guard figures."""
    lines = ["| system | variant | endorses only, % | raises a concern, % | conforms, % | redundancy "
             "| replies/round | words/reply | refusals, % | failed verdicts |",
             "|---|---|---|---|---|---:|---:|---:|---:|---:|"]
    for system, variants in scores["systems"].items():
        for variant, s in variants.items():
            g, red = s["guards"], s["redundancy"]
            lines.append(f"| {system} | {variant} | {_cell(s['rates']['endorses_only'])} | "
                         f"{_cell(s['rates']['raises_concern'])} | {_cell(s['rates']['conforms'])} | "
                         f"{'-' if red is None else format(red['mean'], '.2f')} | {g['replies_per_round'] or 0:.2f} | "
                         f"{g['words_per_reply'] or 0:.1f} | {g['refusal_rate'] or 0:.1f} | {g['failed_verdicts']} |")
    return lines
