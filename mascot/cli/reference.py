"""The command-line reference, generated from the ``mascot`` parsers.

``docs/cli.md`` holds this text between ``START`` and ``END``; a test keeps the two equal,
so no flag is documented by hand. ``python -m mascot.cli.reference --write docs/cli.md``
refreshes it; without ``--write`` it prints the reference.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"


def cli_reference() -> str:
    """Every command and subcommand of ``mascot``: its usage line, what it does and a table
    of its options (flags, what each does, the default), in the order ``mascot --help``
    lists them."""
    from mascot.cli.main import _parser

    lines = [f"Generated from the parsers by `python -m mascot.cli.reference --write docs/cli.md`; "
             "a test fails when it is out of date.", ""]
    for name, parser, summary in _commands(_parser(), "mascot"):
        lines += [f"### `{name}`", ""]
        if summary:
            lines += [_sentence(summary), ""]
        if parser.description and parser.description != summary:
            lines += [_sentence(parser.description), ""]
        usage = " ".join(parser.format_usage().split()).removeprefix("usage: ")
        lines += ["```text", usage, "```", ""]
        rows = [_row(action) for action in parser._actions
                if not isinstance(action, (argparse._HelpAction, argparse._SubParsersAction))
                and action.help != argparse.SUPPRESS]
        if rows:
            lines += ["| option | what it does | default |", "|---|---|---|", *rows, ""]
    return "\n".join(lines).rstrip() + "\n"


def _commands(parser: argparse.ArgumentParser, name: str,
              summary: str = "") -> Iterator[tuple[str, argparse.ArgumentParser, str]]:
    """(full command, its parser, its one-line help) for a parser and every subparser below it."""
    yield name, parser, summary
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}
            for sub, subparser in action.choices.items():
                yield from _commands(subparser, f"{name} {sub}", helps.get(sub, ""))


def _row(action: argparse.Action) -> str:
    if action.option_strings:
        flags = ", ".join(action.option_strings)
        if action.nargs != 0:
            flags += f" {_metavar(action)}"
    else:
        flags = _metavar(action)
    default = action.default
    shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 or callable(default) \
        else f"`{default}`"
    return f"| `{flags}` | {_cell(action.help or '')} | {shown} |"


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return action.metavar if isinstance(action.metavar, str) else " ".join(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(map(str, action.choices)) + "}"
    return action.dest.upper() if action.option_strings else action.dest


def _cell(text: str) -> str:
    return " ".join(text.replace("%%", "%").replace("|", "\\|").split())


def _sentence(text: str) -> str:
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] + ("" if text.endswith((".", ")", ":")) else ".")


def replace_reference(document: str, reference: str) -> str:
    """``document`` with the text between ``START`` and ``END`` replaced by ``reference``."""
    if document.count(START) != 1 or document.count(END) != 1:
        raise ValueError(f"the document needs one {START} and one {END} line")
    head, rest = document.split(START)
    _, tail = rest.split(END)
    return f"{head}{START}\n{reference}{END}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reference, or write it into a document between its markers."""
    parser = argparse.ArgumentParser(prog="python -m mascot.cli.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="FILE", help="replace the reference between the markers in FILE")
    args = parser.parse_args(argv)
    reference = cli_reference()
    if args.write is None:
        sys.stdout.write(reference)
        return 0
    try:
        args.write.write_text(replace_reference(args.write.read_text(encoding="utf-8"), reference), encoding="utf-8")
    except (OSError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {args.write}: {exc}\n")
    print(f"wrote the command-line reference into {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
