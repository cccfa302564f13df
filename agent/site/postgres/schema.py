"""The ``fieldsync`` schema: capture, log and shape tables of a PostgreSQL site.

Rules of this file:
* Everything fieldsync keeps in the database lives in the schema
  ``fieldsync``, owned by the agent's role; applications need no grant on
  it (the capture triggers write as that role: capture.py).
* The capture table holds one row per row change, in the logical form of a
  SQLite site's capture rows (``seq, shape, kind, flags`` and the values,
  here one ``text[]`` ``v``: the old or inserted row, then an UPDATE's new
  row, each as typemap.py's capture text), plus the writing transaction
  (``txid``, ``pg_current_xact_id()``) and ``origin`` (the session setting
  ``fieldsync.origin``: NULL for the site's own applications, a peer's name
  for the agent's applies).  ``txid``, ``seq`` and ``origin`` are column
  defaults, so a trigger names none of them.
* ``seq`` comes from a sequence with CACHE 1: values are handed out in the
  order of the calls, across sessions (log.py's argument needs it).
* The log (``log``, ``log_txn``, ``cut``) is written by log.py only;
  see docs/postgres.md for why its order is commit order.
* The site's bookkeeping (layout 2: ``identity``, ``publication``,
  ``article``, ``subscription``, ``remote``, ``transport_option``,
  ``replaced_copy``, ``conflict``, ``apply_error``; layout 3:
  ``conflict_policy``, ``returned``; layout 4: ``remote.peer_schema_version``;
  layout 5: ``returned`` without a foreign key; layout 6: follows; layout 8:
  ``applied``; layout 9: ``schema_change``, ``table_send``; layout 10:
  ``subscription_change``; layout 11: ``removed_article``) has the columns
  of a SQLite site's tables (agent/site/sqlite/schema.py) in PostgreSQL's
  types: times are ``timestamptz``, offsets ``bigint``, blobs ``bytea``.
* Each shape has two partial indexes on the capture table by key
  (:func:`shape_indexes`, made with the shape: capture.py), as a SQLite
  consolidated has.
* The layout has a version (``site.schema_version``): a newer one is
  refused (:func:`check_layout`), an older one upgraded (:data:`_UPGRADES`).
* Functions here open their own transaction (or a savepoint inside the
  caller's).
"""

from __future__ import annotations

from typing import Callable

import psycopg
from psycopg import sql

from ..errors import NotASite, UnsupportedSiteVersion
from .connect import translate
from .uri import PgTarget

SCHEMA = "fieldsync"
# The rows of fieldsync.schema_change that are schema changes: passthrough
# travels as one (passthrough.py) but moves no schema version.
CHANGE_ROWS = "coalesce(steps -> 0 ->> 0, '') <> 'passthrough'"
# 1: capture, shapes and the log (the foundation).
# 2: the site's identity (with the agent's home folder), publications,
#    articles, subscriptions, the remote-user table, transport options,
#    replaced copies, conflicts and apply errors.
# 3: what an apply needs: conflict policies, the rows written back to an
#    origin, each shape's key indexes on the capture table, and the log's
#    writing transactions by txid.
# 4: remote.peer_schema_version, the schema version a remote reported
#    (docs/protocol.md, "Schema versions").
# 5: the rows written back keep no foreign key to their capture rows:
#    truncation deletes them itself (log.truncate_log), where the key's
#    cascade ran one trigger per capture row deleted, most of the time of
#    truncating a large log.
# 6: articles that follow their parent: ``article.follows``,
#    ``follow_columns``, ``parent_columns``; ``shape.route_kind``, the types
#    table row of the route a follow article's capture rows carry.
# 7: ``article`` keyed by table and publication: a table may be an article
#    of several publications (docs/site-database.md, "A table in several
#    publications").
# 8: ``applied``: for the writing transaction of an apply that wrote rows
#    back to its peer, the peer's offset the apply reached (docs/protocol.md,
#    "What a data message says of the recipient's own changes").
# 9: schema changes (changes.py): the capture table takes a change's row
#    (kind 4, shape 0), and ``schema_change`` keeps each change by its
#    writing transaction, with its commit offset once a cut gave it one;
#    ``table_send``, a new table's rows still to be sent (new_tables.py).
# 10: ``subscription_change``, a subscription ended through a remote's
#    stream whose DELETEs no cut has given a log transaction yet
#    (resubscribe.py).
# 11: ``removed_article``, the articles removed where extracted remotes held
#    them, read for the log transactions before their removal; a
#    subscription of a dropped publication ends instead of going, so
#    ``subscription.publication`` no longer references ``publication``,
#    and ``subscription_change`` is keyed by transaction and subscription
#    (docs/site-database.md, "Removing an article").
# 12: ``site.common_read`` and ``remote.follows_common``: the read position
#    a send phase moves once for every pair its range holds nothing for
#    (read_positions.py; docs/protocol.md, "The common read position").
SCHEMA_VERSION = 12

