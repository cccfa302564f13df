"""fieldsync's own tables inside a site database, and the site identity.

Rules of this file:
* Every table fieldsync creates is named ``fieldsync_*`` so it never clashes
  with an application table; publishing a ``fieldsync_*`` table is refused.
* The layout has a version (``fieldsync_site.schema_version``); a database
  written by a newer layout is refused rather than misread, one written by
  an older layout is upgraded when opened (see _UPGRADES).
* The capture table's value columns have no declared type, so SQLite stores
  each value exactly as the application's row held it (no affinity); they
  are named and added by capture.py, which this module builds on.
* No secret is ever stored here: every user an application lets read the
  database could read it.  The site row holds its public key line only; the
  secret key is the agent's business (agent/keyfiles.py).
"""

from __future__ import annotations

import logging
import os
import sqlite3
from datetime import datetime
from pathlib import Path
from typing import Callable

from ..clock import utc_now
from ..errors import AlreadyASite, InvalidSetting, NotASite, SecretInDatabase, UnsupportedSiteVersion
from ..identity import Role, SiteIdentity, check_name, check_role, check_texts, new_incarnation
from ._db import connect, format_time, parse_time, translate, write_transaction
from .capture import APPLYING_TABLE, upgrade_capture, value_column

log = logging.getLogger("fieldsync.site")

# 1: the first layout.  2: at the consolidated, key indexes on the capture
# table and capture triggers that cannot abort (capture.upgrade_capture).
# 3: fieldsync_replaced_copy, the incarnations of remotes extracted again.
# 4: fieldsync_site without its ``secret`` column (see _drop_secret).
# 5: fieldsync_remote's log_read, heartbeat and control_sent_at (docs/protocol.md).
# 6: transport settings stored with the site: fieldsync_site.reply_address,
#    fieldsync_remote.inbox and fieldsync_transport_option (agent/site/sqlite/settings.py).
# 7: fieldsync_remote.heard_at, when a message of the peer last arrived (docs/protocol.md).
# 8: fieldsync_remote's confirm_timeout, data_sent_at, peer_confirmed, probes and
#    confirm_owed: never silent while something is outstanding (docs/protocol.md, rule 3);
#    its error_count, error_seen_at, stream_stopped and stream_stopped_at, and
#    fieldsync_apply_error.acknowledged_at: the errors in force apart from their history
#    (docs/cli.md, "agent status").
# 9: fieldsync_subscription.since and .until, the commit offsets between which a
#    subscription holds: subscription changes travel through the stream
#    (docs/site-database.md, "Changing a remote's subscriptions").
# 10: fieldsync_article.follows, follow_columns, parent_columns and route_sql:
#    rows that follow their parent (docs/site-database.md, agent/site/sqlite/route.py).
# 11: fieldsync_schema_change, the schema changes made or applied here
#    (docs/site-database.md, "Schema changes").
# 12: fieldsync_remote.peer_schema_version, the schema version a remote
#    reported (docs/protocol.md, "Schema versions").
# 13: fieldsync_article keyed by table and publication: a table may be an
#    article of several publications (docs/site-database.md, "A table in
#    several publications").
# 14: fieldsync_log.applied, for the log transaction of an apply that wrote
#    rows back to the peer: the peer's offset the apply reached (docs/protocol.md,
#    "What a data message says of the recipient's own changes").
# 15: fieldsync_removed_article, the articles removed where extracted remotes
#    held them, read for the log transactions before their removal
#    (docs/site-database.md, "Removing an article").
# 16: fieldsync_site.common_read and fieldsync_remote.follows_common: the
#    read position a send phase moves once for every pair its range holds
#    nothing for (read_positions.py; docs/protocol.md, "The common read position").
SCHEMA_VERSION = 16
INITIAL_VALUE_COLUMNS = 16


# The site row's columns of layout 4, in table order (layout 4 dropped
# ``secret``; _drop_secret copies these, layout 6 adds reply_address after).
SITE_COLUMNS = ("id", "schema_version", "name", "role", "incarnation", "address", "transport", "public_key",
                "created_at", "truncated_through")
