"""Replies a refusal-hungry policy would write, told apart from replies of a voice's own."""

from __future__ import annotations

import pytest

from mascot.graphs.faults import REPLY_FAULTS as FAULTS
from mascot.graphs.faults import direction_faults, persona_texts, reply_fault, reply_faults, voice_names
from mascot.rosters import load_roster

ROSTER = load_roster("emotional_support")

PERSON = "I failed my driving test again and I feel like an idiot"
ANCHOR = ("That sounds really painful, and it makes sense that you feel discouraged after trying so hard. "
          "What do you feel right now, really, when you think of the test?")


@pytest.mark.parametrize(("text", "fault"), [
    ("I'm sorry, but I can't assist with that.", "refusal"),  # what the trained speakers wrote
    ("I'm sorry, but I can't assist with that request.", "refusal"),
    ("I apologize, but I can't assist with that.", "refusal"),  # a trained speaker's
    ("I\u2019m sorry, but I can\u2019t help with that.", "refusal"),  # curly apostrophes
    ("Sorry, I cannot help with this.", "refusal"),
    ("I am unable to provide that kind of advice.", "refusal"),
    ("Unfortunately, I'm not able to engage in this conversation.", "refusal"),
    ("I can't help you with that, but a professional can.", "refusal"),
    ("As an AI language model, I don't have feelings, but failing is normal.", "helpdesk"),
    ("Failing is normal. How can I assist you today?", "helpdesk"),
    ("You will pass next time. Is there anything else I can help you with?", "helpdesk"),
    ("Of course! Let me know if there's anything else I can help you with.", "helpdesk"),
    ("What's happening to you right now? How can I assist you better today?", "helpdesk"),
    ("I'm just an AI, but I think you did your best.", "helpdesk"),
    ("User: I failed again and I hate it.", "as_person"),
    ("Me: I feel like an idiot.", "as_person"),
    ("I failed my driving test again and I feel like a total idiot.", "as_person"),  # the message said back
    (ANCHOR, "copies_voice"),
    ("That sounds really painful, and it makes sense that you feel discouraged after trying so hard!", "copies_voice"),
    ("It sounds really painful, and it makes sense you feel discouraged after trying so hard. What do you feel "
     "right now when you think of the test?", "copies_voice"),  # the same reply with words changed
    ("Hey, that sounds really painful, and it makes sense that you feel discouraged, so what now?",
     "copies_voice"),
    ("You said: failed my driving test again and I feel like an idiot. What went wrong?", "copies_person"),
    # eight words of the voice before, said again: a copy by the labelling rule (bench/faults/rule.md),
    # though the speaker node's narrower copies_voice lets it be heard
    ("It makes sense that you feel discouraged after trying so hard, and I wonder what the examiner actually "
     "wrote down, because a third attempt usually fails on one narrow thing you can drill this week.", "copies_voice"),
    ("Oh no! I'm sorry, but I can't help you with that.", "refusal"),  # a refusal after an interjection
    ("That sounds hard. I apologize for the inconvenience, but I can't assist with that.", "refusal"),
    ("Sure, I'd be happy to help. What would you like me to do?", "helpdesk"),
    ("What would you like to talk to me about?", "helpdesk"),
    ("It sounds like you feel let down and a bit embarrassed.", "copies_style"),
    ("Tone: sigh. Please speak to them now, it will pass.", "echoes_prompt"),
    ("You're right that everyone would benefit from less of you around.", "affirms_despair"),
    ("You're right, there isn't much hope for improvement right now.", "affirms_despair"),
])
def test_faults_are_named(text: str, fault: str) -> None:
    assert reply_fault(text, person=PERSON, voices=[ANCHOR], personas=persona_texts(ROSTER)) == fault
    assert fault in FAULTS


