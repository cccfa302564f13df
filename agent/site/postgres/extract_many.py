"""Many SQLite remotes extracted from a PostgreSQL consolidated at one
point, each published table read once for all of them (the staging side
of agent.site.sqlite.extract_many).

Rules of this file:
* One consistent point for every remote: the reader's REPEATABLE READ
  transaction imports the snapshot of one cut (``PgConsolidated.cut_and_share``),
  so every remote holds exactly the changes at or below its log end E and
  the remotes' rows are read as they were at E, all in that cut.
* Each table is read once, in that snapshot, whatever the number of
  remotes that get it: its rows, as the log carries them
  (extract.read_rows), go to a staging SQLite file beside the remotes'
  files, each with the number of its SUBSCRIBE BY value among the values
  the remotes subscribe to (a row whose value no remote has is left out).
  A value's number is found by Python's equality, the test the log's
  readers and the single extraction make, so every remote gets what
  ``extract`` alone would give it.  A table a remote gets through several
  articles is staged as that remote's union keeps it (extract.union_rows),
  once for the remotes whose articles and values are the same.
* A remote's copy takes its rows from the staging file (``INSERT ...
  SELECT`` through the numbers of its values); the staging file is a
  scratch file (no journal, no fsync) removed when the context ends.
"""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import psycopg

from codec.fsutil import claim_temporary, remove_database_file

from ..errors import ExtractionError
from ..remote_rules import RemoteUser
from ..sqlite._db import quote_ident, write_transaction
from ..sqlite.extract import TablePlan
from .connect import connect, translate
from .extract import PgConsolidated, read_rows, record_schema_version, union_rows

# A table as remotes get it: name, published columns, SUBSCRIBE BY, and
# when a remote gets it through several articles, what each keeps.
_Key = tuple[str, tuple[str, ...], str | None, tuple]


def _key(plan: TablePlan) -> _Key:
    return (plan.info.name, plan.columns, plan.subscribe_by,
            tuple((part.publication, part.columns, part.subscribe_by, part.values) for part in plan.parts))


@dataclass(frozen=True, slots=True)
class StagedTable:
    name: str                            # the staging file's table: value_id, then the published columns
    numbers: Mapping[object, int] | None  # each SUBSCRIBE BY value's number (None: every row, no numbers)


@dataclass(frozen=True, slots=True)
class PgStagedRows:
    """The remotes' rows read at ``offset``, in the staging file ``path``."""

    path: Path
    offset: int
    rows_before: Mapping[str, RemoteUser]
    tables: Mapping[_Key, StagedTable]
    removed: tuple[str, ...] = ()  # staging files extractions that did not finish left (claim_temporary)
    version: tuple[int, str] | None = None  # the consolidated's schema version at offset
    consolidated: str = ""

    def before(self, remote: str) -> RemoteUser:
        return self.rows_before[remote]

    def copy_into(self, copy: sqlite3.Connection, remote: str, plans: list[TablePlan]) -> dict[str, int]:
        copy.execute("ATTACH DATABASE ? AS staging", (str(self.path),))
        try:
            counts = {}
            with write_transaction(copy, f"copying the rows of {remote!r}"):
                record_schema_version(copy, self.version, self.consolidated)
                for plan in plans:
                    staged = self.tables[_key(plan)]
                    names = ", ".join(map(quote_ident, plan.columns))
                    sources = ", ".join(f"c{number}" for number in range(len(plan.columns)))
                    insert = (f"INSERT INTO main.{quote_ident(plan.info.name)} ({names})"
                              f" SELECT {sources} FROM staging.{staged.name}")
                    parameters: tuple = ()
                    if staged.numbers is not None:
                        assert plan.values is not None
                        insert += " WHERE value_id IN (SELECT value FROM json_each(?))"
                        parameters = (json.dumps(sorted(staged.numbers[value] for value in plan.values)),)
                    counts[plan.info.name] = copy.execute(insert, parameters).rowcount
            return counts
        finally:
            copy.execute("DETACH DATABASE staging")


