"""The ``mascot`` command line: one parser, each command's arguments and code in its own module."""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from contextlib import ExitStack

from mascot.cli import (
    chat,
    data,
    episodes,
    evaluation,
    fitting,
    judging,
    offline_encoder,
    offline_model,
    pipeline,
    rosters,
    serve,
    tiny_model,
)
from mascot.cli.options import err, masked
from mascot.rosters import RosterError

#: What a user's input or setup causes (module, class): one line each, exit 2. Looked up only
#: in modules already loaded (an error can only come from one that is), so that light
#: commands such as ``--help`` and ``rosters check`` load no LangChain, LangGraph or torch.
_USER_ERRORS = (
    ("mascot.cli.options", "UsageError"),
    ("mascot.policies.spec", "PolicyError"),
    ("mascot.training.jsonl", "JsonlError"),
    ("mascot.training.episodes.checkpoint_import", "CheckpointImportError"),
    ("mascot.training.episodes.rollout", "RolloutError"),
    ("mascot.training.judging.rubric", "RubricError"),
    ("mascot.training.data.pairs", "PairsError"),
    ("mascot.offline.model", "OfflineModelError"),
    ("mascot.offline.encoder", "OfflineEncoderError"),
    ("mascot.policies.vllm", "VllmError"),
)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the ``mascot`` command line and return its exit code."""
    parser = _parser()
    args, extra = parser.parse_known_args(argv)
    if extra and not hasattr(args, "trainer_flags"):
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    # TRL config fields of the training commands (--learning_rate 1e-5), after the recipe's own settings
    args.trainer_flags = [*getattr(args, "trainer_flags", []), *extra]
    args.argv = list(sys.argv[1:] if argv is None else argv)  # for worker processes
    args.allocate = lambda: None
    if argv is None and getattr(args, "allocator", None):
        # a command that trains starts again with freed memory kept (mascot.policies.allocator),
        # once it has checked its flags (a mistake is said without a second start): the setting
        # only takes effect at a process's start
        from mascot.policies.allocator import with_allocator

        mode = args.allocator(args) if callable(args.allocator) else args.allocator
        args.allocate = lambda: with_allocator(mode=mode)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
        handlers=[_ConsoleHandler()],
    )
    args.cleanup = ExitStack()  # what a command started (a vLLM server) stops when it ends
    if argv is None:
        stop_on_signals()
    try:
        with args.cleanup:
            return args.run(args)
    except RosterError as exc:  # a file with several problems: one line each
        return _fail(exc.summary, exc.problems)
    except KeyboardInterrupt:
        err.print("interrupted")
        return 130
    except Exception as exc:
        message = _user_error(exc)
        if message is None:
            raise
        return _fail(message)


def stop_on_signals() -> None:
    """Make SIGTERM, SIGHUP and SIGINT end this process as Ctrl-C does (``KeyboardInterrupt``),
    so what it started (a vLLM server in its own session, a stage's process) is stopped on
    the way out instead of being left running. SIGINT is set too because a process started
    as a shell's background job inherits it ignored, and Python then never raises
    ``KeyboardInterrupt``: ``kill -INT`` would do nothing."""
    def interrupt(signum: int, frame: object) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, interrupt)


def _user_error(exc: Exception) -> str | None:
    """The one-line message for an error a user can fix, or None for a defect (re-raised)."""
    if isinstance(exc, FileNotFoundError):
        return str(exc)
    if any(isinstance(exc, getattr(sys.modules[module], name))
           for module, name in _USER_ERRORS if module in sys.modules):
        return str(exc)
    openai = sys.modules.get("openai")
    if openai is not None and isinstance(exc, openai.APIConnectionError):
        return f"cannot reach the model server: {exc.__cause__ or exc}; is it running at that --base-url?"
    if openai is not None and isinstance(exc, openai.APIStatusError):
        return f"the model server answered {exc.status_code}: {exc.message}"
    return None


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
    data.add_commands(commands)
    judging.add_commands(commands)
    fitting.add_commands(commands)
    serve.add_commands(commands)
    evaluation.add_commands(commands)
    evaluation.add_show_command(commands)
    pipeline.add_commands(commands)
    offline_model.add_commands(commands)
    offline_encoder.add_commands(commands)
    tiny_model.add_commands(commands)
    return parser


if __name__ == "__main__":
    sys.exit(main())