SITE_TABLE = """CREATE TABLE fieldsync_site (
    id                INTEGER PRIMARY KEY CHECK (id = 1),
    schema_version    INTEGER NOT NULL,
    name              TEXT NOT NULL,
    role              TEXT NOT NULL CHECK (role IN ('consolidated', 'remote')),
    incarnation       BLOB NOT NULL CHECK (length(incarnation) = 16),
    address           TEXT,
    transport         TEXT,
    public_key        TEXT,
    created_at        TEXT NOT NULL,
    truncated_through INTEGER NOT NULL DEFAULT 0
)"""

_TABLES = """
{site};
-- One row per captured row change, written by the triggers.  seq is the
-- rowid: SQLite allocates max(seq)+1, and truncation never deletes the row
-- holding the largest seq, so seq only grows.
CREATE TABLE fieldsync_capture (
    seq   INTEGER PRIMARY KEY,
    shape INTEGER NOT NULL,
    kind  INTEGER NOT NULL,
    flags INTEGER,
    {value_columns}
);
-- One row per log transaction: it holds the capture rows with seq in
-- [first_seq, commit_offset].  The commit offset is the seq of its last row.
-- applied: of an apply's rows written back to their origin, the origin's
-- log offset the apply reached (its log_received), else NULL.
CREATE TABLE fieldsync_log (
    commit_offset INTEGER PRIMARY KEY,
    origin        TEXT NOT NULL,
    first_seq     INTEGER NOT NULL,
    applied       INTEGER
);
-- The columns a RETURN_TO_ORIGIN capture row sends back (see capture.py).
CREATE TABLE fieldsync_returned (
    seq     INTEGER PRIMARY KEY,
    columns TEXT NOT NULL
);
CREATE TABLE fieldsync_shape (
    id          INTEGER PRIMARY KEY,
    table_name  TEXT NOT NULL,
    columns     TEXT NOT NULL,
    key_columns TEXT NOT NULL,
    table_sql   TEXT
);
CREATE TABLE fieldsync_publication (
    name       TEXT PRIMARY KEY,
    created_at TEXT NOT NULL
);
CREATE TABLE fieldsync_article (
    table_name   TEXT NOT NULL COLLATE NOCASE,
    publication  TEXT NOT NULL REFERENCES fieldsync_publication (name),
    columns      TEXT,
    subscribe_by TEXT,
    shape        INTEGER NOT NULL REFERENCES fieldsync_shape (id),
    follows        TEXT,
    follow_columns TEXT,
    parent_columns TEXT,
    route_sql      TEXT,
    PRIMARY KEY (table_name, publication)
);
CREATE TABLE fieldsync_subscription (
    remote      TEXT NOT NULL,
    publication TEXT NOT NULL REFERENCES fieldsync_publication (name),
    value,
    created_at  TEXT NOT NULL,
    since       INTEGER NOT NULL DEFAULT 0,
    until       INTEGER
);
CREATE INDEX fieldsync_subscription_remote ON fieldsync_subscription (remote, publication);
CREATE TABLE fieldsync_remote (
    name             TEXT PRIMARY KEY,
    log_send         INTEGER NOT NULL DEFAULT 0,
    log_sent         INTEGER NOT NULL DEFAULT 0,
    confirm_sent     INTEGER NOT NULL DEFAULT 0,
    resend_count     INTEGER NOT NULL DEFAULT 0,
    log_received     INTEGER NOT NULL DEFAULT 0,
    confirm_received INTEGER NOT NULL DEFAULT 0,
    rereceive_count  INTEGER NOT NULL DEFAULT 0,
    send_count       INTEGER NOT NULL DEFAULT 0,
    last_sent_at     TEXT,
    receive_count    INTEGER NOT NULL DEFAULT 0,
    last_received_at TEXT,
    transport        TEXT,
    address          TEXT,
    public_key       TEXT,
    send_every       INTEGER CHECK (send_every IS NULL OR send_every > 0),
    send_at          TEXT,
    peer_incarnation BLOB CHECK (peer_incarnation IS NULL OR length(peer_incarnation) = 16),
    last_error       TEXT,
    last_error_at    TEXT,
    created_at       TEXT NOT NULL,
    log_read         INTEGER NOT NULL DEFAULT 0,
    heartbeat        INTEGER CHECK (heartbeat IS NULL OR heartbeat > 0),
    control_sent_at  REAL,
    inbox            TEXT,
    heard_at         REAL,
    confirm_timeout  INTEGER CHECK (confirm_timeout IS NULL OR confirm_timeout > 0),
    data_sent_at     REAL,
    peer_confirmed   INTEGER NOT NULL DEFAULT 0,
    probes           INTEGER NOT NULL DEFAULT 0,
    confirm_owed     INTEGER NOT NULL DEFAULT 0,
    error_count      INTEGER NOT NULL DEFAULT 0,
    error_seen_at    TEXT,
    stream_stopped   TEXT,
    stream_stopped_at TEXT,
    peer_schema_version INTEGER,
    follows_common   INTEGER NOT NULL DEFAULT 0 CHECK (follows_common IN (0, 1)),
    CHECK (0 <= confirm_sent AND confirm_sent <= log_sent),
    CHECK (send_every IS NULL OR send_at IS NULL)
);
CREATE TABLE fieldsync_conflict (
    id              INTEGER PRIMARY KEY,
    at              TEXT NOT NULL,
    peer            TEXT NOT NULL,
    peer_commit     INTEGER NOT NULL,
    table_name      TEXT NOT NULL,
    key             BLOB NOT NULL,
    local_row       BLOB NOT NULL,
    incoming_before BLOB,
    incoming_after  BLOB,
    resolution      TEXT NOT NULL,
    result_row      BLOB
);
CREATE TABLE fieldsync_apply_error (
    id          INTEGER PRIMARY KEY,
    at          TEXT NOT NULL,
    peer        TEXT NOT NULL,
    peer_commit INTEGER NOT NULL,
    table_name  TEXT,
    kind        INTEGER,
    key         BLOB,
    operation   BLOB,
    problem     TEXT NOT NULL,
    acknowledged_at TEXT
);
{apply_error_open};
CREATE TABLE fieldsync_conflict_policy (
    table_name TEXT PRIMARY KEY COLLATE NOCASE,
    policy     TEXT NOT NULL CHECK (policy IN ('incoming', 'local'))
);
{replaced_copy};
{schema_change};
{applying}
"""

