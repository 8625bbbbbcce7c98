"""The ``mascot`` command line: rosters, graph, chat, rollout, import-logs, tiny-model."""

from __future__ import annotations

import argparse
import json
import logging
import sqlite3
import sys
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import openai
import yaml
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.messages import AIMessageChunk, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from mascot.cli_episodes import add_commands as add_episode_commands
from mascot.cli_eval import add_commands as add_eval_commands
from mascot.cli_eval import add_show_command
from mascot.cli_offline_model import add_commands as add_offline_model_commands
from mascot.cli_pipeline import add_commands as add_pipeline_commands
from mascot.cli_options import (
    UsageError,
    add_policy_flags,
    err,
    masked,
    out,
    policies_from_args,
    positive,
)
from mascot.cli_policy_training import add_commands as add_policy_training_commands
from mascot.cli_serve import add_commands as add_serve_commands
from mascot.cli_training import add_commands as add_training_commands
from mascot.graphs import (
    BASELINES,
    DIRECTOR_NODE,
    create_baseline_graph,
    create_director_graph,
    openai_messages,
)
from mascot.offline_model import OfflineModelError
from mascot.policies import PolicyError
from mascot.rosters import (
    Roster,
    RosterError,
    list_rosters,
    load_roster,
    load_scenarios,
    roster_path,
)
from mascot.training.checkpoint_import import CheckpointImportError
from mascot.training.jsonl import JsonlError
from mascot.training.pairs import PairsError
from mascot.training.rollout import RolloutError
from mascot.training.rubric import RubricError

_QUIT = {"/quit", "/exit", "/q"}

def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mascot`` command line and return its exit code."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "trainer_flags"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    args.trainer_flags = extra  # TRL config fields of the training commands (--learning_rate 1e-5)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for worker processes
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        handlers=[_ConsoleHandler()],
    )
    try:
        return args.run(args)
    except (UsageError, RosterError, PolicyError, JsonlError, CheckpointImportError, RolloutError,
            RubricError, PairsError, OfflineModelError, FileNotFoundError) as exc:
        return _fail(str(exc))
    except openai.APIConnectionError as exc:
        return _fail(f"cannot reach the model server: {exc.__cause__ or exc}; is it running at that --base-url?")
    except openai.APIStatusError as exc:
        return _fail(f"the model server answered {exc.status_code}: {exc.message}")
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130


class _ConsoleHandler(logging.Handler):
    """Logs through the stderr console, so records print above a live progress bar."""

    def emit(self, record: logging.LogRecord) -> None:
        err.print(self.format(record), markup=False)


def _fail(message: str) -> int:
    """Print one error line (line breaks and control characters from the input escaped); exit code 2."""
    one_line = "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in masked(message))
    err.print(f"mascot: error: {one_line}", markup=False)
    return 2


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mascot", description="Direct ensembles of LLM personas with a Director."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")

    rosters = commands.add_parser("rosters", help="list, show or check persona rosters")
    rosters.set_defaults(run=_rosters_list)
    roster_commands = rosters.add_subparsers(metavar="ACTION")
    show = roster_commands.add_parser("show", help="print one roster")
    show.add_argument("roster", metavar="ID_OR_PATH")
    show.set_defaults(run=_rosters_show)
    check = roster_commands.add_parser("check", help="validate a roster file (exit 0 or 2)")
    check.add_argument("path", metavar="PATH")
    check.set_defaults(run=_rosters_check)

    graph = commands.add_parser("graph", help="print the mermaid diagram of a graph")
    graph.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    graph.add_argument("--baseline", choices=BASELINES, help="draw a baseline instead")
    graph.set_defaults(run=_graph)

    chat = commands.add_parser("chat", help="a directed conversation in the terminal")
    chat.add_argument("--roster", required=True, metavar="ID_OR_PATH")
    add_policy_flags(chat)
    chat.add_argument("--message", help="run one round on this message and exit")
    chat.add_argument("--max-rounds", type=positive, default=10, metavar="N")
    chat.add_argument("--max-speakers", type=positive, default=3, metavar="N",
                      help="persona turns per round (default 3)")
    chat.add_argument("--seed", type=int, help="seed for sampling")
    chat.add_argument("--json", action="store_true", help="print the episode as JSON")
    chat.add_argument("--db", default=":memory:", metavar="PATH",
                      help="SQLite checkpoint database (default: in memory)")
    chat.add_argument("--thread-id", metavar="ID", help="continue this conversation thread")
    chat.set_defaults(run=_chat)

    add_episode_commands(commands)
    add_training_commands(commands)
    add_policy_training_commands(commands)
    add_serve_commands(commands)
    add_eval_commands(commands)
    add_show_command(commands)
    add_pipeline_commands(commands)
    add_offline_model_commands(commands)

    tiny = commands.add_parser("tiny-model", help="build a tiny random-weight model offline")
    tiny.add_argument("--out", required=True, metavar="DIR")
    tiny.add_argument("--arch", choices=("qwen3", "llama"), default="qwen3")
    tiny.add_argument("--with-adapters", action="store_true",
                      help="also save a non-zero LoRA adapter per persona and policies.yaml")
    tiny.add_argument("--roster", default="emotional_support", metavar="ID_OR_PATH")
    tiny.add_argument("--seed", type=int, default=0)
    tiny.set_defaults(run=_tiny_model)
    return parser


