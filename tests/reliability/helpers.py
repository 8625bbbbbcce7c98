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


def records(path: Path) -> list[dict[str, Any]]:
    """Every line of a JSONL file, which must all be whole JSON objects (no torn records)."""
    text = path.read_text(encoding="utf-8")
    assert text == "" or text.endswith("\n"), f"{path} ends in a torn record"
    return [json.loads(line) for line in text.splitlines()]
