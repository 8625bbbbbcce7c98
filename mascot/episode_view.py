"""Episodes for people: coloured in the terminal, or one self-contained HTML page.

Each persona turn is shown after the stage direction that produced it; the HTML page adds
per-turn judge scores (from judgement records) and flags turns that mostly repeat an
earlier voice of their round (redundancy at or above ``REDUNDANT``). No external assets:
the page's style is inline, every text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from mascot.rosters import Roster
from mascot.training.episode import Episode
from mascot.training.metrics import Embedder, default_embedder, round_redundancy

#: Redundancy from which a turn is flagged as repeating its round.
REDUNDANT = 0.8
_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
_STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2.5rem}h3{font-size:1rem;margin-top:1.5rem;color:#444}
.turn{margin:.4rem 0;padding:.4rem .6rem;border-left:4px solid #ccc;border-radius:3px;background:#fafafa}
.user{border-left-color:#555;background:#f0f0f0}.who{font-weight:600}.dir{color:#666;font-size:.85rem}
.score{float:right;font-size:.8rem;color:#333}.flag{color:#b00;font-size:.8rem;margin-left:.5rem}
.meta{color:#666;font-size:.85rem}"""


def print_episodes(episodes: Sequence[Episode], roster: Roster, console: Console) -> None:
    """Print episodes with speakers coloured and each stage direction before its turn."""
    colours = {pid: _COLOURS[i % len(_COLOURS)] for i, pid in enumerate(roster.persona_ids)}
    names = {p.id: p.name for p in roster.personas}
    for episode in episodes:
        scenario = episode.scenario.id if episode.scenario else "-"
        console.rule(Text(f"{episode.id}  {scenario}"))
        for message in episode.messages:
            if message.role == "user":
                console.print(Text("Person: ", style="bold") + Text(message.content))
            elif message.role == "assistant":
                if message.stage_direction:
                    d = message.stage_direction
                    console.print(Text(f"  » {d.get('action', '')} (tone: {d.get('tone', '')})", style="dim"))
                name = message.name or "assistant"
                console.print(Text(f"{names.get(name, name)}: ", style=f"bold {colours.get(name, 'white')}")
                              + Text(message.content))
        for fallback in episode.fallbacks:
            console.print(Text(f"  fallback ({fallback.get('node')}): {fallback.get('reason')}", style="yellow"))


def episodes_html(
    sections: Mapping[str, Sequence[Episode]],
    roster: Roster,
    *,
    title: str = "Conversations",
    judgements: Mapping[str, Sequence[Mapping[str, Any]]] | None = None,
    embedder: Embedder | None = None,
) -> str:
    """One self-contained HTML page of episodes, one section per key of ``sections``.

    Args:
        sections: Section title (e.g. a system's name) -> its episodes.
        roster: The roster (names, colours).
        title: Page title.
        judgements: Section title -> its judgement records; a reply's ``overall`` is
            shown beside it (sections may share episode ids, as evaluation systems do).
        embedder: For the redundancy flags; default ``default_embedder()``.

    Returns:
        The page.
    """
    embedder = embedder or default_embedder()
    colours = {pid: _COLOURS[i % len(_COLOURS)] for i, pid in enumerate(roster.persona_ids)}
    names = {p.id: p.name for p in roster.personas}
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    for section, episodes in sections.items():
        scores = {(j.get("episode_id"), j.get("turn")): j for j in (judgements or {}).get(section, ())
                  if j.get("status") == "ok" and j.get("turn") is not None}
        if len(sections) > 1:
            parts.append(f"<h2>{html.escape(section)}</h2>")
        for episode in episodes:
            redundancy = iter(round_redundancy(episode, embedder=embedder))
            scenario = episode.scenario.id if episode.scenario else ""
            parts.append(f"<h3>{html.escape(scenario or episode.id)}</h3><div class=meta>{html.escape(episode.id)}"
                         f"{' · ' + str(len(episode.fallbacks)) + ' fallbacks' if episode.fallbacks else ''}</div>")
            for index, message in enumerate(episode.messages):
                if message.role == "user":
                    parts.append(f"<div class='turn user'><span class=who>Person</span>: "
                                 f"{html.escape(message.content)}</div>")
                elif message.role == "assistant":
                    name = message.name or "assistant"
                    flag = next(redundancy, 0.0) >= REDUNDANT
                    judged = scores.get((episode.id, index))
                    direction = message.stage_direction or {}
                    parts.append(
                        f"<div class=turn style='border-left-color:{colours.get(name, '#999')}'>"
                        + (f"<span class=score>judge {judged['overall']:.0f}</span>" if judged else "")
                        + (f"<div class=dir>» {html.escape(str(direction.get('action', '')))} "
                           f"(tone: {html.escape(str(direction.get('tone', '')))})</div>" if direction else "")
                        + f"<span class=who style='color:{colours.get(name, '#333')}'>"
                        f"{html.escape(names.get(name, name))}</span>: {html.escape(message.content)}"
                        + ("<span class=flag>repeats an earlier voice</span>" if flag else "") + "</div>")
    parts.append("</body></html>")
    return "".join(parts)