_TABLES = """
CREATE SCHEMA fieldsync;

CREATE TABLE fieldsync.site (
    id integer PRIMARY KEY CHECK (id = 1),
    schema_version integer NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- CACHE 1 (the default, written out): nextval() hands values out in the
-- order it is called, whichever session calls it.
CREATE SEQUENCE fieldsync.capture_seq CACHE 1 NO CYCLE;

CREATE TABLE fieldsync.capture (
    txid xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id(),
    seq bigint NOT NULL DEFAULT pg_catalog.nextval('fieldsync.capture_seq'),
    origin text DEFAULT NULLIF(pg_catalog.current_setting('fieldsync.origin', true), ''),
    shape integer NOT NULL,
    kind smallint NOT NULL CHECK (kind IN (1, 2, 3)),
    flags smallint NOT NULL DEFAULT 0,
    v text[] NOT NULL,
    PRIMARY KEY (txid, seq)
);

CREATE TABLE fieldsync.shape (
    id integer GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    table_schema text NOT NULL,
    table_name text NOT NULL,
    columns jsonb NOT NULL,
    key_columns jsonb NOT NULL,
    kinds jsonb NOT NULL,
    declared jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
);

-- One row per log transaction: its commit offset and origin.
CREATE TABLE fieldsync.log (
    commit_offset bigint PRIMARY KEY CHECK (commit_offset > 0),
    origin text NOT NULL
);

-- The writing transactions of each log transaction, in replay order: the
-- capture rows of (txid, origin) belong to commit_offset.
CREATE TABLE fieldsync.log_txn (
    commit_offset bigint NOT NULL,
    position integer NOT NULL,
    txid xid8 NOT NULL,
    origin text,
    PRIMARY KEY (commit_offset, position)
);

-- The last cut: its snapshot (the next cut takes the transactions that
-- finished after it), the log end and the truncation point.
CREATE TABLE fieldsync.cut (
    id integer PRIMARY KEY CHECK (id = 1),
    snapshot pg_snapshot NOT NULL,
    log_end bigint NOT NULL,
    truncated_through bigint NOT NULL,
    cut_at timestamptz NOT NULL
);

-- Refuses TRUNCATE of a published table: it fires no row trigger, so the
-- remotes would keep rows the consolidated no longer has.
CREATE FUNCTION fieldsync.refuse_truncate() RETURNS trigger LANGUAGE plpgsql AS $body$
BEGIN
    RAISE EXCEPTION 'fieldsync: TRUNCATE of published table %.% is refused', TG_TABLE_SCHEMA, TG_TABLE_NAME
        USING ERRCODE = 'feature_not_supported',
              HINT = 'TRUNCATE fires no row trigger, so the remotes would keep the rows; DELETE them instead, '
                     'or remove the table from its publication first';
END
$body$;
"""

