"""A table published where extracted remotes subscribe: sent to them
through their streams, with no new extraction (docs/postgres.md, "Schema
changes"; a SQLite consolidated's send_new_article_locked).

Rules of this file:
* Two transactions, because a schema change is a log transaction of its
  own (log.cut_in) and the table's rows must come after it in the log:
  the first (:func:`send_new_table_in`, inside the one that publishes the
  table) writes the change that creates the table at the remotes and
  leaves the table's row capture off; the second (:func:`finish_sends`)
  locks the table against writers, writes every row it holds as an
  INSERT capture row (as the capture triggers would), and turns its
  capture on.  A write between the two is not captured, and need not be:
  the second reads the table after it, so its rows hold it.
* ``fieldsync.table_send`` holds the tables whose rows are still to be
  sent (their row capture off): :func:`finish_sends` runs after the first
  transaction and before every cut (``PostgresSite.scan``), so a process
  that died between the two is finished by the next agent run.
* A table that follows its parent goes as extraction makes it: with its
  foreign keys to the publication's tables, each row with the route it
  has when it is sent (route.py), so it reaches the subscribers of its
  parent.  Its parents' move triggers leave it out until then
  (route.install_moves), so a parent moved between the two transactions
  writes nothing for its rows, which go with their route of then.
* A table published in other publications already keeps its capture (their
  subscribers need it): the transaction that publishes it writes the
  change and then, for each extracted subscriber of the new publication
  alone, every row as an INSERT written back to that remote
  (:func:`_send_to_each`), as a SQLite site does.  A remote of the new
  publication that gets the table through another already is refused, as
  there.
"""

from __future__ import annotations

import psycopg
from psycopg import sql

from ..capture import FLAG_RETURN_TO_ORIGIN, KIND_INSERT
from ..errors import PublicationError
from .capture import TRIGGER_PREFIX, list_written_back, load_shapes, set_origin, shown_table
from .changes import write_change
from .extract import remote_table_sql
from .foreign_keys import foreign_keys, kept_keys
from .indexes import indexes, kept_indexes
from .route import chains, install_moves, route_expression
from .typemap import KINDS

# The row triggers of a table's capture (capture._EVENTS' suffixes).
_ROW_TRIGGERS = tuple(TRIGGER_PREFIX + suffix for suffix in ("ins", "upd", "del"))
# The tables whose rows are still to be sent, as they are named now.
_WAITING = """
SELECT w.table_oid, n.nspname, c.relname FROM fieldsync.table_send w
  JOIN pg_catalog.pg_class c ON c.oid = w.table_oid JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace
"""


def send_new_table_in(conn: psycopg.Connection, site: str, publication: str, schema: str, table: str,
                      made_at: object) -> bool:
    """Inside the transaction that published ``schema.table`` in
    ``publication``: when an extracted remote subscribes to it, write the
    change that creates the table at the remotes and turn the table's row
    capture off until :func:`finish_sends` sends its rows (a table
    published elsewhere already: its rows go in this transaction,
    :func:`_send_to_each`).  False: no such remote, nothing done."""
    if conn.execute("SELECT 1 FROM fieldsync.subscription s JOIN fieldsync.remote r ON r.name = s.remote"
                    " WHERE s.publication = %s AND s.until IS NULL AND r.peer_incarnation IS NOT NULL LIMIT 1",
                    (publication,)).fetchone() is None:
        return False
    shown = shown_table(schema, table)
    rows = conn.execute("SELECT publication, shape, columns, subscribe_by, follows FROM fieldsync.article"
                        " WHERE table_schema = %s AND table_name = %s", (schema, table)).fetchall()
    [(_publication, shape_id, columns, subscribe_by, follows)] = [row for row in rows if row[0] == publication]
    elsewhere = len(rows) > 1
    if elsewhere:
        _check_not_held(conn, publication, schema, table)
    shapes = load_shapes(conn)
    shape = shapes[shape_id]
    published = shape.layout.columns if columns is None else tuple(columns)
    keys: list = []
    if follows is not None:  # the foreign keys to the publication's tables, as extraction makes them
        parents = {shown_table(parent_schema, parent): shapes[parent_shape].layout.key_columns
                   for parent_schema, parent, parent_shape in conn.execute(
                       "SELECT table_schema, table_name, shape FROM fieldsync.article WHERE publication = %s",
                       (publication,))}
        keys = kept_keys(foreign_keys(conn).get(shown, ()), published, parents)
        subscribe_by = None  # its rows go by their routes
    steps: list[tuple] = [("create_table", shown, remote_table_sql(shape, published, keys), publication,
                           subscribe_by)]
    (oid,) = conn.execute("SELECT %s::regclass::oid", (sql.Identifier(schema, table).as_string(conn),)).fetchone()
    # Its indexes the remotes can have, as extraction makes them (indexes.py).
    carried = kept_indexes(indexes(conn, table=oid).get(shown, ()), published)
    steps += [("create_index", shown, index.name, index.sql()) for index in carried]
    write_change(conn, site, steps, {shown: shape_id}, steps, [], made_at,
                 indexes={index.name: list(index.columns) for index in carried})
    if elsewhere:
        _send_to_each(conn, publication, schema, table, shape_id)
        return True
    conn.execute("INSERT INTO fieldsync.table_send (table_oid) VALUES (%s)", (oid,))
    _switch(conn, schema, table, "DISABLE")
    if follows is not None:
        install_moves(conn)  # its parents' moves leave it alone until its rows are sent
    return True