def _rosters_list(args: argparse.Namespace) -> int:
    for roster_id in list_rosters():
        roster = load_roster(roster_id)
        names = ", ".join(p.name for p in roster.personas)
        out.print(f"{roster.id:20} {roster.domain:24} {names}", markup=False)
    return 0


def _rosters_show(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    out.print(yaml.safe_dump(roster.model_dump(), sort_keys=False, allow_unicode=True), markup=False)
    return 0


def _rosters_check(args: argparse.Namespace) -> int:
    path = roster_path(args.path)
    roster = load_roster(path)
    summary = f"{path}: OK, roster '{roster.id}' with {len(roster.personas)} personas, " \
              f"{len(roster.user_profiles)} user profiles"
    scenarios = path.parent / "scenarios.jsonl"
    if scenarios.is_file():
        summary += f", {len(load_scenarios(scenarios))} scenarios"
    out.print(summary, markup=False)
    return 0


def _graph(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    drawing_only = FakeListChatModel(responses=[""])  # no model is called to draw
    if args.baseline:
        builder = create_baseline_graph(args.baseline, roster, speakers=drawing_only, user="human")
    else:
        builder = create_director_graph(roster, director=drawing_only, speakers=drawing_only, user="human")
    out.print(builder.compile().get_graph().draw_mermaid(), markup=False)
    return 0


def _tiny_model(args: argparse.Namespace) -> int:
    from mascot.tiny_model import build_tiny_model  # needs the train extra (torch)

    path = build_tiny_model(args.out, arch=args.arch, with_adapters=args.with_adapters,
                            roster=args.roster, seed=args.seed)
    out.print(f"tiny {args.arch} model written to {path}", markup=False)
    if args.with_adapters:
        out.print(f"adapters in {path / 'adapters'}; policy file {path / 'policies.yaml'}", markup=False)
    return 0


def _chat(args: argparse.Namespace) -> int:
    roster = load_roster(args.roster)
    policies = policies_from_args(args, roster)
    builder = create_director_graph(
        roster,
        director=policies.chat_model("director"),
        speakers=policies.speakers(),
        user=None if args.message is not None else "human",
        max_rounds=args.max_rounds,
        max_speakers_per_round=args.max_speakers,
        structured_output=True,
    )
    db = args.db if args.db == ":memory:" else str(Path(args.db).expanduser())
    if db != ":memory:" and not Path(db).parent.is_dir():
        raise UsageError(f"--db: directory of {args.db} does not exist")
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
                "policies": {role: policies.describe(role) for role in ("director", *roster.persona_ids)},
            }
            print(json.dumps(episode, indent=2, ensure_ascii=False))
    finally:
        connection.close()
    return 0


def _one_round(graph: Any, config: dict, message: str, roster: Roster, *, quiet: bool) -> None:
    """Run one round and print each turn with the direction that produced it."""
    for update in graph.stream({"messages": [HumanMessage(message)]}, config, stream_mode="updates"):
        if not quiet:
            _print_update(update, roster)


def _print_update(update: dict[str, Any], roster: Roster) -> None:
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
    if direction.get("fallback"):
        line += f" [fallback: {direction['fallback']}]"
    out.print(line, markup=False, style="dim")


def _interactive(graph: Any, config: dict, roster: Roster, *, quiet: bool) -> None:
    """A terminal conversation: persona tokens stream, the graph interrupts for input."""
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


if __name__ == "__main__":
    sys.exit(main())