# The apply errors not yet acknowledged, by peer: what `agent status --errors`
# and the in-error gauge look up for every peer (acknowledged ones are history).
APPLY_ERROR_OPEN_INDEX = ("CREATE INDEX IF NOT EXISTS fieldsync_apply_error_open"
                          " ON fieldsync_apply_error (peer) WHERE acknowledged_at IS NULL")

# At the consolidated, the incarnation of each copy of a remote that a new
# extraction replaced: files of such a copy still in the message system are
# late mail, set aside without stopping the new copy's stream.
REPLACED_COPY_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_replaced_copy (\n"
                       "    remote      TEXT NOT NULL,\n"
                       "    incarnation BLOB NOT NULL CHECK (length(incarnation) = 16),\n"
                       "    replaced_at TEXT NOT NULL,\n"
                       "    PRIMARY KEY (remote, incarnation)\n) WITHOUT ROWID")

# The schema changes made here (peer NULL: at the consolidated, at its own
# log's commit offset) or applied here (at a remote: the offset in the
# consolidated's log).  ``steps`` is JSON (docs/site-database.md, "Schema changes").
SCHEMA_CHANGE_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_schema_change (\n"
                       "    commit_offset INTEGER PRIMARY KEY,\n"
                       "    peer          TEXT,\n"
                       "    steps         TEXT NOT NULL,\n"
                       "    statements    TEXT,\n"
                       "    made_at       TEXT NOT NULL\n)")


# An article the consolidated removed where extracted remotes held its
# table, as ARTICLE_ROWS reads it: it still holds for the log transactions
# before ``until``, the commit offset of the change that removed it, and
# goes when the log is truncated past it (docs/site-database.md, "Removing
# an article").
REMOVED_ARTICLE_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_removed_article (\n"
                         "    table_name   TEXT NOT NULL,\n"
                         "    publication  TEXT NOT NULL,\n"
                         "    columns      TEXT,\n"
                         "    subscribe_by TEXT,\n"
                         "    until        INTEGER NOT NULL\n)")

