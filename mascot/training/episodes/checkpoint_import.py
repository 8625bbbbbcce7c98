"""Checkpoint import: conversations a LangGraph app stored with a checkpointer, as episodes.

A deployed app keeps each conversation as a thread in its checkpointer database. The import
reads the latest checkpoint of every thread's root graph (``checkpoint_ns == ""``) and
appends one ``Episode`` per thread to a JSONL file, so an app's own logs can be judged and
trained on like rollouts. Databases are opened read-only; re-importing is idempotent (the
episode id is derived from the thread id, and ids already in the file are skipped).

Database URIs:

- ``sqlite:///relative/path.db`` and ``sqlite:////absolute/path.db`` (SQLAlchemy's
  convention: three slashes, then the path; an absolute path starts with a fourth), read
  with ``langgraph.checkpoint.sqlite.SqliteSaver``;
- ``postgresql://user:password@host:port/db`` (or ``postgres://``), read with
  ``langgraph.checkpoint.postgres.PostgresSaver`` (``pip install "mascot[postgres]"``).
"""

from __future__ import annotations

import hashlib
import logging
import re
import sqlite3
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, closing, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import parse_qsl, unquote, urlsplit, urlunsplit

from langchain_core.messages import BaseMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.sqlite import SqliteSaver

from mascot.training.episodes.episode import Episode, EpisodeSource, episode_from_state, read_episodes
from mascot.training.jsonl import JsonlAppender, JsonlError, check_writable, exclusive

logger = logging.getLogger(__name__)

#: URI schemes ``import_checkpoints`` reads.
SCHEMES = ("sqlite", "postgresql", "postgres")
_THREADS_SQL = "SELECT DISTINCT thread_id FROM checkpoints WHERE checkpoint_ns = '' ORDER BY thread_id"


class CheckpointImportError(ValueError):
    """A checkpointer database cannot be imported; the message is one line for the user."""


@dataclass
class ImportReport:
    """What an import did (``threads == imported + already + len(unreadable)``).

    Attributes:
        threads: Threads looked at (every thread of the database, or the ones asked for).
        imported: New episodes appended to ``out``.
        already: Threads whose episode was already in ``out`` (nothing written).
        unreadable: ``(thread id, one-line reason)`` of threads that were not imported.
        out: The episode file.
    """

    threads: int
    imported: int
    already: int
    unreadable: list[tuple[str, str]]
    out: Path


@dataclass
class _Database:
    saver: BaseCheckpointSaver
    threads: list[str]
    errors: tuple[type[Exception], ...]  # the driver's errors: the database failed, not a thread


def episode_id(thread_id: str) -> str:
    """The stable episode id of a checkpointer thread."""
    return "thread-" + hashlib.sha256(thread_id.encode("utf-8")).hexdigest()[:16]


def import_checkpoints(
    uri: str,
    *,
    roster: str,
    out: str | Path,
    thread_ids: Sequence[str] | None = None,
    redact: Callable[[str], str] | None = None,
) -> ImportReport:
    """Append one episode per checkpointer thread to a JSONL file.

    Works on the director graph's state (directions, scenario, user profile and the stage
    direction of every persona turn are kept) and on any app whose state has a
    ``messages`` list with named AI messages. A thread that cannot be read (a checkpoint
    that does not deserialise, no ``messages`` list, no conversation in it, an unknown id)
    is reported in ``ImportReport.unreadable`` and logged as a warning; the others are
    still imported.

    Args:
        uri: The database: ``sqlite:///relative.db``, ``sqlite:////absolute.db`` or
            ``postgresql://...`` (see the module docstring).
        roster: Roster id recorded in every episode.
        out: The episode file (JSONL, appended to; created if missing).
        thread_ids: Import only these threads (default: every thread).
        redact: Applied to every written line (e.g. to remove secrets).

    Returns:
        What was imported, already there, or unreadable.

    Raises:
        CheckpointImportError: on an unknown URI scheme, a missing or non-SQLite file, a
            database without LangGraph's checkpoint tables, an unreachable server, the
            postgres extra not installed, or an episode file that cannot be used. The
            message never contains the URI's password.
    """
    opener = _opener(uri)
    try:
        out = check_writable(out)
        with exclusive(out):
            return _import(opener, uri, roster=roster, out=out, thread_ids=thread_ids, redact=redact)
    except JsonlError as exc:
        raise CheckpointImportError(str(exc)) from None