@dataclass(frozen=True, slots=True)
class PgFleetSource(PgConsolidated):
    """A PostgreSQL consolidated as the extraction of many remotes uses it
    (agent.site.sqlite.extract_many's StagingSource)."""

    def stage_rows(self, wanted: Sequence[tuple[str, list[TablePlan]]], folder: Path
                   ) -> contextlib.AbstractContextManager[PgStagedRows]:
        return stage_rows(self, wanted, folder)


@contextlib.contextmanager
def stage_rows(source: PgConsolidated, wanted: Sequence[tuple[str, list[TablePlan]]], folder: Path
               ) -> Iterator[PgStagedRows]:
    """Cut the log once for the remotes of ``wanted`` and read each of
    their tables once, in the cut's snapshot, into a staging file in
    ``folder``; the file is removed when the context ends."""
    tables: dict[_Key, tuple[TablePlan, set | None]] = {}
    for _remote, plans in wanted:
        for plan in plans:
            _plan, values = tables.setdefault(_key(plan), (plan, None if plan.values is None else set()))
            if values is not None and plan.values is not None:
                values |= plan.values
    # Claimed while it lives, so that one a killed extraction left is
    # removed by the next (codec.fsutil.claim_temporary).
    try:
        name, removed, claim = claim_temporary(folder / "fieldsync-staging.db")
    except OSError as error:
        raise ExtractionError(f"cannot create a staging file in {folder} ({error.strerror or error})") from None
    path = Path(name)
    doing = f"reading the rows of {len(wanted)} remotes"
    try:
        staging = sqlite3.connect(path, isolation_level=None)
        try:
            staging.execute("PRAGMA journal_mode = OFF")  # a scratch file: nothing to recover
            staging.execute("PRAGMA synchronous = OFF")
            reader = connect(source.target)
            try:
                with reader.transaction():
                    reader.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                    offset, before, version = source.cut_and_share(reader, [remote for remote, _plans in wanted])
                    staged = {key: _stage(reader, staging, source, number, plan, values)
                              for number, (key, (plan, values)) in enumerate(tables.items())}
            except psycopg.Error as error:
                raise translate(error, source.target, doing) from None
            finally:
                reader.close()
        finally:
            staging.close()
        yield PgStagedRows(path, offset, before, staged, tuple(removed), version, source.identity.name)
    finally:
        remove_database_file(path)
        os.close(claim)  # after SQLite closed the file


def _stage(reader: psycopg.Connection, staging: sqlite3.Connection, source: PgConsolidated, number: int,
           plan: TablePlan, values: set | None) -> StagedTable:
    """Read ``plan``'s table once into the staging table ``s<number>``:
    the rows whose SUBSCRIBE BY value is one of ``values`` (every row when
    None), each with its value's number."""
    name = f"s{number}"
    width = len(plan.columns)
    staging.execute(f"CREATE TABLE {name} (value_id INTEGER, {', '.join(f'c{i}' for i in range(width))})")
    insert = f"INSERT INTO {name} VALUES ({', '.join('?' * (width + 1))})"
    numbers = None if values is None else {value: index for index, value in enumerate(values)}
    staging.execute("BEGIN")
    shape = source.shapes[plan.info.name]
    # A table a remote gets through several articles: its rows as that
    # remote's union keeps them (staged for the remotes of the same union).
    for rows in (union_rows(reader, plan, shape) if plan.parts
                 else read_rows(reader, plan, shape, None if values is None else frozenset(values))):
        if numbers is None:
            staging.executemany(insert, [(None, *row) for row in rows])
        else:
            staging.executemany(insert, [(numbers[row[width]], *row[:width]) for row in rows
                                         if row[width] in numbers])
    staging.execute(f"CREATE INDEX {name}_value ON {name} (value_id)")
    staging.execute("COMMIT")
    return StagedTable(name, numbers)