def finish_sends(conn: psycopg.Connection) -> int:
    """Send the rows of every table whose rows are still to be sent (see the
    rules above), one transaction each; return how many tables.  The
    connection is in autocommit mode, with no transaction open."""
    waiting = conn.execute(_WAITING).fetchall()
    for oid, schema, table in waiting:
        with conn.transaction():
            identifier = sql.Identifier(schema, table)
            conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(identifier))
            if conn.execute("DELETE FROM fieldsync.table_send WHERE table_oid = %s", (oid,)).rowcount == 0:
                continue  # sent meanwhile (by another session)
            found = conn.execute("SELECT shape FROM fieldsync.article WHERE table_oid = %s LIMIT 1", (oid,)).fetchone()
            if found is None:
                continue  # no longer published: nothing to send
            routed = _capture_rows(conn, schema, table, found[0], 0)
            _switch(conn, schema, table, "ENABLE")
            if routed:
                install_moves(conn)  # its parents' moves carry its rows from now on
    return len(waiting)


def _capture_rows(conn: psycopg.Connection, schema: str, table: str, shape_id: int, flags: int) -> bool:
    """Write every row of the table as an INSERT capture row with
    ``flags``, in key order, as the capture triggers write one (a row that
    follows its parent with its route after the widest image, route.py);
    whether the rows carry routes."""
    layout = load_shapes(conn)[shape_id].layout
    values = sql.SQL(", ").join(sql.SQL(KINDS[kind].capture).format(sql.Identifier(column))
                                for column, kind in zip(layout.columns, layout.kinds))
    row = sql.SQL("ARRAY[{}]").format(values)
    chain = chains(conn).get((schema, table))
    if chain is not None:
        route = route_expression(chain, [sql.Identifier(schema, table, column) for column in chain.columns])
        row = sql.SQL("{} || pg_catalog.array_fill(NULL::pg_catalog.text, ARRAY[{}]) || ARRAY[{}]").format(
            row, sql.Literal(len(layout.columns)), route)
    conn.execute(sql.SQL("INSERT INTO fieldsync.capture (shape, kind, flags, v) SELECT {}, {}, {}, {} FROM {}"
                         " ORDER BY {}").format(
        sql.Literal(shape_id), sql.Literal(KIND_INSERT), sql.Literal(flags), row, sql.Identifier(schema, table),
        sql.SQL(", ").join(map(sql.Identifier, layout.key_columns))))
    return chain is not None


def _check_not_held(conn: psycopg.Connection, publication: str, schema: str, table: str) -> None:
    """Refuse, as a SQLite site does, when an extracted remote of
    ``publication`` gets the table through another publication already."""
    found = conn.execute(
        "SELECT s.remote, a.publication FROM fieldsync.subscription s JOIN fieldsync.subscription t"
        " ON t.remote = s.remote AND t.until IS NULL JOIN fieldsync.article a ON a.publication = t.publication"
        " JOIN fieldsync.remote r ON r.name = s.remote WHERE s.publication = %s AND s.until IS NULL"
        " AND a.table_schema = %s AND a.table_name = %s AND a.publication <> %s AND r.peer_incarnation IS NOT NULL"
        " ORDER BY s.remote LIMIT 1", (publication, schema, table, publication)).fetchone()
    if found is not None:
        shown = shown_table(schema, table)
        raise PublicationError(f"{found[0]!r} subscribes to {publication!r} and gets {shown!r} through "
                               f"{found[1]!r} already; publish {shown!r} in {publication!r} before extracting "
                               "such a remote")


def _send_to_each(conn: psycopg.Connection, publication: str, schema: str, table: str, shape_id: int) -> None:
    """The rows of a table published in other publications already (its
    capture runs on for their subscribers), in the transaction that
    publishes it in ``publication``: for each extracted subscriber of it
    alone, every row as an INSERT written back to that remote, with it as
    the rows' origin, so that no other remote gets them again.  A writing
    transaction's rows of each origin are a log transaction of their own
    (log.cut_in), after the change; the table is locked against writers
    first, so a write before reaches no such remote and a write after
    comes after the rows."""
    conn.execute(sql.SQL("LOCK TABLE {} IN SHARE ROW EXCLUSIVE MODE").format(sql.Identifier(schema, table)))
    remotes = [remote for (remote,) in conn.execute(
        "SELECT DISTINCT s.remote FROM fieldsync.subscription s JOIN fieldsync.remote r ON r.name = s.remote"
        " WHERE s.publication = %s AND s.until IS NULL AND r.peer_incarnation IS NOT NULL ORDER BY s.remote",
        (publication,))]
    for remote in remotes:
        set_origin(conn, remote)
        _capture_rows(conn, schema, table, shape_id, FLAG_RETURN_TO_ORIGIN)
        list_written_back(conn, remote)
    set_origin(conn, None)


def _switch(conn: psycopg.Connection, schema: str, table: str, how: str) -> None:
    for trigger in _ROW_TRIGGERS:
        conn.execute(sql.SQL("ALTER TABLE {} {} TRIGGER {}").format(sql.Identifier(schema, table), sql.SQL(how),
                                                                   sql.Identifier(trigger)))