def _import(
    opener: Callable[[str], AbstractContextManager[_Database]],
    uri: str,
    *,
    roster: str,
    out: Path,
    thread_ids: Sequence[str] | None,
    redact: Callable[[str], str] | None,
) -> ImportReport:
    shown = _masked(uri)
    done = {episode.id for episode in read_episodes(out)}
    report = ImportReport(threads=0, imported=0, already=0, unreadable=[], out=out)
    with opener(uri) as database, JsonlAppender(out, redact=redact) as appender:
        known = set(database.threads)
        wanted = list(dict.fromkeys(thread_ids)) if thread_ids is not None else database.threads
        for thread_id in wanted:
            report.threads += 1
            if thread_id in known and episode_id(thread_id) in done:
                report.already += 1
                continue
            episode = _read_thread(database, thread_id, roster) if thread_id in known else "no such thread"
            if isinstance(episode, str):
                logger.warning("%s: thread %r not imported: %s", shown, thread_id, episode)
                report.unreadable.append((thread_id, episode))
                continue
            appender.write(episode.record())
            done.add(episode.id)
            report.imported += 1
    logger.info("%s: %d threads, %d imported, %d already in %s, %d unreadable", shown, report.threads,
                report.imported, report.already, out, len(report.unreadable))
    return report


def _read_thread(database: _Database, thread_id: str, roster: str) -> Episode | str:
    """The thread's episode, or the reason it cannot be read."""
    config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    try:
        found = database.saver.get_tuple(config)
    except database.errors:
        raise  # the database failed: the opener turns it into one line
    except Exception as exc:  # the serializer raises whatever its decoder raises on bad bytes
        return f"checkpoint cannot be deserialised ({type(exc).__name__}: {_first_line(exc)})"
    if found is None:
        return "no checkpoint in the root graph"
    state = found.checkpoint.get("channel_values") if isinstance(found.checkpoint, dict) else None
    if not isinstance(state, dict):
        return "checkpoint cannot be deserialised (no channel values)"
    messages = state.get("messages")
    if not isinstance(messages, list):
        return "the state has no 'messages' list"
    if not all(isinstance(m, BaseMessage) for m in messages):
        return "'messages' holds something other than LangChain messages"
    checkpoint_id = found.config["configurable"]["checkpoint_id"]
    source = EpisodeSource(kind="checkpoint", thread_id=thread_id, checkpoint_id=checkpoint_id)
    try:
        episode = episode_from_state(state, id=episode_id(thread_id), roster=roster, source=source)
    except ValueError as exc:
        return f"the state is not a conversation ({_first_line(exc)})"
    if not any(m.role in ("user", "assistant") for m in episode.messages):
        return "no conversation in 'messages' (no turns of a person or an AI)"
    return episode


def _opener(uri: str) -> Callable[[str], AbstractContextManager[_Database]]:
    scheme = uri.partition(":")[0].lower() if ":" in uri else ""
    if scheme == "sqlite":
        return _open_sqlite
    if scheme in ("postgresql", "postgres"):
        return _open_postgres
    raise CheckpointImportError(
        f"unsupported database URI '{_masked(uri)}'; use sqlite:///relative/path.db, "
        f"sqlite:////absolute/path.db or postgresql://user@host/db (schemes: {', '.join(SCHEMES)})"
    )


@contextmanager
def _open_sqlite(uri: str) -> Iterator[_Database]:
    if not uri.startswith("sqlite:///") or uri == "sqlite:///":
        raise CheckpointImportError(
            f"bad SQLite URI '{uri}'; use sqlite:///relative/path.db or sqlite:////absolute/path.db"
        )
    path = Path(uri.removeprefix("sqlite:///")).expanduser()
    if not path.is_file():
        raise CheckpointImportError(f"no SQLite database at {path}{' (a directory)' if path.is_dir() else ''}")
    conn = _sqlite_connection(path)
    try:
        saver = SqliteSaver(conn)
        saver.setup()  # explicit, so that a failure is reported as the database's
        yield _Database(saver, [row[0] for row in conn.execute(_THREADS_SQL)], (sqlite3.Error,))
    except sqlite3.Error as exc:
        raise CheckpointImportError(f"{path} cannot be read ({_first_line(exc)})") from None
    finally:
        conn.close()


