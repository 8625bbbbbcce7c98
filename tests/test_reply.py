from __future__ import annotations

import pytest

from mascot.graphs import clean_reply
from mascot.graphs.reply import speaker_labels, user_labels

OWN = speaker_labels("anchor", "The Anchor")
OTHERS = user_labels() + speaker_labels("catalyst", "The Catalyst", "action_guide", "Action Guide")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("That sounds painful.", "That sounds painful."),
        ("The Anchor: That sounds painful.", "That sounds painful."),
        ("[anchor] That sounds painful.", "That sounds painful."),
        ("**Anchor** (emotional validator): That sounds painful.", "That sounds painful."),
        ("Anchor: The Anchor: twice", "twice"),
        ("That sounds painful.\nCatalyst: But is it really 'again'?", "That sounds painful."),
        ("That hurts.\n\nUser: yes it does", "That hurts."),
        ("That hurts.\n[Action Guide] Book a lesson.", "That hurts."),
        ("Catalyst: I am not the anchor", ""),
        ("<think>be kind</think>I'm here.", "I'm here."),
        ('"Quoted reply."', "Quoted reply."),
        ("I told my catalyst friend: relax", "I told my catalyst friend: relax"),
    ],
)
def test_clean_reply(text: str, expected: str) -> None:
    assert clean_reply(text, own=OWN, others=OTHERS) == expected
