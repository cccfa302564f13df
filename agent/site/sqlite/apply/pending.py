"""A remote's pending rows: its own changes the consolidated has not confirmed.

Rules of this file:
* A remote applies what the consolidated sends as is, except on rows with
  its own changes the consolidated has not confirmed (*pending* rows):
  there it keeps its own values against operations written without them.
* Pending rows are read from the remote's own log transactions after what
  the consolidated confirmed, once while nothing new is confirmed
  (:meth:`Pending.own_changes` keeps and extends its result).  A
  transaction of rows written back to the remote says what the
  consolidated had applied of it when it wrote them: from that
  transaction on, the batch's pending rows are read after that offset
  (:meth:`Pending.confirmed_for`), which confirms nothing else.
* Pending rows are by table under its name of now, and their columns
  under their names of now: a row this remote logged before it applied a
  rename of its table is the renamed table's, and a value it wrote to a
  column renamed since is the renamed column's (one dropped since is no
  longer its own), through the changes this site applied
  (agent.site.apply.reshape.column_moves; a retired name is never given
  again, so an old name always means the old column).
* :class:`Pending` is given the connection, the shapes, the statements and
  the key moves (a remote takes a key the consolidated moves a row onto).
"""

from __future__ import annotations

import json
import sqlite3
from operator import itemgetter

from codec.changes import RENAME_TABLE, SchemaChange
from codec.ops import OpKind, Transaction

from ...apply.batch import Batch, KEY_TAKEN, MOVES_FOLLOWED, Own, key_after, set_aside
from ...apply.reshape import column_moves, column_now
from ...capture import (FLAG_CONCURRENT_DELETE, FLAG_PENDING_MOVE, FLAG_WITH_PARENT, KIND_DELETE, KIND_INSERT,
                        KIND_UPDATE, Shape)
from ...values import operation_problem
from ..capture import ShapeCache, write_capture_row
from ..route import parent_missing
from ..selection import renames as table_renames
from .keymoves import KeyMoves
from .statements import SqliteTable, Statements, refused_by_key