# Layout 2: the site's bookkeeping, as a SQLite site keeps it.
_BOOKKEEPING = """
-- Who this site is: one row, written by PostgresSite.init.  A PostgreSQL
-- site is a consolidated; ``home`` is the agent's own folder (its key,
-- queues and state), an absolute path on the host the agent runs on.
CREATE TABLE fieldsync.identity (
    id integer PRIMARY KEY CHECK (id = 1),
    name text NOT NULL,
    role text NOT NULL CHECK (role = 'consolidated'),
    incarnation bytea NOT NULL CHECK (length(incarnation) = 16),
    home text NOT NULL CHECK (home LIKE '/%'),
    address text,
    reply_address text,
    transport text,
    public_key text,
    created_at timestamptz NOT NULL
);

CREATE TABLE fieldsync.publication (
    name text PRIMARY KEY,
    created_at timestamptz NOT NULL
);

-- One row per article: a table in each publication that holds it;
-- ``table_oid`` finds it again (its capture triggers) when it was
-- renamed; ``columns`` NULL: every column.
CREATE TABLE fieldsync.article (
    table_schema text NOT NULL,
    table_name text NOT NULL,
    table_oid oid NOT NULL,
    publication text NOT NULL REFERENCES fieldsync.publication (name),
    columns jsonb,
    subscribe_by text,
    shape integer NOT NULL REFERENCES fieldsync.shape (id),
    PRIMARY KEY (table_schema, table_name, publication)
);

-- A value is a SQLite value: NULL, or exactly one of the typed columns.
-- ``since`` and ``until``: the commit offsets between which it holds.
CREATE TABLE fieldsync.subscription (
    id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    remote text NOT NULL,
    publication text NOT NULL REFERENCES fieldsync.publication (name),
    value_integer bigint,
    value_real double precision,
    value_text text,
    value_blob bytea,
    created_at timestamptz NOT NULL,
    since bigint NOT NULL DEFAULT 0,
    until bigint,
    CHECK (num_nonnulls(value_integer, value_real, value_text, value_blob) <= 1)
);
CREATE INDEX subscription_remote ON fieldsync.subscription (remote, publication);

CREATE TABLE fieldsync.remote (
    name              text PRIMARY KEY,
    log_send          bigint NOT NULL DEFAULT 0,
    log_sent          bigint NOT NULL DEFAULT 0,
    confirm_sent      bigint NOT NULL DEFAULT 0,
    resend_count      bigint NOT NULL DEFAULT 0,
    log_received      bigint NOT NULL DEFAULT 0,
    confirm_received  bigint NOT NULL DEFAULT 0,
    rereceive_count   bigint NOT NULL DEFAULT 0,
    send_count        bigint NOT NULL DEFAULT 0,
    last_sent_at      timestamptz,
    receive_count     bigint NOT NULL DEFAULT 0,
    last_received_at  timestamptz,
    transport         text,
    address           text,
    public_key        text,
    send_every        bigint CHECK (send_every IS NULL OR send_every > 0),
    send_at           time,
    peer_incarnation  bytea CHECK (peer_incarnation IS NULL OR length(peer_incarnation) = 16),
    last_error        text,
    last_error_at     timestamptz,
    created_at        timestamptz NOT NULL,
    log_read          bigint NOT NULL DEFAULT 0,
    heartbeat         bigint CHECK (heartbeat IS NULL OR heartbeat > 0),
    control_sent_at   double precision,
    inbox             text,
    heard_at          double precision,
    confirm_timeout   bigint CHECK (confirm_timeout IS NULL OR confirm_timeout > 0),
    data_sent_at      double precision,
    peer_confirmed    bigint NOT NULL DEFAULT 0,
    probes            bigint NOT NULL DEFAULT 0,
    confirm_owed      boolean NOT NULL DEFAULT false,
    error_count       bigint NOT NULL DEFAULT 0,
    error_seen_at     timestamptz,
    stream_stopped    text,
    stream_stopped_at timestamptz,
    peer_schema_version bigint CHECK (peer_schema_version IS NULL OR peer_schema_version >= 0),
    CHECK (0 <= confirm_sent AND confirm_sent <= log_sent),
    CHECK (send_every IS NULL OR send_at IS NULL)
);

-- Scope '': the site's own transport options; scope NAME: those to peer NAME.
CREATE TABLE fieldsync.transport_option (
    scope text NOT NULL,
    name  text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (scope, name)
);

-- The incarnation of each copy of a remote that a new extraction replaced.
CREATE TABLE fieldsync.replaced_copy (
    remote      text NOT NULL,
    incarnation bytea NOT NULL CHECK (length(incarnation) = 16),
    replaced_at timestamptz NOT NULL,
    PRIMARY KEY (remote, incarnation)
);

-- What an apply records (rows as msgpack, agent.site.values).
CREATE TABLE fieldsync.conflict (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL,
    peer            text NOT NULL,
    peer_commit     bigint NOT NULL,
    table_name      text NOT NULL,
    key             bytea NOT NULL,
    local_row       bytea NOT NULL,
    incoming_before bytea,
    incoming_after  bytea,
    resolution      text NOT NULL,
    result_row      bytea
);

CREATE TABLE fieldsync.apply_error (
    id              bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    at              timestamptz NOT NULL,
    peer            text NOT NULL,
    peer_commit     bigint NOT NULL,
    table_name      text,
    kind            smallint,
    key             bytea,
    operation       bytea,
    problem         text NOT NULL,
    acknowledged_at timestamptz
);
-- The apply errors not yet acknowledged, by peer (a peer in error now).
CREATE INDEX apply_error_open ON fieldsync.apply_error (peer) WHERE acknowledged_at IS NULL;
"""

