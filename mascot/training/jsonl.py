"""JSONL files that survive crashes: whole-line appends, torn-tail repair, atomic rewrites.

Every record file of the pipeline (episodes, failures, traces) is JSONL. A record is
written with one ``write`` call on a file opened for appending and flushed to disk, so a
reader sees whole lines only; a process killed in the middle of a write can leave at most
one torn last line, which ``repair_tail`` removes before anything is appended again.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from mascot.redaction import file_redactor
from mascot.rosters.yaml_file import first_error_line

logger = logging.getLogger(__name__)

Record = TypeVar("Record", bound=BaseModel)


class JsonlError(ValueError):
    """A record file cannot be used; the message is one line naming the file."""


def check_writable(path: str | Path) -> Path:
    """Return ``path`` as a ``Path`` if a record file can be created there.

    Raises:
        JsonlError: if its directory does not exist or ``path`` is a directory.
    """
    path = Path(path).expanduser()
    if path.is_dir():
        raise JsonlError(f"{path} is a directory, not a file")
    if path.exists() and not path.is_file():
        raise JsonlError(f"{path} is not a regular file")
    if not path.parent.is_dir():
        raise JsonlError(f"directory of {path} does not exist")
    return path


@contextmanager
def exclusive(path: str | Path) -> Iterator[None]:
    """Hold the lock of a record file (``PATH.lock``) so that no other run writes to it.

    Raises:
        JsonlError: if another process holds it.
    """
    lock_path = Path(f"{path}.lock")
    with lock_path.open("a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise JsonlError(f"{path} is being written by another run (lock {lock_path})") from None
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def read_jsonl(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield ``(line number, object)`` for every readable line of a JSONL file.

    A line that is not a JSON object is skipped with a warning naming its number; the
    rest of the file is still read. A missing file yields nothing.
    """
    path = Path(path)
    if not path.exists():
        return
    for number, raw in _lines(path):
        if not raw.strip():
            continue
        torn = not raw.endswith(b"\n")
        try:
            record = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError):
            record = None
        if not isinstance(record, dict):
            what = "torn last line (an interrupted write?)" if torn else "corrupt line"
            logger.warning("%s:%d: skipped a %s", path, number, what)
            continue
        yield number, record


def read_records(path: str | Path, model: type[Record], what: str, *,
                 skip_invalid: bool = False) -> Iterator[tuple[int, Record]]:
    """Yield ``(line number, record)`` for every line of a JSONL file, validated as ``model``.

    Lines that are not JSON objects are skipped as ``read_jsonl`` does; a missing file
    yields nothing.

    Raises:
        JsonlError: ``PATH:LINE: not WHAT (field 'F': why)`` for the first line that does
            not validate (with ``skip_invalid``: a warning in those words, and the line is
            skipped), or when the file cannot be read.
    """
    for number, data in read_jsonl(path):
        try:
            record = model.model_validate(data)
        except ValidationError as exc:
            message = f"{path}:{number}: not {what} ({first_error_line(exc)})"
            if not skip_invalid:
                raise JsonlError(message) from None
            logger.warning("%s; skipped", message)
            continue
        yield number, record



def _lines(path: Path) -> Iterator[tuple[int, bytes]]:
    """Numbered raw lines, with read errors as one-line ``JsonlError``."""
    try:
        with path.open("rb") as handle:
            yield from enumerate(handle, start=1)
    except OSError as exc:
        raise JsonlError(f"cannot read {path} ({exc.strerror})") from None


def repair_tail(path: str | Path) -> bool:
    """Make a JSONL file end with a whole line before anything is appended to it.

    A last line without its newline is either complete JSON (a newline is added) or the
    torn remains of an interrupted write (it is cut off, with a warning).

    Returns:
        Whether the file was changed.
    """
    path = Path(path)
    if not path.is_file() or path.stat().st_size == 0:
        return False
    with path.open("rb+") as handle:
        data = handle.read()
        if data.endswith(b"\n"):
            return False
        start = data.rfind(b"\n") + 1
        try:
            json.loads(data[start:])
        except (json.JSONDecodeError, UnicodeDecodeError):
            logger.warning(
                "%s: dropped a torn last line of %d bytes (an interrupted write)",
                path,
                len(data) - start,
            )
            handle.truncate(start)
        else:
            handle.write(b"\n")
        handle.flush()
        os.fsync(handle.fileno())
    return True


class JsonlAppender:
    """Appends records to a JSONL file, one whole line per ``write``, flushed to disk.

    Safe to share between threads. Open it as a context manager or call ``close``.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        redact: Callable[[str], str] | None = None,
        fsync: bool = True,
        repair: bool = True,
    ) -> None:
        """Open ``path`` for appending (created if missing, torn tail repaired).

        Args:
            path: The JSONL file.
            redact: Applied to every string value of a record; keys and structure are
                never touched. Default: ``file_redactor()``, which masks API keys from the
                environment (a model server may echo one back into a reply).
            fsync: Flush every record to disk (crash safety) or leave it to the OS.
            repair: Repair a torn tail first. Turn off when other processes append to
                the file at the same time (one of them repairs it before they start).

        Raises:
            JsonlError: if the file cannot be opened.
        """
        self.path = check_writable(path)
        if repair:
            repair_tail(self.path)
        try:
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        except OSError as exc:
            raise JsonlError(f"cannot write {self.path} ({exc.strerror})") from None
        self._redact = redact if redact is not None else file_redactor()
        self._fsync = fsync
        self._lock = threading.Lock()

    def write(self, record: dict[str, Any]) -> None:
        """Append one record as one line."""
        if self._redact:  # an empty Redactor is falsy: nothing to mask
            record = _map_strings(record, self._redact)
        line = json.dumps(record, ensure_ascii=False, separators=(",", ":"))
        data = (line + "\n").encode("utf-8")
        with self._lock:
            view = memoryview(data)
            while view:  # one write for a regular file; the loop only guards short writes
                view = view[os.write(self._fd, view) :]
            if self._fsync:
                os.fsync(self._fd)

    def close(self) -> None:
        """Close the file."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def __enter__(self) -> JsonlAppender:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _map_strings(value: Any, change: Callable[[str], str]) -> Any:
    if isinstance(value, str):
        return change(value)
    if isinstance(value, dict):
        return {key: _map_strings(item, change) for key, item in value.items()}
    if isinstance(value, list):
        return [_map_strings(item, change) for item in value]
    return value


def rewrite_jsonl(path: str | Path, records: Iterable[dict[str, Any]]) -> None:
    """Replace a JSONL file with ``records`` atomically (temporary file, then rename), API
    keys masked as by ``JsonlAppender``.

    A crash leaves either the old file or the new one, never a mix.
    """
    path = Path(path)
    redact = file_redactor()
    mode = path.stat().st_mode & 0o777 if path.exists() else 0o644
    handle = tempfile.NamedTemporaryFile(
        "w", encoding="utf-8", dir=path.parent, prefix=f".{path.name}.", delete=False
    )
    try:
        with handle:
            for record in records:
                record = _map_strings(record, redact) if redact else record
                handle.write(json.dumps(record, ensure_ascii=False, separators=(",", ":")) + "\n")
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(handle.name, mode)  # keep the file's permissions, not the temporary 0600
        os.replace(handle.name, path)
    except BaseException:
        Path(handle.name).unlink(missing_ok=True)
        raise