class Pending:
    """A remote's pending rows: reading them, and applying to them."""

    def __init__(self, conn: sqlite3.Connection, shapes: ShapeCache, statements: Statements,
                 key_moves: KeyMoves) -> None:
        self._conn = conn
        self._shapes = shapes
        self._statements = statements
        self._key_moves = key_moves
        # own_changes' last result: (confirmed, end, pending rows, the schema changes they were read with).
        self._own_kept: tuple[int, int, dict[str, dict[tuple, Own]], tuple] | None = None

    def own_changes(self, site: str, confirmed: int, end: int) -> dict[str, dict[tuple, Own]]:
        """The own changes of this remote (``site``) in its log after
        ``confirmed`` (what the consolidated has confirmed) up to ``end``, by
        table and row.  Only log transactions of this site are read, and only
        once while the consolidated confirms nothing new: the result is kept
        and extended by the next call (reading a transaction again, after a
        rolled-back apply cut it once more, changes nothing)."""
        conn = self._conn
        kept = self._own_kept
        changes = conn.execute("SELECT count(*), max(commit_offset) FROM fieldsync_schema_change").fetchone()
        if kept is not None and kept[0] == confirmed and kept[1] <= end and kept[3] == changes:
            start, pending = kept[1], kept[2]
        else:
            start, pending = confirmed, {}
        spans = conn.execute("SELECT first_seq, commit_offset FROM fieldsync_log WHERE commit_offset > ?"
                             " AND commit_offset <= ? AND origin = ? ORDER BY commit_offset",
                             (start, end, site)).fetchall()
        self._own_kept = (confirmed, end, pending, changes)
        captured = [row for first, last in spans for row in conn.execute(
            "SELECT * FROM fieldsync_capture WHERE seq >= ? AND seq <= ? ORDER BY seq", (first, last))]
        renames = table_renames(conn) if captured else {}
        retired = column_moves(step for (steps,) in conn.execute(
            "SELECT steps FROM fieldsync_schema_change ORDER BY commit_offset") for step in json.loads(steps)) \
            if captured and changes[0] else {}
        names_now: dict[int, tuple[str | None, ...]] = {}  # by shape: each column's name now (None: dropped)
        # The consolidated's changes of the key of pending rows, as applied here.
        moves = conn.execute("SELECT * FROM fieldsync_capture WHERE seq > ? AND seq <= ? AND flags & ? ORDER BY seq",
                             (start, end, FLAG_PENDING_MOVE)).fetchall()
        if moves:
            captured = sorted([*captured, *moves], key=itemgetter(0))
        for row in captured:
            shape = self._shapes.get(row[1])
            name = shape.table.lower()
            table = renames.get(name, name).lower()
            rows = pending.setdefault(table, {})
            columns = names_now.get(row[1])
            if columns is None:
                columns = names_now[row[1]] = tuple(column_now(column, retired.get(table, []))
                                                    for column in shape.columns)
            width = len(columns)
            positions = shape.key_positions
            old = row[4:4 + width]
            old_key = tuple(old[i] for i in positions)
            kind = row[2]
            if row[3] and row[3] & FLAG_PENDING_MOVE:
                new = row[4 + width:4 + 2 * width]
                _rekey(rows, old_key, tuple(new[i] for i in positions))
            elif kind == KIND_INSERT:
                own = _own_entry(rows, old_key, row[0])
                own.values = {column: value for column, value in zip(columns, old) if column is not None}
                own.seqs = dict.fromkeys(own.values, row[0])
                own.deleted = False
                own.moved_to = None
            elif kind == KIND_DELETE:
                own = _own_entry(rows, old_key, row[0])
                own.values = {}
                own.seqs = {}
                own.deleted = True
                own.moved_to = None
            else:
                new = row[4 + width:4 + 2 * width]
                new_key = tuple(new[i] for i in positions)
                changed = {column: after for column, before, after in zip(columns, old, new)
                           if column is not None and not (type(before) is type(after) and before == after)}
                if new_key != old_key:
                    # Its values go with it; they are its own where it wrote them.
                    gone = _own_entry(rows, old_key, row[0])
                    moved_values = {column: value for column, value in gone.values.items()
                                    if column not in changed}
                    seqs = {**{column: gone.seqs[column] for column in moved_values},
                            **dict.fromkeys(changed, row[0])}
                    gone.values = {}
                    gone.seqs = {}
                    gone.deleted = True
                    gone.moved_to = new_key
                    own = _own_entry(rows, new_key, row[0])
                    own.values = {**moved_values, **changed}
                    own.seqs = seqs
                    own.moved_to = None
                else:
                    own = _own_entry(rows, old_key, row[0])
                    own.values.update(changed)
                    own.seqs.update(dict.fromkeys(changed, row[0]))
                own.deleted = False
        return pending

    @staticmethod
    def confirmed_for(transaction: Transaction, site: str, confirmed: int, log_sent: int) -> int:
        """What the consolidated had applied of this remote (``site``) when
        it wrote ``transaction`` and every later one of its stream: the
        ``applied`` of a transaction of rows written back to this site, no
        more than the remote sent (``log_sent``), else ``confirmed``.  The
        operations from there on were written with the remote's changes up
        to it (docs/protocol.md, "What a data message says of the
        recipient's own changes"); the protocol's confirmation still comes
        by control message."""
        applied = transaction.applied
        if transaction.origin != site or type(applied) is not int:
            return confirmed
        return max(confirmed, min(applied, log_sent))

    @staticmethod
    def renamed(pending: dict[str, dict[tuple, Own]], change: SchemaChange) -> None:
        """A batch's pending rows after ``change`` renamed their table, or
        renamed or dropped their columns (the rows are copied: the kept
        result stays as it was read, in case the batch is rolled back)."""
        for step in change.steps:
            if step[0] == RENAME_TABLE and step[1].lower() in pending:
                pending[step[2].lower()] = pending.pop(step[1].lower())
            elif step[0] in ("rename_column", "drop_column") and step[1].lower() in pending:
                moves = [list(step)]
                pending[step[1].lower()] = {key: _moved(own, moves) for key, own in pending[step[1].lower()].items()}

    def apply_one(self, table: SqliteTable, op: tuple, own: Own, batch: Batch) -> None:
        """Apply an operation of the consolidated to a row this remote changed
        itself and the consolidated has not confirmed.

        The consolidated applies those changes after every operation it wrote
        without them, and sends the outcome back if they conflict.  So the
        remote keeps a value it wrote and still holds when the operation's
        before-image shows it was written without that value; a DELETE
        written so is marked, and an INSERT of the row that follows gets the
        remote's values; a row the remote deleted stays deleted.  A row in
        this state is not an error when it is missing or present: the
        consolidated settles it.
        """
        statements = self._statements
        problem = operation_problem(op)
        if problem is not None:
            statements.error(batch, op, f"malformed operation: {problem}")
            return
        conn = self._conn
        kind, key, before, after = op[1], op[2], op[3], op[4]
        local = statements.select(table, key)
        if local is None and kind != OpKind.DELETE and own.moved_to is not None:
            # This site gave the row another key: the UPDATE or INSERT,
            # written before the consolidated applied that, concerns the row
            # there (the consolidated applies the move to the row the INSERT
            # re-created).  Not a DELETE: the consolidated may re-create the
            # row under its old key after it, and apply the move to that row.
            rows = batch.pending[table.name.lower()]
            for _ in range(MOVES_FOLLOWED):
                if own.moved_to is None or own.moved_to not in rows:
                    break
                key = own.moved_to
                own = rows[key]
                local = statements.select(table, key)
                if local is not None:
                    break
        try:
            if kind == OpKind.INSERT:
                if local is not None and key != op[2]:
                    # Re-created under the key this site moved the row away
                    # from: its values, but the key and this site's own.
                    written = {column: value for column, value in after.items()
                               if column in table.column_set and column not in table.key_columns
                               and not (column in own.values and sqlite_equal(local[column], own.values[column]))}
                    if written:
                        conn.execute(statements.update_sql(table, tuple(written), ()), (*written.values(), *key))
                elif local is not None:
                    pass  # its own row: the consolidated settles it (created on both sides, or sent back whole)
                elif not own.deleted:
                    values = dict(after)
                    if own.values:
                        for column in self._deleted_without(table, key, own):
                            if column in table.column_set:
                                values[column] = own.values[column]
                    conn.execute(statements.insert_sql(table, tuple(values), ignore=False), tuple(values.values()))
            elif local is None:
                pass  # gone here, by its own DELETE or one written without its change
            elif kind == OpKind.UPDATE:
                held = _held(table, own, local, before, after)
                written = {column: value for column, value in after.items() if column not in held}
                if written:
                    sql, params = statements.update_sql(table, tuple(written), ()), (*written.values(), *key)
                    taken = False
                    try:
                        conn.execute(sql, params)
                    except sqlite3.IntegrityError as error:
                        if refused_by_key(error) or not self._key_moves.take_key(table, sql, params, key, written):
                            raise
                        taken = True
                    moved = key_after(table.key_columns, key, written)
                    if moved != key:
                        self._moved_pending(table, batch, local, written, key, moved)
                    if taken:
                        statements.error(batch, op, KEY_TAKEN)
                        return
            else:
                concurrent = {column: before[column] for column in own.values
                              if _holds_own(own, local, before, column)}
                conn.execute(statements.delete_sql(table), key)
                shape = table.shape
                if shape is not None:
                    self._capture_delete(shape, local, concurrent)
        except sqlite3.IntegrityError as error:
            if refused_by_key(error):
                set_aside(batch, table, op, f"constraint failed: {error}")
            else:
                statements.error(batch, op, f"constraint failed: {error}")
            return
        batch.applied += 1

    def _moved_pending(self, table: SqliteTable, batch: Batch, local: dict, written: dict, key: tuple,
                       moved: tuple) -> None:
        """The consolidated gave a row with this site's pending changes another
        key: they stay pending under it, for the rest of the batch and (by
        the FLAG_PENDING_MOVE row captured here, which own_changes reads)
        until the consolidated confirms them."""
        shape = table.shape
        if shape is None:
            return
        name = table.name.lower()
        rows = batch.pending[name] = dict(batch.pending[name])  # the cached one stays as the log has it
        _rekey(rows, key, moved)
        values = [local.get(column) for column in shape.columns]
        values += [written.get(column, local.get(column)) for column in shape.columns]
        if self._statements.skips_capture:
            write_capture_row(self._conn, shape, KIND_UPDATE, FLAG_PENDING_MOVE, values)
        else:
            self._conn.execute("UPDATE fieldsync_capture SET flags = ? WHERE seq = (SELECT max(seq) FROM"
                               " fieldsync_capture) AND kind = ? AND shape = ?",
                               (FLAG_PENDING_MOVE, KIND_UPDATE, shape.id))

    def _capture_delete(self, shape: Shape, local: dict, concurrent: dict) -> None:
        """Record a DELETE of a row with pending changes, for _deleted_without.
        When it was written without this site's values (``concurrent``: the
        consolidated's values there), the captured row is marked and its
        unused second half holds the row with those values."""
        conn = self._conn
        marked = bool(concurrent) and all(column in shape.columns for column in concurrent)
        values = [local.get(column) for column in shape.columns]
        if marked:
            values += [concurrent.get(column, local.get(column)) for column in shape.columns]
        if self._statements.skips_capture:  # the trigger did not capture it
            write_capture_row(conn, shape, KIND_DELETE, FLAG_CONCURRENT_DELETE if marked else None, values)
        elif marked:
            width = len(shape.columns)
            assignments = ", ".join(f"v{width + index} = ?" for index in range(width))
            conn.execute(f"UPDATE fieldsync_capture SET flags = ?, {assignments} WHERE seq = (SELECT max(seq)"
                         " FROM fieldsync_capture) AND kind = ? AND shape = ?",
                         (FLAG_CONCURRENT_DELETE, *values[width:], KIND_DELETE, shape.id))

    def _went_with_parent(self, table: SqliteTable, own: Own, went: dict) -> set[str]:
        """The columns of ``own`` an INSERT of the consolidated gets from this
        site when the row last went along with its parent (a capture row
        flagged FLAG_WITH_PARENT holds it as it went): the consolidated
        knew nothing of it there, so every value of this site's it still
        held, but a foreign key naming a parent that is not here (the
        consolidated refused it, and the row comes back under its own)."""
        kept = {column for column, value in own.values.items()
                if column in went and column not in table.key_columns and sqlite_equal(went[column], value)}
        follow = self._statements.follows.get(table.name.lower())
        if follow is not None and kept.intersection(follow.columns) and parent_missing(self._conn, follow, own.values):
            kept -= set(follow.columns)
        return kept

    def _deleted_without(self, table: SqliteTable, key: tuple, own: Own) -> set[str]:
        """The columns of ``own`` in which the last DELETE of row ``key``
        applied here after ``own.seq`` was written without this site's own
        value (empty unless that DELETE is marked FLAG_CONCURRENT_DELETE):
        those marked, and, as for an UPDATE (_held), every column this site
        wrote in the change they show it was written without or a later one
        and still held when the DELETE came."""
        since = own.seq
        shapes = self._statements.table_shapes(table)
        if not shapes:
            return set()
        cursor = self._conn.execute(
            f"SELECT * FROM fieldsync_capture WHERE seq > ? AND kind = ? AND shape IN ({', '.join('?' * len(shapes))})"
            " ORDER BY seq DESC", (since, KIND_DELETE, *shapes))
        try:
            for row in cursor:
                shape = self._shapes.get(row[1])
                if tuple(row[4 + i] for i in shape.key_positions) != key:
                    continue
                if (row[3] or 0) & FLAG_WITH_PARENT:
                    return self._went_with_parent(table, own, dict(zip(shape.columns, row[4:4 + len(shape.columns)])))
                if not (row[3] or 0) & FLAG_CONCURRENT_DELETE:
                    return set()
                width = len(shape.columns)
                deleted = dict(zip(shape.columns, row[4:4 + width]))
                marked = {column for index, column in enumerate(shape.columns)
                          if column in own.values and not sqlite_equal(row[4 + index], row[4 + width + index])}
                return marked | _written_with(table, own, marked, deleted)
        finally:
            cursor.close()
        return set()