# Layout 6: articles that follow their parent (route.py).
_FOLLOWS = """
ALTER TABLE fieldsync.article ADD COLUMN IF NOT EXISTS follows text,
    ADD COLUMN IF NOT EXISTS follow_columns jsonb, ADD COLUMN IF NOT EXISTS parent_columns jsonb;
ALTER TABLE fieldsync.shape ADD COLUMN IF NOT EXISTS route_kind text;
"""

# Layout 7: an article is keyed by its table and its publication (a table
# was in one publication before: every row keeps its place).
_ARTICLE_BY_PUBLICATION = """
ALTER TABLE fieldsync.article DROP CONSTRAINT IF EXISTS article_pkey;
ALTER TABLE fieldsync.article ADD PRIMARY KEY (table_schema, table_name, publication);
"""

# Layout 8: what an apply that wrote rows back to its peer had applied of
# it, by writing transaction (it goes with its log transaction at truncation).
_APPLIED = """
CREATE TABLE IF NOT EXISTS fieldsync.applied (
    txid    xid8 PRIMARY KEY,
    applied bigint NOT NULL CHECK (applied > 0)
);
"""

# Layout 9: schema changes (changes.py).  A change's commit offset is the
# cut's to give (log.cut_in), so a change is found by its writing
# transaction until then.
_SCHEMA_CHANGES = """
ALTER TABLE fieldsync.capture DROP CONSTRAINT IF EXISTS capture_kind_check;
ALTER TABLE fieldsync.capture ADD CONSTRAINT capture_kind_check CHECK (kind IN (1, 2, 3, 4));
CREATE TABLE IF NOT EXISTS fieldsync.schema_change (
    txid          xid8 PRIMARY KEY,
    commit_offset bigint UNIQUE CHECK (commit_offset > 0),
    steps         jsonb NOT NULL,
    statements    jsonb NOT NULL,
    made_at       timestamptz NOT NULL
);
-- A table published where extracted remotes subscribe, whose rows are
-- still to be sent after the change that creates it (new_tables.py).
CREATE TABLE IF NOT EXISTS fieldsync.table_send (
    table_oid oid PRIMARY KEY
);
"""