def _sqlite_connection(path: Path) -> sqlite3.Connection:
    """A read-only connection to a SqliteSaver database, after checking that it is one."""
    location = path.resolve().as_uri()  # escapes '?', '#' and '%' in the path
    try:
        with closing(sqlite3.connect(f"{location}?mode=ro", uri=True)) as probe:
            tables = {row[0] for row in probe.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            journal = probe.execute("PRAGMA journal_mode").fetchone()[0]
    except sqlite3.DatabaseError as exc:
        what = "is not a SQLite database" if "not a database" in str(exc) else f"cannot be read ({exc})"
        raise CheckpointImportError(f"{path} {what}") from None
    if not {"checkpoints", "writes"} <= tables:
        raise CheckpointImportError(f"{path} has no LangGraph checkpoint tables: not a SqliteSaver database")
    # SqliteSaver.setup() switches the database to WAL mode, which a read-only connection
    # refuses. A database in another mode is not being written by a LangGraph saver (whose
    # setup switched it to WAL), e.g. a VACUUM INTO copy, so it can be opened as immutable,
    # which turns that switch into a no-op and leaves the file as it is.
    options = "mode=ro" if journal == "wal" else "mode=ro&immutable=1"
    return sqlite3.connect(f"{location}?{options}", uri=True, check_same_thread=False)


@contextmanager
def _open_postgres(uri: str) -> Iterator[_Database]:
    try:
        import psycopg
        from langgraph.checkpoint.postgres import PostgresSaver
    except ImportError:
        raise CheckpointImportError(
            'reading a Postgres checkpointer needs the postgres extra: pip install "mascot[postgres]"'
        ) from None
    shown = _masked(uri)
    try:
        with PostgresSaver.from_conn_string(uri) as saver:
            try:
                threads = [row["thread_id"] for row in saver.conn.execute(_THREADS_SQL)]
            except psycopg.errors.UndefinedTable:
                raise CheckpointImportError(f"{shown} has no LangGraph checkpoints table") from None
            yield _Database(saver, threads, (psycopg.Error,))
    except psycopg.Error as exc:
        raise CheckpointImportError(f"cannot read {shown}: {_scrub(_first_line(exc), uri)}") from None


def _secrets(uri: str) -> list[str]:
    """Passwords in a URI: in the user info or as a ``password`` query parameter."""
    try:
        parts = urlsplit(uri)
    except ValueError:  # e.g. a broken IPv6 host: treat everything after the scheme as secret
        return [uri.partition("://")[2]]
    found = [value for key, value in parse_qsl(parts.query) if key == "password"]
    userinfo, at, _ = parts.netloc.rpartition("@")
    if at and ":" in userinfo:
        raw = userinfo.partition(":")[2]
        found += [raw, unquote(raw)]
    return [secret for secret in found if secret]


def _scrub(text: str, uri: str) -> str:
    """``text`` with every password of ``uri`` replaced by ``***``."""
    for secret in sorted(_secrets(uri), key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


def _masked(uri: str) -> str:
    """The URI as it may be shown: passwords replaced by ``***``."""
    if not _secrets(uri):
        return uri
    try:
        parts = urlsplit(uri)
    except ValueError:
        return _scrub(uri, uri)
    userinfo, at, hostport = parts.netloc.rpartition("@")
    netloc = f"{userinfo.partition(':')[0]}:***@{hostport}" if at and ":" in userinfo else parts.netloc
    query = re.sub(r"(?<![^&])password=[^&]*", "password=***", parts.query)
    return urlunsplit(parts._replace(netloc=netloc, query=query))


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0].strip() if lines else type(exc).__name__