# The rows of fieldsync_schema_change that are schema changes: a
# passthrough (its steps all ``passthrough``: docs/site-database.md,
# "Passthrough") is recorded there too, but it changes no schema, so it is
# no schema version.
SCHEMA_ROWS = "coalesce(json_extract(steps, '$[0][0]'), '') <> 'passthrough'"


def _create_statements() -> list[str]:
    value_columns = ",\n    ".join(value_column(i) for i in range(INITIAL_VALUE_COLUMNS))
    text = (_TABLES.replace("{site}", SITE_TABLE).replace("{value_columns}", value_columns)
            .replace("{replaced_copy}", REPLACED_COPY_TABLE).replace("{applying}", APPLYING_TABLE + ";")
            .replace("{schema_change}", SCHEMA_CHANGE_TABLE + ";\n" + REMOVED_ARTICLE_TABLE)
            .replace("{apply_error_open}", APPLY_ERROR_OPEN_INDEX))
    return [statement.strip() for statement in text.split(";") if statement.strip()]


def is_site(conn: sqlite3.Connection) -> bool:
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'fieldsync_site'").fetchone()
    return row is not None


def init_database(path: str | os.PathLike[str], *, name: str, role: Role | str, address: str | None = None,
                  transport: str | None = None, public_key: str | None = None, now: datetime | None = None,
                  busy_timeout: float | None = None) -> sqlite3.Connection:
    """Turn the SQLite file at ``path`` (new or existing) into a site and
    return an open connection to it."""
    check_name(name, "site name")
    role = check_role(role)
    check_texts("site", address=address, transport=transport, public_key=public_key)
    created = format_time(now or utc_now())
    conn = connect(str(path), **({} if busy_timeout is None else {"busy_timeout": busy_timeout}))
    try:
        try:
            if is_site(conn):
                raise AlreadyASite(f"{path} is already the fieldsync site {read_identity(conn).name!r}; "
                                   "open it instead of initialising it again")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        except sqlite3.OperationalError as error:
            raise translate(error, f"initialising {path}") from error
        except sqlite3.DatabaseError as error:
            raise NotASite(f"{path}: cannot use as an SQLite database ({error})") from error
        if mode.lower() != "wal":
            raise InvalidSetting(f"{path}: SQLite refused WAL mode (journal mode stays {mode!r}); "
                                 "a site needs a file on a local disk")
        with write_transaction(conn, f"initialising site {name} in {path}"):
            if is_site(conn):  # another process won the race
                raise AlreadyASite(f"{path} was turned into a site concurrently")
            for statement in _create_statements():
                conn.execute(statement)
            _add_transport_settings(conn)
            _add_common_read(conn)
            conn.execute(
                "INSERT INTO fieldsync_site (id, schema_version, name, role, incarnation, address, transport,"
                " public_key, created_at) VALUES (1, ?, ?, ?, ?, ?, ?, ?, ?)",
                (SCHEMA_VERSION, name, role.value, new_incarnation(), address, transport, public_key, created),
            )
    except BaseException:
        conn.close()
        raise
    return conn


# Called with the database's path and the secret key text a database of
# layout 3 or older holds, before the upgrade to layout 4 forgets it: it must
# store the secret durably, or raise to leave the database as it was.
SecretStore = Callable[[str, bytes], None]


def open_database(path: str | os.PathLike[str], *, busy_timeout: float | None = None,
                  store_secret: SecretStore | None = None) -> sqlite3.Connection:
    """Open an existing site database; refuse anything else.  An older
    layout is upgraded; one that still holds the site's secret key needs
    ``store_secret`` to hand it to (else :class:`SecretInDatabase`)."""
    location = Path(path)
    if not location.is_file():
        if location.exists():
            raise NotASite(f"{path} is not a regular file, so not a site database")
        raise NotASite(f"{path}: no such database file; create the site with init first")
    conn = connect(str(location), **({} if busy_timeout is None else {"busy_timeout": busy_timeout}))
    try:
        try:
            site = is_site(conn)
        except sqlite3.DatabaseError as error:
            raise NotASite(f"{path}: not an SQLite database ({error})") from error
        if not site:
            raise NotASite(f"{path} is an SQLite database but not a fieldsync site; initialise it first")
        if _layout(conn, path) < SCHEMA_VERSION:
            _upgrade(conn, path, store_secret)
    except sqlite3.Error as error:
        conn.close()
        raise translate(error, f"opening {path}") from error
    except BaseException:
        conn.close()
        raise
    return conn


