"""A saved adapter never appears beside its run's pending checkpoints (a kill between the two
would resume a finished run for one step more)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from mascot.training.fitting import adapter_folder
from mascot.training.fitting.adapter_folder import CARD_FILE, checkpoint_dir, is_finished, save_adapter


class _Saves:
    def save_pretrained(self, folder: Path) -> None:
        (Path(folder) / "weights.bin").write_bytes(b"w")


def test_checkpoints_are_gone_before_the_card_appears(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    target = tmp_path / "anchor"
    pending = checkpoint_dir(target) / "checkpoint-4"
    pending.mkdir(parents=True)
    (pending / "trainer_state.json").write_text("{}")
    seen: list[bool] = []
    rename = os.replace

    def watching(src: str | Path, dst: str | Path) -> None:
        if Path(dst) == target:  # the moment the card becomes visible
            seen.append(checkpoint_dir(target).exists())
        rename(src, dst)

    monkeypatch.setattr(adapter_folder.os, "replace", watching)
    save_adapter(_Saves(), _Saves(), target, {"method": "dpo"})
    assert seen == [False]
    assert (target / CARD_FILE).is_file() and is_finished(target)
    assert not (tmp_path / "checkpoints").exists()  # moved-away checkpoints are cleaned up too
