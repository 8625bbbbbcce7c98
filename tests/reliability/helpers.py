"""Running the ``mascot`` command line from the reliability tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

MASCOT = str(Path(sys.executable).parent / "mascot")


def mascot(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``mascot ARGS`` offline and return what it did."""
    return subprocess.run([MASCOT, *args], capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})})


def write_warm_over_curt_pairs(episodes: Path, folder: Path) -> Path:
    """Preference pairs on every persona turn of ``episodes``: a warm reply over a curt one."""
    from mascot.messages import chat_messages
    from mascot.rosters import load_roster
    from mascot.training.data.candidates import candidate_contexts
    from mascot.training.data.pairs import build_pairs, write_pairs
    from mascot.training.episodes.episode import read_episodes
    from mascot.training.judging.judgement import JudgedCandidate

    judged = [JudgedCandidate(context_id=c.context_id, prompt=chat_messages(c.prompt), persona=c.persona, reply=reply,
                              overall=overall)
              for c in candidate_contexts(read_episodes(episodes), load_roster("emotional_support"))
              for reply, overall in (("That sounds hard. What would help most tonight?", 90.0), ("fine.", 10.0))]
    write_pairs(build_pairs(judged, test_fraction=0.0), folder)
    return folder


def records(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, which must all be whole JSON objects (no torn records)."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), f"{path} ends in a torn record"
    return [json.loads(line) for line in text.splitlines()]