def _own_entry(rows: dict[tuple, Own], key: tuple, seq: int) -> Own:
    own = rows.get(key)
    if own is None:
        own = rows[key] = Own(seq)
    own.seq = seq
    return own


def _rekey(rows: dict[tuple, Own], key: tuple, moved: tuple) -> None:
    """Pending changes of the row at ``key`` now belong to the row at ``moved``."""
    own = rows.pop(key, None)
    if own is not None and not own.deleted:
        rows[moved] = own


def _held(table: SqliteTable, own: Own, local: dict, before: dict, after: dict) -> set[str]:
    """The columns of an UPDATE of the consolidated's in which the remote
    keeps its own pending value.  Those where the before-image shows the
    UPDATE was written without it (_holds_own); and then, since the
    consolidated applies the remote's changes in order, every column the
    remote wrote in that change or a later one and still holds, even where
    the before-image happens to show the same value (the remote wrote a
    column back to an older value: A to B to A)."""
    held = {column for column in after if _holds_own(own, local, before, column)}
    return held | {column for column in _written_with(table, own, held, local) if column in after}


def _written_with(table: SqliteTable, own: Own, held: set[str], row: dict) -> set[str]:
    """The columns (not of the key) that this remote wrote, pending, in the
    change that set one of ``held`` or a later one, and that ``row`` still
    holds as it wrote them.  The consolidated applies a remote's changes in
    order: an operation written without one of them was written without
    those too."""
    if not held:
        return set()
    cut = min(own.seqs.get(column, own.seq) for column in held)
    return {column for column, value in own.values.items()
            if column in row and column not in table.key_columns and own.seqs.get(column, 0) >= cut
            and sqlite_equal(row[column], value)}


