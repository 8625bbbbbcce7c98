"""Episodes for people: coloured in the terminal, or one self-contained HTML page.

Each persona turn is shown after the stage direction that produced it; the HTML page adds
per-turn judge scores (from judgement records) and flags turns that mostly repeat an
earlier voice of their round (redundancy at or above ``REDUNDANT``). Systems that played
the same episode ids are also shown side by side, one row per episode. No external
assets: the page's style is inline, every text is escaped.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from typing import Any

from rich.console import Console
from rich.text import Text

from mascot.graphs.embeddings import Embedder, default_embedder
from mascot.rosters import Roster
from mascot.training.episodes.episode import Episode
from mascot.training.evaluation.metrics import round_redundancy

#: Redundancy from which a turn is flagged as repeating its round.
REDUNDANT = 0.8
_COLOURS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
_STYLE = """body{font-family:system-ui,sans-serif;max-width:60rem;margin:2rem auto;padding:0 1rem;color:#222}
h1{font-size:1.4rem}h2{font-size:1.15rem;margin-top:2.5rem}h3{font-size:1rem;margin-top:1.5rem;color:#444}
.turn{margin:.4rem 0;padding:.4rem .6rem;border-left:4px solid #ccc;border-radius:3px;background:#fafafa}
.user{border-left-color:#555;background:#f0f0f0}.who{font-weight:600}.dir{color:#666;font-size:.85rem}
.score{float:right;font-size:.8rem;color:#333}.flag{color:#b00;font-size:.8rem;margin-left:.5rem}
.meta{color:#666;font-size:.85rem}
.wide{width:96vw;margin-left:calc(50% - 48vw)}.pair{border-top:1px solid #ddd;margin-top:1.5rem}
.cols{display:grid;gap:.6rem;overflow-x:auto;margin-top:.5rem}
.colhead{font-weight:600;padding:.2rem 0;border-bottom:2px solid #ddd}"""


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

    When sections share episode ids (evaluation systems playing one plan do), the page opens
    with a side-by-side view: one row per episode id (scenario x person x repeat), the
    sections' conversations of it in columns, in the order of ``sections``. The listing
    per section follows it, each episode linked to its row.

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
    # each conversation is rendered once (the embedder is the slow part) and shown in both views
    turns: dict[str, list[str]] = {}
    for section, episodes in sections.items():
        scores = {(j.get("episode_id"), j.get("turn")): j for j in (judgements or {}).get(section, ())
                  if j.get("status") == "ok" and j.get("turn") is not None}
        turns[section] = [_turns_html(episode, scores, colours, names, embedder) for episode in episodes]
    # a section's first episode of an id is the one its column shows
    played = {section: {e.id: i for i, e in reversed(list(enumerate(episodes)))}
              for section, episodes in sections.items()}
    rows = _rows(sections)
    parts = [f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{html.escape(title)}</title>"
             f"<style>{_STYLE}</style></head><body><h1>{html.escape(title)}</h1>"]
    anchors = {episode_id: f"pair-{n}" for n, episode_id in enumerate(rows, 1)}
    if rows:
        parts.append(f"<nav class=meta><a href='#side-by-side'>Side by side</a> ({len(rows)} episodes) · by system: "
                     + " · ".join(f"<a href='#system-{n}'>{html.escape(section)}</a>"
                                  for n, section in enumerate(sections, 1)) + "</nav>"
                     "<h2 id=side-by-side>Side by side</h2><div class=wide>")
        for episode_id, episode in rows.items():
            parts.append(f"<section class=pair id={anchors[episode_id]}><h3>{html.escape(_heading(episode))}</h3>"
                         f"<div class=meta>{html.escape(episode_id)}"
                         f"{'' if episode.source.repeat is None else f' · repeat {episode.source.repeat}'}</div>"
                         f"<div class=cols style='grid-template-columns:repeat({len(sections)},minmax(15rem,1fr))'>")
            for section, episodes in sections.items():
                index = played[section].get(episode_id)
                parts.append(f"<div class=col><div class=colhead>{html.escape(section)}"
                             + ("</div><div class=meta>not played</div>" if index is None else
                                f"{_fallbacks(episodes[index])}</div>{turns[section][index]}")
                             + "</div>")
            parts.append("</div></section>")
        parts.append("</div>")
    for n, (section, episodes) in enumerate(sections.items(), 1):
        if len(sections) > 1:
            parts.append(f"{'</section>' if n > 1 else ''}<section id=system-{n}><h2>{html.escape(section)}</h2>")
        for episode, rendered in zip(episodes, turns[section], strict=True):
            scenario = episode.scenario.id if episode.scenario else ""
            link = f" · <a href='#{anchors[episode.id]}'>side by side</a>" if episode.id in anchors else ""
            parts.append(f"<h3>{html.escape(scenario or episode.id)}</h3><div class=meta>{html.escape(episode.id)}"
                         f"{_fallbacks(episode)}{link}</div>{rendered}")
    parts.append(f"{'</section>' if len(sections) > 1 else ''}</body></html>")
    return "".join(parts)


def _rows(sections: Mapping[str, Sequence[Episode]]) -> dict[str, Episode]:
    """Every episode id -> one of its episodes, by scenario, person and repeat (first
    appearance breaks ties); empty unless two sections share an id."""
    seen: dict[str, Episode] = {}
    count: dict[str, int] = {}
    for episodes in sections.values():
        for episode in episodes:
            seen.setdefault(episode.id, episode)
        for episode_id in {e.id for e in episodes}:
            count[episode_id] = count.get(episode_id, 0) + 1
    if not any(n > 1 for n in count.values()):
        return {}

    def key(episode: Episode) -> tuple[str, str, int]:
        return (episode.scenario.id if episode.scenario else "",
                episode.user_profile.id if episode.user_profile else "", episode.source.repeat or 0)
    return {e.id: e for e in sorted(seen.values(), key=key)}


def _heading(episode: Episode) -> str:
    scenario = episode.scenario.id if episode.scenario else episode.id
    person = f" · {episode.user_profile.name} ({episode.user_profile.id})" if episode.user_profile else ""
    return scenario + person


def _fallbacks(episode: Episode) -> str:
    return f" · {len(episode.fallbacks)} fallbacks" if episode.fallbacks else ""


def _turns_html(episode: Episode, scores: Mapping[tuple[Any, Any], Mapping[str, Any]], colours: Mapping[str, str],
                names: Mapping[str, str], embedder: Embedder) -> str:
    redundancy = iter(round_redundancy(episode, embedder=embedder))
    parts = []
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
    return "".join(parts)