# Layout 3: what an apply needs (agent/site/postgres/apply).
_APPLY = """
-- A table's conflict policy at this consolidated (none: incoming wins).
CREATE TABLE fieldsync.conflict_policy (
    table_schema text NOT NULL,
    table_name   text NOT NULL,
    policy       text NOT NULL CHECK (policy IN ('incoming', 'local')),
    PRIMARY KEY (table_schema, table_name)
);

-- One row per capture row an apply writes back to its origin (flag 1,
-- agent.site.capture.FLAG_RETURN_TO_ORIGIN): the peer it goes to, and
-- for an UPDATE the columns it sends back (a JSON list).  It goes with
-- its capture row (txid, seq) at truncation (log.truncate_log).
CREATE TABLE fieldsync.returned (
    seq     bigint PRIMARY KEY,
    txid    xid8 NOT NULL,
    peer    text NOT NULL,
    columns jsonb NOT NULL
);
CREATE INDEX returned_peer ON fieldsync.returned (peer);

-- The log transaction of a writing transaction.
CREATE INDEX log_txn_txid ON fieldsync.log_txn (txid);
"""


def shape_indexes(shape_id: int, width: int, key_positions: tuple[int, ...]) -> sql.Composed:
    """The two partial indexes of one shape on the capture table, for
    finding a row's changes by key (the apply path: key moves and the
    unconfirmed rule): every row of the shape by its first image's key (the
    old row, or an INSERT's new one), and its UPDATEs by their new row's
    key; ``seq`` last, so the last change of a key is one index probe."""
    def index(name: str, offset: int, where: str) -> sql.Composed:
        columns = sql.SQL(", ").join(sql.SQL("(v[{}])").format(sql.Literal(offset + position + 1))
                                     for position in key_positions)
        return sql.SQL("CREATE INDEX {} ON fieldsync.capture ({}, seq) WHERE shape = {}{};").format(
            sql.Identifier(f"{name}_{shape_id}"), columns, sql.Literal(shape_id), sql.SQL(where))
    return sql.Composed([index("capture_key", 0, ""), index("capture_moved", width, " AND kind = 2")])


def _shapes_indexed(conn: psycopg.Connection) -> None:
    """Layout 3's key indexes of every shape made before it."""
    for shape_id, columns, key_columns in conn.execute(
            "SELECT id, columns, key_columns FROM fieldsync.shape ORDER BY id").fetchall():
        conn.execute(shape_indexes(shape_id, len(columns), tuple(columns.index(column) for column in key_columns)))


# Layout 10: the writing transaction of a subscription change through a
# remote's stream that ended subscription ``ends`` with DELETEs; the cut
# that gives it its log transaction sets ``until`` and deletes the row.
_SUBSCRIPTION_CHANGES = """
CREATE TABLE IF NOT EXISTS fieldsync.subscription_change (
    txid xid8 PRIMARY KEY DEFAULT pg_catalog.pg_current_xact_id(),
    ends bigint NOT NULL
);
"""

# Layout 11: an article removed where extracted remotes held its table, as
# reading.article_rows reads it (``routed``: it followed its parent), holds
# for the log transactions before the change that removed it (found by its
# writing transaction, ``txid``, until a cut gives it its offset);
# truncation past the change deletes it.
_REMOVED_ARTICLES = """
CREATE TABLE IF NOT EXISTS fieldsync.removed_article (
    table_name   text NOT NULL,
    publication  text NOT NULL,
    columns      text,
    subscribe_by text,
    routed       boolean NOT NULL,
    txid         xid8 NOT NULL DEFAULT pg_catalog.pg_current_xact_id()
);
ALTER TABLE fieldsync.subscription DROP CONSTRAINT IF EXISTS subscription_publication_fkey;
-- A publication dropped ends each of its subscriptions in one transaction.
ALTER TABLE fieldsync.subscription_change DROP CONSTRAINT IF EXISTS subscription_change_pkey;
ALTER TABLE fieldsync.subscription_change ADD PRIMARY KEY (txid, ends);
"""

# Layout 12: the common read position, which no pair follows yet (each row
# keeps its own positions until a send phase moves it).
_COMMON_READ = """
ALTER TABLE fieldsync.site ADD COLUMN IF NOT EXISTS common_read bigint NOT NULL DEFAULT 0;
ALTER TABLE fieldsync.remote ADD COLUMN IF NOT EXISTS follows_common boolean NOT NULL DEFAULT false;
"""


