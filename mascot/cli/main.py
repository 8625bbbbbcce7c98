"""The ``mascot`` command line: one parser, each command's arguments and code in its own module."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import openai

from mascot.cli import (
    chat,
    episodes,
    evaluation,
    judging,
    offline_model,
    pipeline,
    policy_training,
    rosters,
    serve,
    tiny_model,
)
from mascot.cli.options import UsageError, err, masked
from mascot.offline_model import OfflineModelError
from mascot.policies import PolicyError
from mascot.rosters import RosterError
from mascot.training.data.pairs import PairsError
from mascot.training.episodes.checkpoint_import import CheckpointImportError
from mascot.training.episodes.rollout import RolloutError
from mascot.training.jsonl import JsonlError
from mascot.training.judging.rubric import RubricError


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
    except RosterError as exc:  # a file with several problems: one line each
        return _fail(exc.summary, exc.problems)
    except (UsageError, PolicyError, JsonlError, CheckpointImportError, RolloutError,
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


def _fail(message: str, details: Sequence[str] = ()) -> int:
    """Print one error line, then one indented line per detail (line breaks and control
    characters from the input escaped within each); exit code 2."""
    err.print(f"mascot: error: {_one_line(message)}", markup=False)
    for detail in details:
        err.print(f"  {_one_line(detail)}", markup=False)
    return 2


def _one_line(text: str) -> str:
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode() for c in masked(text))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="mascot", description="Direct ensembles of LLM personas with a Director."
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress to stderr")
    commands = parser.add_subparsers(title="commands", required=True, metavar="COMMAND")
    rosters.add_commands(commands)
    chat.add_commands(commands)
    episodes.add_commands(commands)
    judging.add_commands(commands)
    policy_training.add_commands(commands)
    serve.add_commands(commands)
    evaluation.add_commands(commands)
    evaluation.add_show_command(commands)
    pipeline.add_commands(commands)
    offline_model.add_commands(commands)
    tiny_model.add_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