@pytest.mark.parametrize("text", [
    "What makes you so sure this one attempt says something about who you are?",
    "I can't imagine how frustrating that must be. Failing twice doesn't make you an idiot.",
    "I can't help feeling you're being harder on yourself than you'd be on a friend.",
    "I'm sorry you're going through this; it hurts to fail after so much practice.",
    "Book one more lesson this week and ask the instructor which manoeuvre cost you the points.",
    "You failed a test, not a life. What did you learn about the parts that went well?",
    "Sorry to hear that. What part of the test felt hardest?",
    "I don't think one result defines you.",
    "You're right that it has been a hard year, and you deserve some rest.",
    "Is there anything else you'd like to share about how the test went?",  # a voice may ask this
    "How can I help you feel a little steadier tonight?",
    "I can't help you decide, but here is a first step: write down what each option costs you this month.",
    "I can't do that for you, but you could ask the instructor which manoeuvre cost the points.",
    "What do you really feel right now?",  # a short question in the first voice's words is no copy
    "",
])
def test_replies_of_their_own_pass(text: str) -> None:
    assert reply_fault(text, person=PERSON, voices=[ANCHOR]) is None


def test_without_context_only_the_text_tells() -> None:
    assert reply_fault(ANCHOR) is None  # no earlier voice: nothing to copy
    assert reply_fault("I'm sorry, but I can't assist with that.") == "refusal"


def test_every_fault_of_a_reply_is_named() -> None:
    text = "Oh no! I'm sorry, but I can't help you with that. How can I assist you today?"
    assert reply_faults(text) == ("refusal", "helpdesk")
    assert reply_faults("Say this: It sounds like you feel let down and a bit embarrassed, okay?",
                        personas=persona_texts(ROSTER)) == ("copies_style",)


def test_a_reply_may_say_the_words_a_safety_direction_hands_it() -> None:
    resources = "please call your local emergency number now, or reach a crisis line in your country"
    action = f"Give the person these resources clearly, in these words: {resources}"
    assert reply_faults(f"I hear you. {resources}.", instructions=[action]) == ()
    assert reply_faults("Give the person these resources clearly and kindly.", instructions=[action]) == (
        "echoes_prompt",)


@pytest.mark.parametrize(("action", "tone", "faults"), [
    ("Acknowledge how exhausting the waiting has been, then ask what support they have this week", "warm", ()),
    ("Build on what the Anchor said with one concrete step for tonight", "practical", ()),
    ("Let the Anchor speak first and name the hurt", "gentle", ()),
    ("I'm sorry, but I can't help with that.", "calm", ("refusal", "first_person")),
    ("I'm here to help you navigate this situation.", "calm", ("refusal", "first_person")),
    ("I will be able to get better again.", "calm", ("first_person",)),
    ("The Anchor, the emotional validator", "warm", ("names_voice",)),
    ("Catalyst: question the belief that one test decides everything", "curious", ("names_voice",)),
    ("Ask them what feels heaviest", "The tone should be warm and gentle and kind", ("long_tone",)),
    ("Ask them what feels heaviest", "I'm here to help.", ("long_tone",)),  # a sentence, not a tone
    ("Ask them what feels heaviest", "", ("long_tone",)),
    ("Say that one test does not decide who you are as a driver", "firm", ("copied",)),
])
def test_direction_faults(action: str, tone: str, faults: tuple[str, ...]) -> None:
    shown = ["Everyone says one test does not decide who you are as a driver, but it feels like it does."]
    assert direction_faults(action, tone, names=voice_names(ROSTER), shown=shown) == faults


def _bench_faults():
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parent.parent / "bench" / "faults.py"
    spec = importlib.util.spec_from_file_location("bench_faults", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_faults"] = module
    spec.loader.exec_module(module)
    return module


def test_the_verifiers_keep_their_agreement_with_the_hand_labels() -> None:
    """The dev half (the patterns were fitted on it) stays at the gate for every fault with
    five or more labelled items but the two it misses (as_person, which the text alone does
    not show, 0/6; copies_voice 7/8, a copy in other words); and the
    committed figures of both halves (docs/evaluation.md, bench/results/faults.json) are what
    the verifiers give now."""
    import json

    bench = _bench_faults()
    items = bench.load_items(bench.LABELS)
    dev = bench.agreement([i for i in items if i["split"] == "dev"], ROSTER)
    for name, row in dev.items():
        if row["labelled"] >= 5 and name not in ("reply/as_person", "reply/copies_voice"):
            assert row["precision"] >= bench.GATE and row["recall"] >= bench.GATE, (name, row)
    committed = json.loads((bench.HERE / "results" / "faults.json").read_text())
    assert committed["splits"]["dev"] == json.loads(json.dumps(dev))
    test = bench.agreement([i for i in items if i["split"] == "test"], ROSTER)
    assert committed["splits"]["test"] == json.loads(json.dumps(test))
