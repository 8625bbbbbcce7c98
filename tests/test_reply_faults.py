"""Replies a refusal-hungry policy would write, told apart from replies of a voice's own."""

from __future__ import annotations

import pytest

from mascot.graphs.reply_faults import FAULTS, reply_fault

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
    ("As an AI language model, I don't have feelings, but failing is normal.", "boilerplate"),
    ("Failing is normal. How can I assist you today?", "boilerplate"),
    ("You will pass next time. Is there anything else I can help you with?", "boilerplate"),
    ("Of course! Let me know if there's anything else I can help you with.", "boilerplate"),
    ("What's happening to you right now? How can I assist you better today?", "boilerplate"),
    ("I'm just an AI, but I think you did your best.", "boilerplate"),
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
])
def test_faults_are_named(text: str, fault: str) -> None:
    assert reply_fault(text, person=PERSON, voices=[ANCHOR]) == fault
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
    "Is there anything else you'd like to share about how the test went?",  # a voice may ask this
    "How can I help you feel a little steadier tonight?",
    "I can't help you decide, but here is a first step: write down what each option costs you this month.",
    "I can't do that for you, but you could ask the instructor which manoeuvre cost the points.",
    "What do you really feel right now?",  # a short question in the first voice's words is no copy
    # one stock phrase in common with the voice before, in a reply of its own
    "It makes sense that you feel discouraged after trying so hard, and I wonder what the examiner actually "
    "wrote down, because a third attempt usually fails on one narrow thing you can drill this week.",
    "",
])
def test_replies_of_their_own_pass(text: str) -> None:
    assert reply_fault(text, person=PERSON, voices=[ANCHOR]) is None


def test_without_context_only_the_text_tells() -> None:
    assert reply_fault(ANCHOR) is None  # no earlier voice: nothing to copy
    assert reply_fault("I'm sorry, but I can't assist with that.") == "refusal"
