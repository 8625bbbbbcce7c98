"""A trained adapter's folder: saved whole with its card, and the checkpoints a run resumes from.

Every trainer (speaker GRPO and DPO, Director GRPO, reward models; see ``lora_run``) writes
``OUT/<name>/``: the PEFT adapter, the tokenizer, ``adapter_card.json`` and a ``README.md``
model card. The folder is written beside the old one and swapped in with
renames, so a crash never leaves half an adapter. While training, TRL's trainer saves
checkpoints under ``OUT/checkpoints/<name>/``; the same command run again resumes from the
last one, and they are removed once the adapter is saved.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import peft
import transformers
import trl
from transformers.trainer_utils import get_last_checkpoint

from mascot.policies.local.model_loading import quiet_loading

logger = logging.getLogger(__name__)

#: The description file saved beside each adapter; its presence marks an adapter folder.
CARD_FILE = "adapter_card.json"
#: Version of ``CARD_FILE``'s format (2: one format for every method, ``lora_run``'s).
FORMAT_VERSION = 2
#: Folder of ``OUT`` that holds the running trainers' checkpoints.
CHECKPOINTS = "checkpoints"


class AdapterFolderError(ValueError):
    """An adapter cannot be written where asked; the message is one line."""


def adapter_target(out: str | Path, name: str) -> Path:
    """``out/<name>``, checked: a usable name, and not a folder of something else.

    Raises:
        AdapterFolderError: on a name that is no folder name, or a target that exists and
            is not an adapter folder.
    """
    if not name or "/" in name or name.startswith(".") or name == CHECKPOINTS:
        raise AdapterFolderError(f"adapter name '{name}' cannot be a folder name")
    out = Path(out).expanduser()
    out.mkdir(parents=True, exist_ok=True)
    target = out / name
    if target.exists() and not target.is_dir():
        raise AdapterFolderError(f"{target} exists and is not a folder")
    if target.is_dir() and any(target.iterdir()) and not (target / CARD_FILE).is_file():
        raise AdapterFolderError(f"{target} holds something other than an adapter; not replacing it")
    return target


def checkpoint_dir(target: Path) -> Path:
    """Where the trainer of the adapter ``target`` saves its checkpoints."""
    return target.parent / CHECKPOINTS / target.name


def is_finished(target: Path) -> bool:
    """Whether ``target`` holds a saved adapter and no interrupted run of it is pending."""
    pending = checkpoint_dir(target)
    return (target / CARD_FILE).is_file() and not (pending.is_dir() and get_last_checkpoint(str(pending)))


def train_resuming(trainer: Any) -> Any:
    """Run ``trainer.train()``, resuming from the last checkpoint in its ``output_dir``.

    Returns:
        ``trainer.train()``'s output.
    """
    folder = Path(trainer.args.output_dir)
    last = get_last_checkpoint(str(folder)) if folder.is_dir() else None
    if last:
        logger.warning("resuming from %s", last)
    return trainer.train(resume_from_checkpoint=last)


def save_adapter(model: Any, tokenizer: Any, target: Path, card: Mapping[str, Any], *,
                 readme: str | None = None) -> None:
    """Save a PEFT model's adapter, the tokenizer and the card to ``target``, whole or not at all.

    The card gets ``format``, ``created_at`` and library ``versions`` added; ``readme``
    replaces PEFT's stub ``README.md``. The run's checkpoints are removed once the adapter
    is in place.
    """
    card = {"format": FORMAT_VERSION, **card, "created_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "versions": {"trl": trl.__version__, "transformers": transformers.__version__,
                         "peft": peft.__version__}}

    checkpoints = target.parent / CHECKPOINTS

    def write(stage: Path) -> None:
        with quiet_loading():
            model.save_pretrained(stage)
        tokenizer.save_pretrained(stage)
        if readme is not None:
            (stage / "README.md").write_text(readme, encoding="utf-8")
        (stage / CARD_FILE).write_text(json.dumps(card, indent=2, default=str) + "\n", encoding="utf-8")
        # The run's checkpoints leave (in one rename) before the card appears: a process
        # killed between the two must never find a card beside pending checkpoints, which
        # reads as an interrupted retraining and resumes for one step more.
        if checkpoint_dir(target).is_dir():
            os.replace(checkpoint_dir(target), Path(tempfile.mkdtemp(prefix=f".{target.name}.done-", dir=checkpoints))
                       / target.name)

    replace_folder(target, write)
    for done in checkpoints.glob(".*.done-*") if checkpoints.is_dir() else ():
        shutil.rmtree(done, ignore_errors=True)  # this run's, and any a killed run left
    if checkpoints.is_dir() and not any(checkpoints.iterdir()):
        checkpoints.rmdir()


def replace_folder(target: Path, write: Callable[[Path], None]) -> None:
    """Fill a fresh folder beside ``target`` with ``write``, then swap it in with renames;
    on any error the fresh folder is removed and ``target`` is left as it was."""
    stage = Path(tempfile.mkdtemp(prefix=f".{target.name}.new-", dir=target.parent))
    try:
        write(stage)
        os.chmod(stage, 0o755)  # mkdtemp makes it private
        if target.exists():
            old = Path(tempfile.mkdtemp(prefix=f".{target.name}.old-", dir=target.parent))
            os.replace(target, old / target.name)
            os.replace(stage, target)
            shutil.rmtree(old)
        else:
            os.replace(stage, target)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise


def base_reference(source: str) -> str:
    """The base model as a card records it: a local folder absolute, a Hub id as given."""
    return str(Path(source).resolve()) if Path(source).is_dir() else source

