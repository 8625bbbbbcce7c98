"""The conversations page: systems that played the same plan, side by side per episode id."""

from __future__ import annotations

import re

from mascot.graphs.embeddings import LexicalEmbedder
from mascot.rosters import Roster
from mascot.training.evaluation.episode_view import episodes_html


def test_systems_sharing_episode_ids_are_shown_side_by_side(episodes: list, roster: Roster) -> None:
    first, second = episodes[:2]
    # the second system played the same plan (same ids) and said different, hostile things
    other = [e.model_copy(update={"messages": [m.model_copy(update={"content": f"<script>x</script> {m.content}"})
                                               if m.role == "assistant" else m for m in e.messages]})
             for e in (second, first)]
    turn = next(i for i, m in enumerate(first.messages) if m.role == "assistant")
    page = episodes_html({"trained": [first, second], "round_robin": other}, roster, title="Eval <&>",
                         judgements={"round_robin": [{"episode_id": first.id, "turn": turn, "status": "ok",
                                                      "overall": 91.0}]},
                         embedder=LexicalEmbedder())
    assert "<script>" not in page and "&lt;script&gt;x&lt;/script&gt;" in page and "Eval &lt;&amp;&gt;" in page
    side, listing = page.split("<section id=system-1>")
    assert "<h2 id=side-by-side>" in side and "<section id=system-2><h2>round_robin</h2>" in listing  # listing kept
    rows = re.findall(r"<section class=pair id=(pair-\d+)>(.*?)</section>", side)
    assert len(rows) == 2  # one row per episode id, not per system x episode
    for episode in (first, second):
        anchor, row = next((a, r) for a, r in rows if episode.id in r)
        # the systems in the order given, each with its own version of this conversation
        columns = re.findall(r"<div class=colhead>(\w+)", row)
        assert columns == ["trained", "round_robin"]
        trained, round_robin = row.split("<div class=colhead>")[1:]
        reply = next(m.content for m in episode.messages if m.role == "assistant")
        assert "&lt;script&gt;" not in trained and "&lt;script&gt;" in round_robin
        assert reply.replace("'", "&#x27;")[:15] in trained and "» " in trained  # stage directions shown
        assert episode.scenario.id in row and episode.user_profile.name in row
        assert f"<a href='#{anchor}'>side by side</a>" in listing
    first_row = next(r for _, r in rows if first.id in r)
    assert "judge 91" in first_row.split("<div class=colhead>")[2] and "judge 91" not in first_row.split(
        "<div class=colhead>")[1]
    # an episode one system did not play keeps its column, marked
    page = episodes_html({"trained": [first, second], "round_robin": other[1:]}, roster, embedder=LexicalEmbedder())
    row = next(r for r in re.findall(r"<section class=pair id=pair-\d+>(.*?)</section>", page) if second.id in r)
    assert "round_robin</div><div class=meta>not played" in row


def test_one_system_has_no_side_by_side_view(episodes: list, roster: Roster) -> None:
    page = episodes_html({"trained": episodes}, roster, embedder=LexicalEmbedder())
    assert "class=pair" not in page and "Side by side" not in page and "<h2" not in page
    assert page.count("<h3>") == len(episodes)