def _holds_own(own: Own, local: dict, before: dict | None, column: str) -> bool:
    """Whether the remote still holds its own pending value of ``column`` and
    the incoming operation was written without it (its before-image differs
    there): then the consolidated applies the remote's value after it."""
    if column not in own.values or column not in local or not before or column not in before:
        return False
    value = local[column]
    return sqlite_equal(value, own.values[column]) and not sqlite_equal(before[column], value)


def _moved(own: Own, moves: list[list]) -> Own:
    """A copy of ``own`` with its columns under their names after ``moves``."""
    copy = Own(own.seq)
    copy.deleted, copy.moved_to = own.deleted, own.moved_to
    for column, value in own.values.items():
        now = column_now(column, moves)
        if now is not None:
            copy.values[now] = value
            if column in own.seqs:
                copy.seqs[now] = own.seqs[column]
    return copy


def sqlite_equal(left: object, right: object) -> bool:
    """Equality as the ``IS`` of the conditional UPDATE sees it: numbers by
    value (1 = 1.0), text and blobs by type and content, NaN as NULL."""
    if isinstance(left, float) and left != left:
        left = None
    if isinstance(right, float) and right != right:
        right = None
    if type(left) in _NUMBERS and type(right) in _NUMBERS:
        return left == right
    return type(left) is type(right) and left == right


_NUMBERS = (int, float)
