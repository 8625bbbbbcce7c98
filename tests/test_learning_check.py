"""bench/learning_check.py: guard figures recomputed from hand-made episodes with known values."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

import pytest

_PATH = Path(__file__).resolve().parent.parent / "bench" / "learning_check.py"
_SPEC = importlib.util.spec_from_file_location("learning_check", _PATH)
assert _SPEC is not None and _SPEC.loader is not None
lc = importlib.util.module_from_spec(_SPEC)
sys.modules["learning_check"] = lc  # dataclasses look their module up
_SPEC.loader.exec_module(lc)

ROSTER = "emotional_support"  # personas anchor, catalyst, beacon, action_guide


def _turn(name: str, content: str, direction: dict[str, Any] | None = None) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content, "name": name}
    if direction is not None:
        message["stage_direction"] = direction
    return message


def _user(content: str) -> dict[str, Any]:
    return {"role": "user", "content": content}


def _episode(id: str, messages: list[dict[str, Any]]) -> dict[str, Any]:
    return {"schema_version": 1, "id": id, "roster": ROSTER, "messages": messages,
            "source": {"kind": "rollout", "seed": 0, "repeat": 0}}


#: t1: rounds of 2 and 1 turns; words 10, 8, 10; one refusal; the third action copies six
#: words of the person's message; tones of 1, 3 and 10 words; offers of 3 and 2 voices (the
#: first voice named once), the third offered one voice only (not counted).
T1 = _episode("t1", [
    _user("I failed my driving test again and I feel like an idiot"),
    _turn("anchor", "That sounds really painful, and you are not an idiot.",
          {"speaker": "anchor", "action": "Validate the feeling first", "tone": "warm",
           "offered": ["catalyst", "anchor", "beacon", "user"]}),
    _turn("catalyst", "I'm sorry, but I can't assist with that.",
          {"speaker": "catalyst", "action": "Ask what went wrong on the test", "tone": "curious and gentle",
           "offered": ["catalyst", "beacon", "user"]}),
    _user("It was the parking part."),
    _turn("beacon", "Parking is learnable; many people pass on the next try.",
          {"speaker": "beacon", "action": "Say: I FAILED my driving-test again, gently",
           "tone": "This is a very long tone that reads like a sentence", "offered": ["beacon", "user"]}),
])
#: t2: a system message, one round of one 3-word turn whose action is assistant talk, a
#: 1-word tone, the first of two voices named; a closing message no voice answered.
T2 = _episode("t2", [
    {"role": "system", "content": "You play a group of voices."},
    _user("Hi"),
    _turn("anchor", "Hello there, welcome.",
          {"speaker": "anchor", "action": "As an AI language model, greet them", "tone": "friendly",
           "offered": ["anchor", "catalyst", "user"]}),
    _user("Thanks"),
])
#: u1: one round of three turns (3, 2 and 4 words), two directions without offers.
U1 = _episode("u1", [
    _user("I failed my driving test again"),
    _turn("anchor", "That is hard.", {"speaker": "anchor", "action": "validate", "tone": "warm"}),
    _turn("catalyst", "What happened?", {"speaker": "catalyst", "action": "ask", "tone": "calm"}),
    _turn("beacon", "You can try again."),
])
#: u2: a voice before any message (a round of its own, no direction); a turn by a name that
#: is no voice of the roster (not measured).
U2 = _episode("u2", [
    _turn("anchor", "Welcome."),
    _user("Hello"),
    _turn("narrator", "The room falls silent."),
])

TRAINED = {"multi_voice_rounds": 25.0, "voices_per_round": 1.25, "reply_words": (28 / 3 + 3) / 2,
           "refusal_rate": 100 / 6, "action_refusals": 50.0, "copied_actions": 100 / 6,
           "short_tones": (200 / 3 + 100) / 2, "first_offered": 75.0, "offered_voices": 2.25}
UNTRAINED = {"multi_voice_rounds": 50.0, "voices_per_round": 2.0, "reply_words": 2.0, "refusal_rate": 0.0,
             "action_refusals": 0.0, "copied_actions": 0.0, "short_tones": 100.0, "first_offered": None,
             "offered_voices": None}
#: What bench/learning.py's targets() says of these figures: none is met.
TARGETS = {"reply_refusals_at_most_2pct_not_above_untrained": False,
           "action_refusals_at_most_2pct_not_above_untrained": False, "copied_actions_at_most_10pct": False,
           "short_tones_at_least_95pct": False, "multi_voice_rounds_at_least_60pct_not_fewer": False,
           "first_offered_at_most_100_over_k_plus_10": False}


def _docs(tmp_path: Path, *, comparisons: dict[str, Any] | None = None,
          targets: dict[str, bool] | None = None) -> Path:
    """A report folder: the episodes above and a results.json (by default, agreeing)."""
    docs = tmp_path / "docs"
    (docs / "episodes").mkdir(parents=True)
    for system, episodes in (("trained", [T1, T2]), ("untrained", [U1, U2])):
        (docs / "episodes" / f"{system}.jsonl").write_text(
            "".join(json.dumps(e) + "\n" for e in episodes), encoding="utf-8")
    if comparisons is None:  # as results.json writes them: rounded here to 2 decimals, within tolerance
        comparisons = {m: {"trained": round(TRAINED[m], 2) if TRAINED[m] is not None else None,
                           "untrained": round(UNTRAINED[m], 2) if UNTRAINED[m] is not None else None,
                           "diff": None, "guard": True} for m in TRAINED if UNTRAINED[m] is not None}
    results = {"systems": ["untrained", "trained"], "episodes_per_system": {"untrained": 2, "trained": 2},
               "comparisons": comparisons,
               "targets": {name: {"met": met} for name, met in (TARGETS if targets is None else targets).items()}}
    (docs / "results.json").write_text(json.dumps(results), encoding="utf-8")
    return docs


def test_recomputed_figures(tmp_path: Path) -> None:
    result = lc.check(_docs(tmp_path), 1.0)
    assert result.episodes == {"trained": 2, "untrained": 2}
    for system, expected in (("trained", TRAINED), ("untrained", UNTRAINED)):
        for metric, value in expected.items():
            assert result.means[system][metric] == pytest.approx(value), (system, metric)
    t1 = {m: v["t1"] for m, v in result.per_episode["trained"].items()}
    assert t1 == pytest.approx({"multi_voice_rounds": 50.0, "voices_per_round": 1.5, "reply_words": 28 / 3,
                                "refusal_rate": 100 / 3, "action_refusals": 0.0, "copied_actions": 100 / 3,
                                "short_tones": 200 / 3, "first_offered": 50.0, "offered_voices": 2.5})
    # u2 has no direction: no value for the direction figures, left out of the mean
    assert "u2" in result.per_episode["untrained"]["multi_voice_rounds"]
    assert "u2" not in result.per_episode["untrained"]["short_tones"]
    assert all(not t.met for t in result.targets) and all(t.ok for t in result.targets)


def test_agreement_exits_0(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "figures.json"
    assert lc.main([str(_docs(tmp_path)), "--json", str(out)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1].startswith("learning_check: OK: 14/14 figures within 1, 6/6 targets agree")
    written = json.loads(out.read_text(encoding="utf-8"))
    assert written["ok"] is True
    assert written["means"]["trained"]["first_offered"] == pytest.approx(75.0)


def test_planted_figure_disagreement_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(tmp_path)
    results = json.loads((docs / "results.json").read_text(encoding="utf-8"))
    results["comparisons"]["refusal_rate"]["trained"] = 14.0  # recomputed 16.67
    (docs / "results.json").write_text(json.dumps(results), encoding="utf-8")
    assert lc.main([str(docs)]) == 1
    out = capsys.readouterr().out
    assert "differs by more than 1" in out
    assert out.strip().splitlines()[-1].startswith("learning_check: FAIL: 13/14 figures")
    assert lc.main([str(docs), "--tolerance", "3"]) == 0


def test_planted_target_disagreement_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(tmp_path, targets={**TARGETS, "copied_actions_at_most_10pct": True})
    assert lc.main([str(docs)]) == 1
    out = capsys.readouterr().out
    assert "<-- disagrees" in out
    assert "5/6 targets agree" in out.strip().splitlines()[-1]


def test_figures_missing_from_results_are_not_reported(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    docs = _docs(tmp_path, comparisons={}, targets={})
    assert lc.main([str(docs)]) == 0
    out = capsys.readouterr().out
    assert "not reported" in out
    assert "nothing to compare" in out.strip().splitlines()[-1]


def test_a_reported_figure_with_nothing_recomputed_differs(tmp_path: Path) -> None:
    comparisons = {"first_offered": {"trained": 75.0, "untrained": 40.0}}  # the untrained offered no choice
    result = lc.check(_docs(tmp_path, comparisons=comparisons), 1.0)
    rows = {(r.metric, r.system): r for r in result.rows}
    assert rows["first_offered", "trained"].ok and not rows["first_offered", "untrained"].ok
    assert not result.ok


@pytest.mark.parametrize("damage", ["missing_episodes", "missing_results", "bad_line", "bad_message"])
def test_missing_or_malformed_file_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                               damage: str) -> None:
    docs = _docs(tmp_path)
    if damage == "missing_episodes":
        (docs / "episodes" / "untrained.jsonl").unlink()
    elif damage == "missing_results":
        (docs / "results.json").unlink()
    elif damage == "bad_line":
        with (docs / "episodes" / "trained.jsonl").open("a", encoding="utf-8") as f:
            f.write("{not json\n")
    else:
        broken = {**U1, "messages": [{"role": "assistant", "name": "anchor"}]}
        (docs / "episodes" / "untrained.jsonl").write_text(json.dumps(broken) + "\n", encoding="utf-8")
    assert lc.main([str(docs)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert len(captured.err.strip().splitlines()) == 1
    assert captured.err.startswith("learning_check: error: ")
    assert "Traceback" not in captured.err


@pytest.mark.parametrize(("text", "refused"), [
    ("I'm sorry, but I can't assist with that.", True),
    ("I apologize, but I cannot help with that request.", True),
    ("I\u2019m sorry, but I can\u2019t provide that.", True),
    ("How can I assist you today?", True),
    ("As an AI, I do not have feelings.", True),
    ("I can't help feeling you were braver than you think.", False),
    ("I can't decide this for you, but here is a first step you could take this week.", False),
    ("How can I help?", False),
    ("", False),
])
def test_refusal_detector(text: str, refused: bool) -> None:
    assert lc.refuses(text) is refused


def test_copies_six_words_in_a_row() -> None:
    source = "I failed my driving test again and I feel like an idiot"
    assert lc.copies_run("so: I FAILED my driving-test again!", [source])
    assert not lc.copies_run("I failed my driving test", [source])  # five words
    assert not lc.copies_run("failed my test driving again and I", [source])
