"""References generated from the code: every command from the ``mascot`` parsers, and every
module of the package from its docstring.

``docs/cli.md`` holds the first between ``START`` and ``END``, ``docs/contributing.md`` the
second between ``MODULES_START`` and ``MODULES_END``; a test keeps each equal to the code, so
no flag or module is documented by hand. ``python -m mascot.cli.reference --write FILE``
refreshes the marked parts of FILE; without ``--write`` it prints the command reference.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

START, END = "<!-- cli-reference:start -->", "<!-- cli-reference:end -->"
MODULES_START, MODULES_END = "<!-- module-map:start -->", "<!-- module-map:end -->"
PACKAGE = Path(__file__).resolve().parents[1]


def cli_reference() -> str:
    """Every command and subcommand of ``mascot``: its usage line, what it does and a table
    of its options (flags, what each does, the default), in the order ``mascot --help``
    lists them."""
    from mascot.cli.main import _parser

    lines = ["Generated from the parsers by `python -m mascot.cli.reference --write docs/cli.md`; "
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


def module_map() -> str:
    """One line per module of the package, folder by folder: its path and the first line of
    its docstring."""
    lines = ["| module | what it holds |", "|---|---|"]
    for path in sorted(PACKAGE.rglob("*.py"), key=lambda p: (p.parent.relative_to(PACKAGE).parts, p.name)):
        if "__pycache__" in path.parts:
            continue
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        summary = _cell(doc.strip().split("\n\n")[0]) if doc else ""
        lines.append(f"| `{path.relative_to(PACKAGE.parent).as_posix()}` | {summary} |")
    return "\n".join(lines) + "\n"


def replace_reference(document: str, reference: str, start: str = START, end: str = END) -> str:
    """``document`` with the text between ``start`` and ``end`` replaced by ``reference``."""
    if document.count(start) != 1 or document.count(end) != 1:
        raise ValueError(f"the document needs one {start} and one {end} line")
    head, rest = document.split(start)
    _, tail = rest.split(end)
    return f"{head}{start}\n{reference}{end}{tail}"


def main(argv: Sequence[str] | None = None) -> int:
    """Print the reference, or write it into a document between its markers."""
    parser = argparse.ArgumentParser(prog="python -m mascot.cli.reference", description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, metavar="FILE",
                        help="replace the references between their markers in FILE")
    args = parser.parse_args(argv)
    if args.write is None:
        sys.stdout.write(cli_reference())
        return 0
    try:
        text = args.write.read_text(encoding="utf-8")
        written = []
        for (start, end), make in (((START, END), cli_reference), ((MODULES_START, MODULES_END), module_map)):
            if start in text or end in text:
                text = replace_reference(text, make(), start, end)
                written.append(make.__name__.replace("_", " "))
        if not written:
            raise ValueError(f"no {START} or {MODULES_START} markers")
        args.write.write_text(text, encoding="utf-8")
    except (OSError, ValueError) as exc:
        parser.exit(2, f"{parser.prog}: error: {args.write}: {exc}\n")
    print(f"wrote the {' and the '.join(written)} into {args.write}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
