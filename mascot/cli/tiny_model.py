"""``mascot tiny-model``: a tiny random-weight model for dry runs and tests, offline."""

from __future__ import annotations

import argparse

from mascot.cli.options import out


def add_commands(commands: argparse._SubParsersAction) -> None:
    """Add ``tiny-model``."""
    tiny = commands.add_parser("tiny-model", help="build a tiny random-weight model offline")
    tiny.add_argument("--out", required=True, metavar="DIR", help="folder of the model (and its policies.yaml)")
    tiny.add_argument("--arch", choices=("qwen3", "llama"), default="qwen3",
                      help="architecture of the random weights (the tokenizer and chat template follow it)")
    tiny.add_argument("--with-adapters", action="store_true",
                      help="also save a non-zero LoRA adapter per persona, named in policies.yaml")
    tiny.add_argument("--roster", default="emotional_support", metavar="ID_OR_PATH",
                      help="roster whose roles policies.yaml (and --with-adapters) names")
    tiny.add_argument("--seed", type=int, default=0, help="seed of the random weights")
    tiny.set_defaults(run=_tiny_model)


def _tiny_model(args: argparse.Namespace) -> int:
    from mascot.testing.tiny_model import POLICY_FILE, build_tiny_model  # needs the train extra (torch)

    path = build_tiny_model(args.out, arch=args.arch, with_adapters=args.with_adapters,
                            roster=args.roster, seed=args.seed)
    out.print(f"tiny {args.arch} model written to {path}", markup=False)
    roles = "every role on this model"
    if args.with_adapters:
        out.print(f"adapters in {path / 'adapters'}", markup=False)
        roles += ", each persona with its adapter"
    out.print(f"policy file {path / POLICY_FILE} ({roles}): --policies {path / POLICY_FILE}", markup=False)
    return 0
