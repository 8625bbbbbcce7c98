"""An independent check of the guard figures the learning run commits (``docs/learning``).

``bench/learning.py`` writes ``results.json`` (``comparisons[metric][system]``: the mean over
held-out episodes of each per-episode guard figure, and ``targets``: the issue's targets with
``met``) and the raw held-out episodes (``episodes/<system>.jsonl``, one Episode JSON object a
line). This script recomputes, from the episode files alone, the guard figures those numbers
and targets rest on, and says where the committed figures and the recomputed ones part:

- ``voices_per_round``: persona turns per round (a round: the persona turns after a person's
  message; turns before the first message form a round of their own; rounds without a
  persona turn are left out);
- ``multi_voice_rounds``: percent of those rounds with two or more persona turns;
- ``reply_words``: words per persona turn (a word: a run of ASCII letters, digits and
  apostrophes, as ``mascot.graphs.reply.word_count`` counts them);
- ``refusal_rate``: percent of persona turns that refuse or talk as an assistant;
- ``action_refusals``: the same for the actions of the directions of persona turns;
- ``copied_actions``: percent of those directions whose action repeats ``COPY_RUN``
  consecutive words (case and punctuation aside) of what the Director read: the roster's
  director guidance, each voice as ``"id: Name, the role"`` and every earlier non-system
  message of the episode;
- ``short_tones``: percent of those directions whose tone has 1 to ``TONE_MAX`` words;
- ``first_offered``: percent of the directions offered two or more voices besides the
  hand-back (``offered``) that name the voice offered first;
- ``offered_voices``: voices (besides the hand-back) offered per such direction.

A figure is ``None`` for an episode with nothing to measure and is left out of the mean, as in
``mascot.training.evaluation.guards``. The targets that depend only on these figures are
evaluated again from the recomputed means and set beside the committed ``met``.

Why it is independent: it reads the JSONL with ``json`` (not the Episode class) and computes
every figure with its own code here: it imports neither ``mascot.training.evaluation`` nor
``mascot.graphs.reply``/``faults``; only the roster is loaded with ``mascot.rosters``.
Refusals and assistant talk are found by this file's own phrase patterns, written from the
description of ``faults`` and not copied from it, so a disagreement on that row shows
where the two detectors differ; the other definitions follow ``guards.py``.

    python bench/learning_check.py [DOCS_DIR] [--tolerance POINTS] [--json OUT]

Exit status: 0 when every recomputed figure is within the tolerance of the committed one and
every re-evaluated target agrees with its committed ``met``; 1 otherwise; 2 when a file is
missing or malformed (one line on stderr). A figure or target the committed results lack is
printed as "not reported" and does not count as a disagreement.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mascot.rosters import RosterError, load_roster

#: Figures recomputed, in print order, with their unit.
METRICS: dict[str, str] = {
    "multi_voice_rounds": "% of rounds with two or more persona turns",
    "voices_per_round": "persona turns per round",
    "reply_words": "words per persona turn",
    "refusal_rate": "% of persona turns that refuse or talk as an assistant",
    "action_refusals": "% of directions whose action refuses or talks as an assistant",
    "copied_actions": "% of directions whose action copies 6 words the Director read",
    "short_tones": "% of directions whose tone has 1-6 words",
    "first_offered": "% of directions (2+ voices offered) naming the first voice offered",
    "offered_voices": "voices offered per such direction",
}
#: Systems in print order; any other episode file of DOCS_DIR/episodes follows, by name.
SYSTEM_ORDER = ("trained", "sft", "untrained", "round_robin")
#: The hand-back to the person in a direction's ``speaker``/``offered``.
USER = "user"
#: Speakers measured besides the roster's personas: the evaluation measures the zero-shot
#: baseline's generic assistant like a persona (``comparison._with_assistant``).
EXTRA_SPEAKERS = ("assistant",)
#: Consecutive words an action may share with what the Director read before it is a copy.
COPY_RUN = 6
#: Most words a tone may have and still count as a tone.
TONE_MAX = 6
#: Keys of a ``comparisons`` row that are not systems.
_NOT_SYSTEMS = {"diff", "diff_ci95", "n_pairs", "n_clusters", "lower_is_better", "guard", "points"}

_WORD = re.compile(r"[A-Za-z0-9']+")
_APOSTROPHES = str.maketrans({"\u2019": "'", "\u2018": "'", "\u02bc": "'"})
# a refusal opens the text: an optional apology, then "I can't / am unable to ... <help verb>"
_REFUSAL_OPENING = re.compile(
    r"^[\W_]*"
    r"(?:(?:(?:i'm|im|i am)\s+(?:so\s+|very\s+|really\s+|truly\s+)?sorry|sorry|i\s+apologi[sz]e|unfortunately|"
    r"regrettably)[\s,.;:!-]*(?:but\s+)?)?"
    r"(?:i|we)\s*(?:can't|cant|cannot|can\s+not|(?:am|'m)\s+(?:unable|not\s+able|not\s+allowed)\s+to|"
    r"won't\s+be\s+able\s+to|will\s+not\s+be\s+able\s+to|must\s+decline\s+to|(?:have|'ve)\s+to\s+decline\s+to)\s+"
    r"(?:assist|help|provide|comply|fulfil|engage|discuss|participate|continue|do\s+(?:that|this)|respond|answer)",
    re.IGNORECASE,
)
# "I can't help feeling ...", "I can't help but ...": not a refusal
_NOT_A_REFUSAL = re.compile(r"^\s+(?:but|feeling|thinking|wondering|noticing)\b", re.IGNORECASE)
# "..., but here is what you can do": a limit stated before an answer, in the refusal's sentence
_THEN_ANSWERS = re.compile(r"^[^.!?]*\bbut\s+(?!i\b)\w", re.IGNORECASE)
#: Words after the refusal up to which a "but" does not save it ("but a professional can").
_REFUSAL_TAIL = 8
# assistant talk anywhere in the text
_ASSISTANT_TALK = re.compile(
    r"\bas an?\s+(?:ai|artificial intelligence|(?:ai\s+)?language model|(?:helpful\s+|virtual\s+|ai\s+)*assistant)\b"
    r"|\bi(?:'m|\s+am)\s+(?:just\s+|only\s+)?an?\s+(?:ai|artificial intelligence|(?:ai\s+)?language model|"
    r"(?:virtual\s+|ai\s+)?assistant)\b"
    r"|\bhow\s+(?:can|may)\s+i\s+assist\s+you\b"
    r"|\banything\s+else\s+i\s+(?:can|could|may)\s+(?:help|assist)\s+you\s+with\b",
    re.IGNORECASE,
)


class CheckError(Exception):
    """A missing or malformed input; the message is one line."""


@dataclass
class Row:
    """One figure of one system: committed, recomputed and whether they agree."""

    metric: str
    system: str
    reported: float | None
    recomputed: float | None
    in_results: bool
    ok: bool = True

    @property
    def diff(self) -> float | None:
        """Recomputed minus reported, where both exist."""
        if self.reported is None or self.recomputed is None:
            return None
        return self.recomputed - self.reported


@dataclass
class Target:
    """One issue target re-evaluated from the recomputed figures."""

    name: str
    met: bool
    measured: dict[str, float | None]
    reported_met: bool | None  # None: the committed results do not have this target
    ok: bool = True


@dataclass
class Check:
    """Everything the check found."""

    docs: Path
    tolerance: float
    episodes: dict[str, int] = field(default_factory=dict)
    reported_episodes: dict[str, int] = field(default_factory=dict)
    per_episode: dict[str, dict[str, dict[str, float]]] = field(default_factory=dict)
    means: dict[str, dict[str, float | None]] = field(default_factory=dict)
    rows: list[Row] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        """Every figure within tolerance, every target agreeing, every episode count equal."""
        return (all(r.ok for r in self.rows) and all(t.ok for t in self.targets)
                and all(self.episodes.get(s) == n for s, n in self.reported_episodes.items()))


# --- words, copies, refusals -------------------------------------------------------------

def words(text: str) -> list[str]:
    """The words of ``text``, lowercased: runs of ASCII letters, digits and apostrophes."""
    return [w.lower() for w in _WORD.findall(text)]


def copies_run(text: str, sources: Iterable[str], run: int = COPY_RUN) -> bool:
    """Whether ``text`` shares ``run`` consecutive words with one of ``sources``."""
    mine = words(text)
    grams = {tuple(mine[i:i + run]) for i in range(len(mine) - run + 1)}
    if not grams:
        return False
    for source in sources:
        theirs = words(source)
        if any(tuple(theirs[i:i + run]) in grams for i in range(len(theirs) - run + 1)):
            return True
    return False


def refuses(text: str) -> bool:
    """Whether ``text`` declines to answer or talks as an assistant (this file's own patterns)."""
    text = text.translate(_APOSTROPHES).strip()
    if not text:
        return False
    if _ASSISTANT_TALK.search(text):
        return True
    opening = _REFUSAL_OPENING.search(text)
    if opening is None:
        return False
    rest = text[opening.end():]
    if _NOT_A_REFUSAL.match(rest):
        return False
    return len(words(rest)) <= _REFUSAL_TAIL or not _THEN_ANSWERS.match(rest)


# --- reading -----------------------------------------------------------------------------

def _text(value: Any) -> str:
    """A field as text: a string as it is, anything else (a missing field) as ""."""
    return value if isinstance(value, str) else ""


def read_json(path: Path) -> dict[str, Any]:
    """A JSON object from ``path``; ``CheckError`` when missing or malformed."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise CheckError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckError(f"{path}: unreadable ({exc})") from None
    except json.JSONDecodeError as exc:
        raise CheckError(f"{path}: not JSON (line {exc.lineno}: {exc.msg})") from None
    if not isinstance(data, dict):
        raise CheckError(f"{path}: not a JSON object")
    return data


def _check_episode(record: Any, where: str) -> dict[str, Any]:
    """``record`` if it has what the figures read, else ``CheckError`` naming ``where``."""
    if not isinstance(record, dict):
        raise CheckError(f"{where}: not a JSON object")
    for key in ("id", "roster"):
        if not isinstance(record.get(key), str) or not record[key]:
            raise CheckError(f"{where}: no '{key}' string")
    messages = record.get("messages")
    if not isinstance(messages, list):
        raise CheckError(f"{where}: no 'messages' list")
    for number, message in enumerate(messages):
        if not isinstance(message, dict):
            raise CheckError(f"{where}: message {number} is not an object")
        if message.get("role") not in ("system", "user", "assistant"):
            raise CheckError(f"{where}: message {number} has role {message.get('role')!r}")
        if not isinstance(message.get("content"), str):
            raise CheckError(f"{where}: message {number} has no 'content' string")
        direction = message.get("stage_direction")
        if direction is not None and not isinstance(direction, dict):
            raise CheckError(f"{where}: message {number}'s stage_direction is not an object")
        offered = (direction or {}).get("offered")
        if offered is not None and not (isinstance(offered, list) and all(isinstance(v, str) for v in offered)):
            raise CheckError(f"{where}: message {number}'s offered is not a list of ids")
    return record


def read_episodes(path: Path) -> list[dict[str, Any]]:
    """The episode records of a JSONL file (blank lines skipped); ``CheckError`` when missing
    or when a line is not an episode."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except FileNotFoundError:
        raise CheckError(f"{path}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CheckError(f"{path}: unreadable ({exc})") from None
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise CheckError(f"{path}:{number}: not JSON ({exc.msg})") from None
        records.append(_check_episode(record, f"{path}:{number}"))
    return records


@dataclass(frozen=True)
class Shown:
    """What a roster shows: the ids whose turns are measured and the roster text the
    Director read (guidance and one line per voice)."""

    speakers: frozenset[str]
    text: tuple[str, ...]


def roster_view(roster_id: str, cache: dict[str, Shown]) -> Shown:
    """The measured speakers and the Director's roster text of ``roster_id`` (cached)."""
    if roster_id not in cache:
        try:
            roster = load_roster(roster_id)
        except RosterError as exc:
            raise CheckError(f"roster {roster_id!r}: {' '.join(str(exc).split())}") from None
        lines = [roster.director.guidance, *(f"{p.id}: {p.name}, the {p.role}" for p in roster.personas)]
        cache[roster_id] = Shown(frozenset([*roster.persona_ids, *EXTRA_SPEAKERS]), tuple(lines))
    return cache[roster_id]


# --- the figures -------------------------------------------------------------------------

def _percent(hits: int, total: int) -> float | None:
    return 100.0 * hits / total if total else None


def _mean(values: Sequence[float]) -> float | None:
    return sum(values) / len(values) if values else None


def episode_figures(record: dict[str, Any], shown: Shown) -> dict[str, float | None]:
    """The guard figures of one episode record (``None``: nothing to measure)."""
    rounds: list[list[str]] = []
    directions: list[dict[str, Any]] = []
    copied = 0
    read: list[str] = []  # the earlier non-system messages
    for message in record["messages"]:
        role, content = message["role"], message["content"]
        if role == "user":
            rounds.append([])
        elif role == "assistant" and message.get("name") in shown.speakers:
            if not rounds:
                rounds.append([])
            rounds[-1].append(content)
            direction = message.get("stage_direction")
            if direction:
                directions.append(direction)
                copied += copies_run(_text(direction.get("action")), [*shown.text, *read])
        if role != "system":
            read.append(content)
    spoken = [r for r in rounds if r]
    turns = [t for r in spoken for t in r]
    with_choice = []  # (speaker, voices offered in order) where two or more voices were offered
    for direction in directions:
        voices = [v for v in direction.get("offered") or [] if v != USER]
        if len(voices) >= 2:
            with_choice.append((direction.get("speaker"), voices))
    return {
        "multi_voice_rounds": _percent(sum(len(r) >= 2 for r in spoken), len(spoken)),
        "voices_per_round": _mean([len(r) for r in spoken]),
        "reply_words": _mean([len(words(t)) for t in turns]),
        "refusal_rate": _percent(sum(map(refuses, turns)), len(turns)),
        "action_refusals": _percent(sum(refuses(_text(d.get("action"))) for d in directions), len(directions)),
        "copied_actions": _percent(copied, len(directions)),
        "short_tones": _percent(sum(1 <= len(words(_text(d.get("tone")))) <= TONE_MAX for d in directions),
                                len(directions)),
        "first_offered": _percent(sum(speaker == voices[0] for speaker, voices in with_choice), len(with_choice)),
        "offered_voices": _mean([len(voices) for _, voices in with_choice]),
    }


# --- the check ---------------------------------------------------------------------------

def systems_of(docs: Path, results: dict[str, Any]) -> list[str]:
    """The systems to check: every episode file, and every system the results name (whose
    file must then exist), in ``SYSTEM_ORDER`` then by name."""
    found = {p.stem for p in (docs / "episodes").glob("*.jsonl")}
    named = results.get("systems") or list(results.get("episodes_per_system") or {})
    if not isinstance(named, list) or not all(isinstance(s, str) for s in named):
        raise CheckError(f"{docs / 'results.json'}: 'systems' is not a list of names")
    for system in [*named, "trained", "untrained"]:
        if system not in found:
            raise CheckError(f"{docs / 'episodes' / (system + '.jsonl')}: missing")
    order = {s: i for i, s in enumerate(SYSTEM_ORDER)}
    return sorted(found, key=lambda s: (order.get(s, len(order)), s))


def reported_value(results: dict[str, Any], metric: str, system: str) -> tuple[bool, float | None]:
    """Whether ``comparisons[metric]`` exists and its value for ``system``."""
    comparisons = results.get("comparisons") or {}
    if not isinstance(comparisons, dict):
        raise CheckError("results.json: 'comparisons' is not an object")
    row = comparisons.get(metric)
    if row is None:
        return False, None
    if not isinstance(row, dict):
        raise CheckError(f"results.json: comparisons[{metric!r}] is not an object")
    value = row.get(system)
    if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise CheckError(f"results.json: comparisons[{metric!r}][{system!r}] is not a number")
    return True, value


def _targets(means: dict[str, dict[str, float | None]]) -> list[tuple[str, Callable[[], bool], dict[str, Any]]]:
    """The targets that rest on these figures: name, test, and the figures it reads."""
    def t(metric: str) -> float | None:
        return means.get("trained", {}).get(metric)

    def u(metric: str) -> float | None:
        return means.get("untrained", {}).get(metric)

    k = t("offered_voices")
    bound = 100 / k + 10 if k else None
    return [
        ("reply_refusals_at_most_2pct_not_above_untrained",
         lambda: t("refusal_rate") <= 2 and t("refusal_rate") <= u("refusal_rate"),
         {"trained": t("refusal_rate"), "untrained": u("refusal_rate")}),
        ("action_refusals_at_most_2pct_not_above_untrained",
         lambda: t("action_refusals") <= 2 and t("action_refusals") <= u("action_refusals"),
         {"trained": t("action_refusals"), "untrained": u("action_refusals")}),
        ("copied_actions_at_most_10pct", lambda: t("copied_actions") <= 10,
         {"trained": t("copied_actions")}),
        ("short_tones_at_least_95pct", lambda: t("short_tones") >= 95, {"trained": t("short_tones")}),
        ("multi_voice_rounds_at_least_60pct_not_fewer",
         lambda: t("multi_voice_rounds") >= 60 and t("multi_voice_rounds") >= u("multi_voice_rounds"),
         {"trained": t("multi_voice_rounds"), "untrained": u("multi_voice_rounds")}),
        ("first_offered_at_most_100_over_k_plus_10", lambda: t("first_offered") <= bound,
         {"trained": t("first_offered"), "bound": bound, "voices_offered": k}),
    ]


def check(docs: Path, tolerance: float) -> Check:
    """Recompute every figure from ``docs/episodes`` and set it beside ``docs/results.json``."""
    results = read_json(docs / "results.json")
    result = Check(docs=docs, tolerance=tolerance)
    counts = results.get("episodes_per_system") or {}
    if not isinstance(counts, dict) or not all(isinstance(n, int) for n in counts.values()):
        raise CheckError(f"{docs / 'results.json'}: 'episodes_per_system' is not an object of counts")
    rosters: dict[str, Shown] = {}
    for system in systems_of(docs, results):
        values: dict[str, dict[str, float]] = {m: {} for m in METRICS}
        records = read_episodes(docs / "episodes" / f"{system}.jsonl")
        for record in records:
            for metric, value in episode_figures(record, roster_view(record["roster"], rosters)).items():
                if value is not None:
                    values[metric][record["id"]] = value
        result.episodes[system] = len(records)
        if system in counts:
            result.reported_episodes[system] = counts[system]
        result.per_episode[system] = values
        result.means[system] = {m: _mean(list(v.values())) for m, v in values.items()}
    for metric in METRICS:
        for system, means in result.means.items():
            present, reported = reported_value(results, metric, system)
            row = Row(metric, system, reported, means[metric], present)
            if present:
                row.ok = (reported is None and row.recomputed is None) or (
                    row.diff is not None and abs(row.diff) <= tolerance)
            result.rows.append(row)
    committed = results.get("targets") or {}
    if not isinstance(committed, dict):
        raise CheckError(f"{docs / 'results.json'}: 'targets' is not an object")
    for name, test, measured in _targets(result.means):
        met = all(v is not None for v in measured.values()) and bool(test())
        entry = committed.get(name)
        if entry is not None and not (isinstance(entry, dict) and isinstance(entry.get("met"), bool)):
            raise CheckError(f"{docs / 'results.json'}: targets[{name!r}] has no boolean 'met'")
        reported_met = entry["met"] if entry is not None else None
        result.targets.append(Target(name, met, measured, reported_met,
                                     ok=reported_met is None or reported_met == met))
    return result


# --- output ------------------------------------------------------------------------------

def _number(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def report(result: Check) -> list[str]:
    """The check as plain-text tables, ending with the one-line summary."""
    lines = [f"learning_check: {result.docs} (tolerance {result.tolerance:g})", ""]
    lines.append("episodes: " + ", ".join(
        f"{s} {n}" + (f" (results.json says {result.reported_episodes[s]})"
                      if s in result.reported_episodes and result.reported_episodes[s] != n else "")
        for s, n in result.episodes.items()))
    for metric, unit in METRICS.items():
        lines += ["", f"{metric} ({unit})",
                  f"  {'system':<14}{'reported':>14}{'recomputed':>12}{'diff':>9}"]
        for row in (r for r in result.rows if r.metric == metric):
            reported = _number(row.reported) if row.in_results else "not reported"
            flag = "" if row.ok else f"   <-- differs by more than {result.tolerance:g}"
            lines.append(f"  {row.system:<14}{reported:>14}{_number(row.recomputed):>12}{_number(row.diff):>9}{flag}")
    lines += ["", "targets (re-evaluated from the recomputed figures)",
              f"  {'target':<50}{'reported':>14}{'recomputed':>12}  measured"]
    for target in result.targets:
        reported = "not reported" if target.reported_met is None else ("met" if target.reported_met else "not met")
        measured = ", ".join(f"{k} {_number(v)}" for k, v in target.measured.items())
        flag = "" if target.ok else "   <-- disagrees"
        lines.append(f"  {target.name:<50}{reported:>14}{'met' if target.met else 'not met':>12}  {measured}{flag}")
    lines += ["", summary(result)]
    return lines


def summary(result: Check) -> str:
    """One line: OK or FAIL, with what was compared and what disagreed."""
    compared = [r for r in result.rows if r.in_results]
    differ = [r for r in compared if not r.ok]
    judged = [t for t in result.targets if t.reported_met is not None]
    disagree = [t for t in judged if not t.ok]
    counts = [s for s, n in result.reported_episodes.items() if result.episodes.get(s) != n]
    unreported = len(result.rows) - len(compared) + len(result.targets) - len(judged)
    text = (f"{len(compared) - len(differ)}/{len(compared)} figures within {result.tolerance:g}, "
            f"{len(judged) - len(disagree)}/{len(judged)} targets agree, {unreported} not reported")
    if counts:
        text += f", episode counts differ for {', '.join(counts)}"
    if not compared and not judged:
        text += " (results.json has none of these figures or targets: nothing to compare)"
    return f"learning_check: {'OK' if result.ok else 'FAIL'}: {text}"


def as_json(result: Check) -> dict[str, Any]:
    """The recomputed figures (and how they compare) as a JSON object."""
    return {
        "docs": str(result.docs), "tolerance": result.tolerance, "ok": result.ok,
        "episodes": result.episodes, "means": result.means, "per_episode": result.per_episode,
        "comparisons": [{"metric": r.metric, "system": r.system, "reported": r.reported if r.in_results else None,
                         "reported_present": r.in_results, "recomputed": r.recomputed, "diff": r.diff, "ok": r.ok}
                        for r in result.rows],
        "targets": {t.name: {**t.measured, "met": t.met, "reported_met": t.reported_met, "ok": t.ok}
                    for t in result.targets},
    }


def main(argv: Sequence[str] | None = None) -> int:
    """Run the check; 0 agreed, 1 disagreed, 2 missing or malformed input."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("docs", nargs="?", default="docs/learning", help="the report folder (default docs/learning)")
    parser.add_argument("--tolerance", type=float, default=1.0,
                        help="largest difference accepted, in the figure's unit (default 1.0 point)")
    parser.add_argument("--json", metavar="OUT", help="write the recomputed figures to OUT")
    args = parser.parse_args(argv)
    if not args.tolerance >= 0:
        print(f"learning_check: error: --tolerance must be 0 or more, not {args.tolerance:g}", file=sys.stderr)
        return 2
    try:
        result = check(Path(args.docs), args.tolerance)
    except CheckError as exc:
        print(f"learning_check: error: {exc}", file=sys.stderr)
        return 2
    print("\n".join(report(result)))
    if args.json:
        try:
            Path(args.json).write_text(json.dumps(as_json(result), indent=1) + "\n", encoding="utf-8")
        except OSError as exc:
            print(f"learning_check: error: {args.json}: cannot write ({exc.strerror})", file=sys.stderr)
            return 2
    return 0 if result.ok else 1


if __name__ == "__main__":
    sys.exit(main())