def _layout(conn: sqlite3.Connection, path: str | os.PathLike[str]) -> int:
    """The database's layout version; refuse one this fieldsync cannot read."""
    version = conn.execute("SELECT schema_version FROM fieldsync_site").fetchone()
    if version is None:
        raise NotASite(f"{path}: fieldsync_site is empty; the site was never initialised completely")
    if version[0] > SCHEMA_VERSION:
        raise UnsupportedSiteVersion(f"{path} uses site layout {version[0]}; this fieldsync reads up to "
                                     f"{SCHEMA_VERSION}: upgrade fieldsync")
    return version[0]


def _upgrade_capture(conn: sqlite3.Connection) -> None:
    upgrade_capture(conn)


def _add_replaced_copy(conn: sqlite3.Connection) -> None:
    conn.execute(REPLACED_COPY_TABLE)


def _drop_secret(conn: sqlite3.Connection) -> None:
    """Rebuild fieldsync_site without its ``secret`` column (the secret was
    handed to the caller's store first, see _upgrade).

    The table is dropped and made again rather than ALTERed: with
    ``secure_delete`` on (set by _upgrade), dropping it zeroes its whole
    page, which also clears copies of the row that earlier updates left in
    the page's free space; and it needs no SQLite newer than 3.35."""
    kept = ", ".join(SITE_COLUMNS)
    conn.execute(f"CREATE TEMP TABLE fieldsync_site_moving AS SELECT {kept} FROM main.fieldsync_site")
    conn.execute("DROP TABLE main.fieldsync_site")
    conn.execute(SITE_TABLE.replace("CREATE TABLE fieldsync_site", "CREATE TABLE main.fieldsync_site", 1))
    conn.execute(f"INSERT INTO main.fieldsync_site ({kept}) SELECT {kept} FROM temp.fieldsync_site_moving")
    conn.execute("DROP TABLE temp.fieldsync_site_moving")


def _add_quiet_columns(conn: sqlite3.Connection) -> None:
    """Layout 5: how far the log was read for each remote (``log_read``),
    its heartbeat and when it was last sent a control message."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_remote)")}
    for column, declaration in (("log_read", "INTEGER NOT NULL DEFAULT 0"),
                                ("heartbeat", "INTEGER CHECK (heartbeat IS NULL OR heartbeat > 0)"),
                                ("control_sent_at", "REAL")):
        if column not in have:
            conn.execute(f"ALTER TABLE fieldsync_remote ADD COLUMN {column} {declaration}")


TRANSPORT_OPTION_TABLE = ("CREATE TABLE IF NOT EXISTS fieldsync_transport_option (\n"
                          "    scope TEXT NOT NULL,\n"
                          "    name  TEXT NOT NULL,\n"
                          "    value TEXT NOT NULL,\n"
                          "    PRIMARY KEY (scope, name)\n) WITHOUT ROWID")


def _add_transport_settings(conn: sqlite3.Connection) -> None:
    """Layout 6: the site's reply address, each remote's own inbox, and the
    transport options stored with the site (scope '') and per peer."""
    for table, column in (("fieldsync_site", "reply_address"), ("fieldsync_remote", "inbox")):
        if column not in {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}:
            conn.execute(f"ALTER TABLE {table} ADD COLUMN {column} TEXT")
    conn.execute(TRANSPORT_OPTION_TABLE)


def _add_heard_at(conn: sqlite3.Connection) -> None:
    """Layout 7: when a message of each peer (data or control) last arrived."""
    if "heard_at" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_remote)")}:
        conn.execute("ALTER TABLE fieldsync_remote ADD COLUMN heard_at REAL")


# Layout 8's columns of fieldsync_remote (docs/protocol.md, rule 3).
OUTSTANDING_COLUMNS = (("confirm_timeout", "INTEGER CHECK (confirm_timeout IS NULL OR confirm_timeout > 0)"),
                       ("data_sent_at", "REAL"), ("peer_confirmed", "INTEGER NOT NULL DEFAULT 0"),
                       ("probes", "INTEGER NOT NULL DEFAULT 0"), ("confirm_owed", "INTEGER NOT NULL DEFAULT 0"))
# Layout 8's columns of fieldsync_remote for errors: the history (a count
# and the time of the last one, never cleared) and the stopped stream in
# force (last_error, older, is the transport error in force).
ERROR_COLUMNS = (("error_count", "INTEGER NOT NULL DEFAULT 0"), ("error_seen_at", "TEXT"),
                 ("stream_stopped", "TEXT"), ("stream_stopped_at", "TEXT"))


def _add_layout_8(conn: sqlite3.Connection) -> None:
    """Layout 8: each remote's confirm timeout, and the protocol's record of
    what is outstanding (when data last went, what the peer is known to
    hold, the probes sent, a confirmation owed); the errors in force kept
    apart from their history (an apply error acknowledged stays a row)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_remote)")}
    for column, declaration in OUTSTANDING_COLUMNS + ERROR_COLUMNS:
        if column not in have:
            conn.execute(f"ALTER TABLE fieldsync_remote ADD COLUMN {column} {declaration}")
    if "acknowledged_at" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_apply_error)")}:
        conn.execute("ALTER TABLE fieldsync_apply_error ADD COLUMN acknowledged_at TEXT")
    conn.execute(APPLY_ERROR_OPEN_INDEX)


