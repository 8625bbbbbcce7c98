"""``mascot graph`` and ``mascot chat``: draw a graph, or hold a directed conversation in the terminal."""

from __future__ import annotations

import argparse
import json
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Any

from mascot.cli.options import (
    BASELINES,
    ROSTER_HELP,
    UsageError,
    add_policy_flags,
    add_safety_flags,
    err,
    on_engine,
    out,
    policies_from_args,
    positive,
    safety_from_args,
)
from mascot.rosters import Roster, load_roster

_QUIT = {"/quit", "/exit", "/q"}


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``graph`` and ``chat``."""
    graph = commands.add_parser("graph", help="print the mermaid diagram of a graph")
    graph.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    graph.add_argument("--baseline", choices=BASELINES, help="draw a baseline instead")
    graph.add_argument("--plain", action="store_true", help="without colours and curve settings (shorter)")
    graph.set_defaults(run=_graph)

    chat = commands.add_parser("chat", help="a directed conversation in the terminal")
    chat.add_argument("--roster", required=True, metavar="ID_OR_PATH", help=ROSTER_HELP)
    add_policy_flags(chat)
    chat.add_argument("--message", help="run one round on this message and exit")
    chat.add_argument("--max-rounds", type=positive, default=10, metavar="N",
                      help="rounds (one message of yours each) before the chat ends")
    chat.add_argument("--max-speakers", type=positive, default=3, metavar="N",
                      help="persona turns per round (default 3)")
    chat.add_argument("--seed", type=int, help="seed for sampling")
    chat.add_argument("--json", action="store_true", help="print the episode as JSON")
    chat.add_argument("--db", default=":memory:", metavar="PATH",
                      help="SQLite checkpoint database (default: in memory)")
    chat.add_argument("--thread-id", metavar="ID", help="continue this conversation thread")
    add_safety_flags(chat)
    chat.set_defaults(run=_chat)


def _graph(args: argparse.Namespace) -> int:
    from langchain_core.language_models.fake_chat_models import FakeListChatModel

    from mascot.graphs import create_baseline_graph, create_director_graph

    roster = load_roster(args.roster)
    drawing_only = FakeListChatModel(responses=[""])  # no model is called to draw
    if args.baseline:
        builder = create_baseline_graph(args.baseline, roster, speakers=drawing_only, user="human")
    else:
        builder = create_director_graph(roster, director=drawing_only, speakers=drawing_only, user="human")
    out.print(builder.compile().get_graph().draw_mermaid(with_styles=not args.plain), markup=False)
    return 0


def _checkpoint_db(arg: str) -> str:
    """The ``--db`` to open: in memory, a new file, or a SQLite database that holds the
    LangGraph checkpoint tables or no tables yet; anything else is refused, not changed.

    Raises:
        UsageError: on a missing directory, a path that is no regular file, a file that is
            not a SQLite database, or a database holding other tables but no checkpoints.
    """
    if arg == ":memory:":
        return arg
    path = Path(arg).expanduser()
    if not path.parent.is_dir():
        raise UsageError(f"--db: directory of {arg} does not exist")
    if not path.exists():
        return str(path)
    if not path.is_file():
        raise UsageError(f"--db: {arg} is not a regular file")
    try:
        with closing(sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True)) as probe:
            tables = {row[0] for row in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    except sqlite3.DatabaseError as exc:
        what = "is not a SQLite database" if "not a database" in str(exc) else f"cannot be read ({exc})"
        raise UsageError(f"--db: {arg} {what}") from None
    if tables and not {"checkpoints", "writes"} <= tables:
        raise UsageError(f"--db: {arg} holds other tables ({', '.join(sorted(tables))}) but no LangGraph "
                         "checkpoint tables (checkpoints, writes): not a chat checkpoint database; "
                         "pass a new file")
    return str(path)


def _chat(args: argparse.Namespace) -> int:
    from langgraph.checkpoint.sqlite import SqliteSaver

    from mascot.graphs import create_director_graph, openai_messages

    db = _checkpoint_db(args.db)
    roster = load_roster(args.roster)
    safety = safety_from_args(args, roster)
    policies = on_engine(args, policies_from_args(args, roster))
    builder = create_director_graph(
        roster,
        director=policies.chat_model("director"),
        speakers=policies.speakers(),
        user=None if args.message is not None else "human",
        max_rounds=args.max_rounds,
        max_speakers_per_round=args.max_speakers,
        structured_output=True,
        safety=safety,
    )
    connection = sqlite3.connect(db, check_same_thread=False)
    try:
        graph = builder.compile(checkpointer=SqliteSaver(connection))
        config = {"configurable": {"thread_id": args.thread_id or uuid.uuid4().hex}}
        if args.message is not None:
            if not args.message.strip():
                raise UsageError("--message is empty")
            _one_round(graph, config, args.message, roster, quiet=args.json)
        else:
            _interactive(graph, config, roster, quiet=args.json)
        if args.json:
            state = graph.get_state(config).values
            episode = {
                "roster": roster.id,
                "thread_id": config["configurable"]["thread_id"],
                "messages": openai_messages(state.get("messages", [])),
                "directions": state.get("directions", []),
                "fallbacks": state.get("fallbacks", []),
                "guards": state.get("guards", []),
                "policies": {role: policies.describe(role) for role in ("director", *roster.persona_ids)},
            }
            print(json.dumps(episode, indent=2, ensure_ascii=False))
    finally:
        connection.close()
    return 0


def _one_round(graph: Any, config: dict, message: str, roster: Roster, *, quiet: bool) -> None:
    """Run one round and print each turn with the direction that produced it."""
    from langchain_core.messages import HumanMessage

    for update in graph.stream({"messages": [HumanMessage(message)]}, config, stream_mode="updates"):
        if not quiet:
            _print_update(update, roster)


def _print_update(update: dict[str, Any], roster: Roster) -> None:
    from mascot.graphs import DIRECTOR_NODE

    for node, values in update.items():
        if not isinstance(values, dict):
            continue
        if node == DIRECTOR_NODE:
            for direction in values.get("directions", []):
                _print_direction(direction)
        elif node in roster.persona_ids:
            for message in values.get("messages", []):
                out.print(f"[{node}] {message.text}", markup=False)
            for fallback in values.get("fallbacks", []):
                out.print(f"  ({node}: {fallback['reason']})", markup=False, style="dim")


def _print_direction(direction: dict[str, Any]) -> None:
    line = f"» {direction['speaker']}: {direction['action']} (tone: {direction['tone']})"
    if direction.get("guard"):
        line += f" [safety rule: {direction['guard']['rule']}]"
    if direction.get("fallback"):
        line += f" [fallback: {direction['fallback']}]"
    out.print(line, markup=False, style="dim")


def _interactive(graph: Any, config: dict, roster: Roster, *, quiet: bool) -> None:
    """A terminal conversation: persona tokens stream, the graph interrupts for input."""
    from langchain_core.messages import AIMessageChunk, HumanMessage
    from langgraph.types import Command

    from mascot.graphs import DIRECTOR_NODE

    names = ", ".join(f"{p.name} ({p.id})" for p in roster.personas)
    err.print(f"Talking with {names}. Empty line or /quit ends.", markup=False)
    text = _read_line()
    if text is None:
        return
    payload: Any = {"messages": [HumanMessage(text)]}
    while True:
        current = None
        for mode, chunk in graph.stream(payload, config, stream_mode=["messages", "updates"]):
            if quiet:
                continue
            if mode == "messages":
                token, meta = chunk
                node = meta.get("langgraph_node")
                if node in roster.persona_ids and isinstance(token, AIMessageChunk) and token.text:
                    if current != token.id:
                        out.print(f"\n[{node}] ", end="", markup=False)
                        current = token.id
                    out.print(token.text, end="", markup=False)
            elif DIRECTOR_NODE in chunk and isinstance(chunk[DIRECTOR_NODE], dict):
                if current is not None:
                    out.print()
                    current = None
                for direction in chunk[DIRECTOR_NODE].get("directions", []):
                    _print_direction(direction)
        if current is not None:
            out.print()
        if not graph.get_state(config).next:
            return
        text = _read_line()
        payload = Command(resume=text or "")
        if text is None:
            graph.invoke(payload, config)
            return


def _read_line() -> str | None:
    try:
        text = input("you> ").strip()
    except EOFError:
        return None
    return None if not text or text in _QUIT else text
