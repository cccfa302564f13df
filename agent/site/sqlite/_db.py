"""SQLite plumbing shared by the site modules.

Rules of this file:
* Connections run in autocommit mode (``isolation_level=None``); every
  transaction is opened explicitly with :func:`write_transaction` (``BEGIN
  IMMEDIATE``) or :func:`read_transaction` (``BEGIN``), so it is always clear
  which statements commit together.
* A function that opens a transaction never calls another that opens one;
  helpers that expect an open transaction say so in their docstring.
* SQLite errors leave this package as :class:`SiteError` subclasses only
  (see :func:`translate`); constraint errors that the apply path handles are
  caught there before they get here.
* A time a method records is its ``now`` argument (agent.site.clock);
  times are stored as ISO 8601 text in UTC (:func:`format_time`).
"""

from __future__ import annotations

import os
import sqlite3
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path
from typing import Iterator

from ..clock import in_utc
from ..errors import NotASite, SiteBusy, SiteDatabaseError, SiteError


DEFAULT_BUSY_TIMEOUT = 30.0  # seconds
CACHE_KIB = 16_384  # SQLite page cache per connection (see connect)
WAL_CHECKPOINT_PAGES = 10_000  # this connection's commits checkpoint the WAL past this many pages
WAL_KEEP_BYTES = 64 * 1024 * 1024  # a WAL file left larger is cut back to this after a checkpoint

_BUSY_CODES = {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED}


def sqlite_home(path: str | os.PathLike[str]) -> Path:
    """The agent's own folder (keys, spool, state) of the SQLite site in
    ``path``: ``<file>.agent`` beside it, so the two move together."""
    file = Path(path)
    return file.with_name(file.name + ".agent")


def quote_ident(name: str) -> str:
    """Quote an SQL identifier (table or column name) for SQLite."""
    return '"' + name.replace('"', '""') + '"'


def connect(path: str, *, busy_timeout: float = DEFAULT_BUSY_TIMEOUT) -> sqlite3.Connection:
    """Open ``path`` the way every fieldsync connection is opened.

    ``synchronous=FULL``: an apply is confirmed to the peer right after it
    commits, so a commit the disk later loses would be a confirmed
    transaction missing for ever.

    ``cache_size`` of :data:`CACHE_KIB`: one apply of a message's
    transactions dirties a page per row it changes; with SQLite's default
    2 MiB cache, random UPDATEs of a few thousand rows spill pages to the
    WAL before the commit and the savepoints of the fast path journal them
    again (apply of 2,500 random UPDATEs per transaction: 0.65 s against
    0.51 s with 32 MiB; benchmarks.e2e, receive_apply).  The cache is a bound,
    filled only as pages are used.

    ``temp_store = MEMORY``: the fast path of an apply runs each chunk of a
    run in a savepoint, whose journal holds the pages the chunk changes;
    SQLite keeps it in memory up to 64 KiB and then in a temporary file,
    which a chunk of random UPDATEs passed every time (the remote's apply in
    benchmarks.e2e wrote 200 MB to temporary files in 97,000 writes).  In
    memory it is bounded by one chunk's pages.  Temporary files hold nothing
    a crash needs (the WAL does): durability is the same.

    ``wal_autocheckpoint`` of :data:`WAL_CHECKPOINT_PAGES` (SQLite's
    default is 1,000): an apply commits a few thousand pages at a time, so
    with the default every commit copied its pages into the database file
    again; every 10,000 pages (40 MiB of WAL) a page rewritten by several
    applies is copied once (the remote's apply in benchmarks.e2e: 0.90 s
    to 0.84 s).  ``journal_size_limit`` cuts the WAL file back to
    :data:`WAL_KEEP_BYTES` after a checkpoint.  Both are this connection's
    own: an application's connections keep their settings.
    """
    conn = None
    try:
        conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False,
                               cached_statements=512, timeout=busy_timeout)
        conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        conn.execute("PRAGMA synchronous = FULL")
        conn.execute(f"PRAGMA cache_size = -{CACHE_KIB}")
        conn.execute("PRAGMA temp_store = MEMORY")
        conn.execute(f"PRAGMA wal_autocheckpoint = {WAL_CHECKPOINT_PAGES}")
        conn.execute(f"PRAGMA journal_size_limit = {WAL_KEEP_BYTES}")
    except sqlite3.DatabaseError as error:
        if conn is not None:
            conn.close()
        code = getattr(error, "sqlite_errorcode", None)
        if code is not None and code & 0xFF in _BUSY_CODES:
            raise translate(error, f"opening {path}") from error
        if code is not None and code & 0xFF == sqlite3.SQLITE_CANTOPEN:
            raise NotASite(_cannot_open(path, error)) from error
        raise NotASite(f"{path}: cannot open as an SQLite database ({error})") from error
    return conn