def _add_subscription_span(conn: sqlite3.Connection) -> None:
    """Layout 9: the commit offsets between which each subscription holds
    (every existing one from the start, and still)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_subscription)")}
    for column, declaration in (("since", "INTEGER NOT NULL DEFAULT 0"), ("until", "INTEGER")):
        if column not in have:
            conn.execute(f"ALTER TABLE fieldsync_subscription ADD COLUMN {column} {declaration}")


def _add_follows(conn: sqlite3.Connection) -> None:
    """Layout 10: how an article follows its parent (none did before)."""
    have = {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_article)")}
    for column in ("follows", "follow_columns", "parent_columns", "route_sql"):
        if column not in have:
            conn.execute(f"ALTER TABLE fieldsync_article ADD COLUMN {column} TEXT")


def _add_schema_changes(conn: sqlite3.Connection) -> None:
    """Layout 11: the record of schema changes (none was made before)."""
    conn.execute(SCHEMA_CHANGE_TABLE)


def _add_peer_schema_version(conn: sqlite3.Connection) -> None:
    """Layout 12: the schema version each peer reported (none yet)."""
    if "peer_schema_version" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_remote)")}:
        conn.execute("ALTER TABLE fieldsync_remote ADD COLUMN peer_schema_version INTEGER")


def _key_articles_by_publication(conn: sqlite3.Connection) -> None:
    """Layout 13: an article is keyed by its table and its publication (a
    table was in one publication before: every row keeps its place, and
    its rowid, which orders extraction's tables)."""
    conn.execute("ALTER TABLE fieldsync_article RENAME TO fieldsync_article_12")
    conn.execute(next(statement for statement in _TABLES.split(";")
                      if "CREATE TABLE fieldsync_article (" in statement))
    conn.execute("INSERT INTO fieldsync_article (rowid, table_name, publication, columns, subscribe_by, shape, follows,"
                 " follow_columns, parent_columns, route_sql) SELECT rowid, table_name, publication, columns,"
                 " subscribe_by, shape, follows, follow_columns, parent_columns, route_sql FROM fieldsync_article_12")
    conn.execute("DROP TABLE fieldsync_article_12")


def _add_log_applied(conn: sqlite3.Connection) -> None:
    """Layout 14: what an apply that wrote rows back had applied of its
    peer (unknown for the log transactions written before)."""
    if "applied" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_log)")}:
        conn.execute("ALTER TABLE fieldsync_log ADD COLUMN applied INTEGER")