def _upgrade_to_3(conn: psycopg.Connection) -> None:
    conn.execute(_APPLY)
    _shapes_indexed(conn)


# What turns layout N into layout N + 1: its SQL, or a function of the connection.
_UPGRADES: dict[int, str | Callable[[psycopg.Connection], None]] = {
    1: _BOOKKEEPING, 2: _upgrade_to_3,
    3: "ALTER TABLE fieldsync.remote ADD COLUMN IF NOT EXISTS peer_schema_version bigint"
       " CHECK (peer_schema_version IS NULL OR peer_schema_version >= 0);",
    4: "ALTER TABLE fieldsync.returned DROP CONSTRAINT IF EXISTS returned_txid_seq_fkey", 5: _FOLLOWS,
    6: _ARTICLE_BY_PUBLICATION, 7: _APPLIED, 8: _SCHEMA_CHANGES, 9: _SUBSCRIPTION_CHANGES,
    10: _REMOVED_ARTICLES, 11: _COMMON_READ}


def schema_installed(conn: psycopg.Connection) -> bool:
    found = conn.execute("SELECT to_regclass('fieldsync.site') IS NOT NULL").fetchone()
    return bool(found and found[0])


def install_schema(conn: psycopg.Connection, target: PgTarget) -> None:
    """Create the ``fieldsync`` schema in one transaction; a database that
    has it already is left as it is."""
    try:
        with conn.transaction():
            if schema_installed(conn):
                return
            conn.execute(_TABLES)
            conn.execute(_BOOKKEEPING)
            conn.execute(_APPLY)
            conn.execute(_FOLLOWS)
            conn.execute(_APPLIED)
            conn.execute(_SCHEMA_CHANGES)
            conn.execute(_SUBSCRIPTION_CHANGES)
            conn.execute(_REMOVED_ARTICLES)
            conn.execute(_COMMON_READ)
            conn.execute("INSERT INTO fieldsync.site (id, schema_version) VALUES (1, %s)", (SCHEMA_VERSION,))
            # The first cut's snapshot: no transaction visible in it can have
            # written a capture row, since the capture table did not exist.
            conn.execute("INSERT INTO fieldsync.cut (id, snapshot, log_end, truncated_through, cut_at)"
                         " VALUES (1, pg_current_snapshot(), 0, 0, now())")
    except psycopg.Error as error:
        raise translate(error, target, "creating the fieldsync schema") from None


def check_layout(conn: psycopg.Connection, target: PgTarget) -> None:
    """Refuse a database without the schema or with a newer layout; bring
    an older layout up to :data:`SCHEMA_VERSION`."""
    try:
        with conn.transaction():
            if not schema_installed(conn):
                raise NotASite(f"{target.where} holds no fieldsync site (no fieldsync schema); initialise it first")
            found = conn.execute("SELECT schema_version FROM fieldsync.site WHERE id = 1 FOR UPDATE").fetchone()
            if found is None:
                raise NotASite(f"{target.where}: fieldsync.site is empty; the schema was never made completely")
            version = found[0]
            if version > SCHEMA_VERSION:
                raise UnsupportedSiteVersion(f"{target.where} uses fieldsync layout {version}; this fieldsync "
                                             f"reads up to {SCHEMA_VERSION}: upgrade fieldsync")
            for step in range(version, SCHEMA_VERSION):
                upgrade = _UPGRADES[step]
                if callable(upgrade):
                    upgrade(conn)
                else:
                    conn.execute(upgrade)
            if version < SCHEMA_VERSION:
                conn.execute("UPDATE fieldsync.site SET schema_version = %s WHERE id = 1", (SCHEMA_VERSION,))
    except psycopg.Error as error:
        raise translate(error, target, "reading the fieldsync layout") from None


def drop_schema(conn: psycopg.Connection, target: PgTarget) -> None:
    """Remove the schema and everything in it, the capture triggers of the
    published tables included (they depend on its functions)."""
    try:
        with conn.transaction():
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    except psycopg.Error as error:
        raise translate(error, target, "dropping the fieldsync schema") from None