def _cannot_open(path: str, error: sqlite3.Error) -> str:
    """Why SQLite could not open ``path``, when the file system says."""
    folder = os.path.dirname(path) or "."
    if os.path.isdir(folder) and not os.access(folder, os.W_OK | os.X_OK):
        return (f"{path}: cannot open: the folder {folder} is not writable by this user, and SQLite keeps a "
                "database's -wal and -shm files beside it")
    if os.path.isfile(path) and not os.access(path, os.R_OK | os.W_OK):
        return f"{path}: cannot open: the file is not readable and writable by this user"
    return f"{path}: cannot open as an SQLite database ({error})"


def translate(error: sqlite3.Error, doing: str) -> SiteError:
    """The SiteError to raise for an SQLite error met while ``doing``."""
    code = getattr(error, "sqlite_errorcode", None)
    if code is not None and code & 0xFF in _BUSY_CODES:
        return SiteBusy(f"{doing}: the database stayed locked by another connection ({error}); "
                        "retry later or raise the busy timeout")
    return SiteDatabaseError(f"{doing}: SQLite error: {error}")


@contextmanager
def write_transaction(conn: sqlite3.Connection, doing: str) -> Iterator[sqlite3.Connection]:
    """``BEGIN IMMEDIATE`` ... ``COMMIT``; roll back on any exception.

    Holding the write lock from the start means the transaction sees every
    committed change and nobody commits until it ends.
    """
    with _transaction(conn, doing, "BEGIN IMMEDIATE") as same:
        yield same


@contextmanager
def read_transaction(conn: sqlite3.Connection, doing: str) -> Iterator[sqlite3.Connection]:
    """A read transaction: all reads inside see one snapshot (WAL)."""
    with _transaction(conn, doing, "BEGIN") as same:
        yield same


@contextmanager
def _transaction(conn: sqlite3.Connection, doing: str, begin: str) -> Iterator[sqlite3.Connection]:
    try:
        conn.execute(begin)
    except sqlite3.Error as error:
        raise translate(error, doing) from error
    try:
        yield conn
        conn.execute("COMMIT")
    except BaseException as error:
        _rollback(conn)
        if isinstance(error, sqlite3.Error):
            raise translate(error, doing) from error
        raise


@contextmanager
def sqlite_errors(doing: str) -> Iterator[None]:
    """Translate SQLite errors of statements run outside an explicit transaction."""
    try:
        yield
    except sqlite3.Error as error:
        raise translate(error, doing) from error


def _rollback(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        try:
            conn.execute("ROLLBACK")
        except sqlite3.Error:
            pass  # the original error is the one to report


def format_time(moment: datetime | None) -> str | None:
    """Times are stored as ISO 8601 text in UTC (sortable, readable in SQL)."""
    utc = in_utc(moment)
    return None if utc is None else utc.isoformat()


def parse_time(text: str | None) -> datetime | None:
    return None if text is None else datetime.fromisoformat(text)