def _add_removed_articles(conn: sqlite3.Connection) -> None:
    """Layout 15: the articles removed, for the log transactions before
    their removal (those removed before were read as gone)."""
    conn.execute(REMOVED_ARTICLE_TABLE)


def _add_common_read(conn: sqlite3.Connection) -> None:
    """Layout 16: the common read position, where no pair follows it yet
    (every row keeps its own positions until a send phase moves it)."""
    if "common_read" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_site)")}:
        conn.execute("ALTER TABLE fieldsync_site ADD COLUMN common_read INTEGER NOT NULL DEFAULT 0")
    if "follows_common" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_remote)")}:
        conn.execute("ALTER TABLE fieldsync_remote ADD COLUMN follows_common INTEGER NOT NULL DEFAULT 0"
                     " CHECK (follows_common IN (0, 1))")


# What turns layout N into layout N + 1.
_UPGRADES = {1: _upgrade_capture, 2: _add_replaced_copy, 3: _drop_secret, 4: _add_quiet_columns,
             5: _add_transport_settings, 6: _add_heard_at, 7: _add_layout_8, 8: _add_subscription_span,
             9: _add_follows, 10: _add_schema_changes, 11: _add_peer_schema_version,
             12: _key_articles_by_publication, 13: _add_log_applied, 14: _add_removed_articles,
             15: _add_common_read}


def _upgrade(conn: sqlite3.Connection, path: str | os.PathLike[str], store_secret: SecretStore | None) -> None:
    """Bring a database of an older layout to SCHEMA_VERSION, in one write
    transaction (another process may have done it meanwhile).

    Up to layout 3 the site row kept the secret key.  It goes to
    ``store_secret`` before the transaction forgets it, so an interruption
    anywhere leaves it in the database, the store, or both (the next open
    then finds it in both, and the store must accept the same secret
    again).  Its bytes are then wiped from the file: ``secure_delete``
    zeroes what the upgrade frees, and a checkpoint truncates the WAL,
    which held the row's old page images."""
    previous = conn.execute("PRAGMA secure_delete").fetchone()[0]
    conn.execute("PRAGMA secure_delete = ON")
    try:
        with write_transaction(conn, f"upgrading the site layout of {path}"):
            start = _layout(conn, path)
            secret = _stored_secret(conn)
            if secret is not None:
                if store_secret is None:
                    raise SecretInDatabase(
                        f"{path} still holds its site's secret key (site layout {start}); open it with the "
                        f"agent (`agent key {path} --check`) to move the key to its own file")
                store_secret(os.fspath(path), secret)
            for step in range(start, SCHEMA_VERSION):
                _UPGRADES[step](conn)
            conn.execute("UPDATE fieldsync_site SET schema_version = ?", (SCHEMA_VERSION,))
    finally:
        conn.execute(f"PRAGMA secure_delete = {int(previous)}")
    if secret is not None:
        try:
            busy = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()[0]
        except sqlite3.Error:
            busy = 1  # the upgrade is committed; the next checkpoint will do
        if busy:
            log.warning("%s: another connection kept the WAL in use: old bytes of the site's secret key stay in "
                        "%s-wal until a checkpoint can truncate it", path, path)


def _stored_secret(conn: sqlite3.Connection) -> bytes | None:
    """The secret key a database of layout 3 or older holds, if any (None
    too when the column is gone already)."""
    if "secret" not in {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_site)")}:
        return None
    value = conn.execute("SELECT secret FROM fieldsync_site WHERE id = 1").fetchone()
    if value is None or value[0] is None:
        return None
    return value[0] if isinstance(value[0], bytes) else str(value[0]).encode("utf-8")


def read_identity(conn: sqlite3.Connection) -> SiteIdentity:
    row = conn.execute("SELECT name, role, incarnation, address, transport, public_key, created_at, reply_address"
                       " FROM fieldsync_site WHERE id = 1").fetchone()
    if row is None:
        raise NotASite("the database has no site identity row")
    name, role, incarnation, address, transport, public_key, created_at, reply_address = row
    return SiteIdentity(name, Role(role), incarnation, address, transport, public_key,
                        parse_time(created_at), reply_address)  # type: ignore[arg-type]
