"""Reading the log for subscribers: ranges, transactions (whole or in
pieces) and one pass for many subscribers, over either backend's log.

Rules of this file:
* Both bounds of a read are commit boundaries (:func:`resolve_range`), so
  transactions are never cut; memory holds one chunk of capture rows and
  what is selected from one log transaction (or one piece of it).
* Selection is agent.site.selection's, folding agent.site.folding's: this
  file only drives them over a :class:`CaptureSource`, a backend's log
  (agent.site.sqlite.log.SqliteLog, agent.site.postgres.log.PgLog).  Nothing here
  knows which backend it reads.
* Commit offsets are integers that grow with the log: SQLite's are the seq
  of a log transaction's last capture row, PostgreSQL's number the log
  transactions 1, 2, 3, ...  Either way ``(commit - 1, commit]`` holds the
  one log transaction ``commit`` and nothing else.
"""

from __future__ import annotations

from itertools import islice
from types import MappingProxyType
from typing import Callable, Generator, Iterator, Mapping, NamedTuple, Protocol, Sequence

from codec.changes import SchemaChange
from codec.ops import Operation, PartialTransaction, Transaction, op_count

from .capture import Shape
from .concern import CONCERN_MIN_SUBSCRIBERS, Concern, concern, concerned_by
from .folding import FOLD_WINDOW, _Folder, make_transaction
from .errors import LogOffsetError
from .fanout import FANOUT_HOLD, Fanout, with_applied
from .identity import Role, SiteIdentity
from .selection import Shapes, SubscriberReader


class LoggedOperation(NamedTuple):
    """One operation of the log as a subscriber sees it."""

    commit: int
    origin: str
    operation: Operation


class CaptureSource(Protocol):
    """A backend's log as the readers here see it."""

    def log_end(self) -> int:
        """The commit offset of the last log transaction (0 for an empty log)."""

    def check_boundary(self, offset: int, what: str) -> None:
        """Raise (LogOffsetError, LogTruncated) unless ``offset`` is 0, the
        truncation point or a commit offset; ``what`` names it in the line."""

    def iter_capture(self, after: int, until: int, *, skip_origin: str | None = None, keep_flag: int = 0,
                     value_columns: int | None = None, image_columns: int | None = None
                     ) -> Generator[tuple[int, str, list[tuple]], None, None]:
        """``(commit, origin, rows)`` for the log transactions in ``(after,
        until]`` in log order, a chunk of one log transaction at a time, rows
        ``(seq, shape, kind, flags, v0, ...)`` with the values as they
        travel; log transactions of ``skip_origin`` left out but their rows
        with a flag in ``keep_flag``; at least ``value_columns`` values a row
        (None: all of them), or ``image_columns`` for an INSERT or DELETE
        row (one image, where the reader's tables have no routes), if given."""

    def applied(self, commit: int) -> int | None:
        """For the log transaction ``commit`` of rows an apply wrote back to
        its origin, the origin's log offset the apply had reached (None:
        any other log transaction)."""


class ReaderRows(NamedTuple):
    """What a backend reads its site for to make many subscribers' readers
    (SubscriberReader.many_from_rows): every shape, the article rows, the
    subscribers' subscription rows and how to find a returned row's columns."""

    shapes: list[Shape]
    articles: list[tuple]
    subscriptions: Mapping[str, list[tuple]]
    returned_columns: Callable[[int], str | None]
    # The site's table renames, old name -> name now (change_rows.table_renames).
    renames: Mapping[str, str] = MappingProxyType({})
    # The articles removed since the log's truncation point (plan_from_rows).
    removed: Sequence[tuple] = ()

    def readers(self, identity: SiteIdentity, shapes: Shapes, subscribers: list[str], *, runs: bool = False
                ) -> list[SubscriberReader]:
        """A reader for each of ``subscribers``, finding shapes in ``shapes``."""
        return SubscriberReader.many_from_rows(identity, shapes, self.shapes, self.articles, self.subscriptions,
                                               subscribers, self.returned_columns, runs=runs, renames=self.renames,
                                               removed=self.removed)


def worth_a_look(identity: SiteIdentity, reads: int) -> bool:
    """Whether :func:`concerned_indexes` is asked at all: at a consolidated,
    for many reads (a remote reads for its consolidated alone)."""
    return identity.role is Role.CONSOLIDATED and reads >= CONCERN_MIN_SUBSCRIBERS


class ConcernRows(NamedTuple):
    """What a backend reads its site for to find which subscribers a range
    concerns (:func:`concerned_indexes`): the article rows, the table
    renames, and a query of the subscription rows a :class:`Concern` can
    match (:meth:`Concern.wanted`: those rows alone, not the fleet's)."""

    articles: list[tuple]
    renames: Mapping[str, str]
    subscriptions: Callable[[Concern], Mapping[str, list[tuple]]]


def concerned_indexes(source: CaptureSource, shapes: Shapes, rows: ConcernRows, subscribers: list[str],
                      ranges: list[tuple[int, int]]) -> list[int]:
    """The indexes of those of ``subscribers`` (with their ``ranges``) that
    their ranges can concern (agent.site.concern): at a consolidated of
    thousands, a few changed rows concern a few of them, and only those
    need a reader; the others' reads would yield nothing."""
    every = list(range(len(subscribers)))
    # A range the log cannot serve is named, for its read to say so.
    distinct = set(ranges)  # most reads share their range
    bad: set[tuple[int, int]] = set()
    for start, end in distinct:
        try:
            resolve_range(source, start, end)
        except LogOffsetError:  # LogTruncated too
            bad.add((start, end))
    good = [bounds for bounds in distinct if bounds not in bad]
    found: set[str] | None = set()
    if good and max(end for _, end in good) > min(start for start, _ in good):
        after = min(start for start, _ in good)
        chunks = source.iter_capture(after, max(end for _, end in good))
        try:
            what = concern(shapes, rows.articles, chunks, renames=rows.renames)
        finally:
            chunks.close()
        found = None if what is None else concerned_by(what, rows.subscriptions(what), subscribers, after)
    if found is None:
        return every
    if not bad:
        return [index for index, name in enumerate(subscribers) if name in found]
    return [index for index, name in enumerate(subscribers) if name in found or ranges[index] in bad]


def resolve_range(source: CaptureSource, after: int, until: int | None) -> int:
    source.check_boundary(after, "start offset")
    end = source.log_end()
    if until is None:
        until = end
    else:
        if until > end:
            raise LogOffsetError(f"end offset {until} lies beyond the log end {end}")
        source.check_boundary(until, "end offset")
    if until < after:
        raise LogOffsetError(f"end offset {until} lies before start offset {after}")
    return until

def read_operations(source: CaptureSource, reader: SubscriberReader, after: int, until: int
                    ) -> Iterator[LoggedOperation]:
    for commit, origin, rows in source.iter_capture(after, until, skip_origin=reader.subscriber,
                                                    keep_flag=reader.returned_flag,
                                                    value_columns=reader.value_columns):
        ops: list[Operation] = []
        reader.at(commit)
        reader.extend(origin, rows, ops)
        for op in ops:
            if type(op) is not SchemaChange:  # operations only: a schema change comes with read_transactions
                yield LoggedOperation(commit, origin, op)

def read_transactions(source: CaptureSource, reader: SubscriberReader, after: int, until: int, *,
                      piece: int | None = None) -> Iterator[Transaction]:
    """Group :func:`read_operations` into transactions; a log transaction
    with nothing for the subscriber yields nothing.  With ``piece``, a log
    transaction that selects more operations comes in pieces of about that
    many (``PartialTransaction`` values and a last plain ``Transaction``,
    codec.packing), so none is held whole.  A transaction of the
    subscriber's own origin (rows written back to it) carries ``applied``
    (fanout.with_applied)."""
    pairs = ((0, transaction) for transaction in _read_transactions(source, reader, after, until, piece))
    return (transaction for _, transaction in with_applied(pairs, [reader.subscriber], source.applied))


def _read_transactions(source: CaptureSource, reader: SubscriberReader, after: int, until: int,
                       piece: int | None) -> Iterator[Transaction]:
    ops: list[Operation] = []
    held = 0  # operations in ops (a run counts its rows)
    folder: _Folder | None = None
    commit, origin = 0, ""
    for logged_commit, logged_origin, rows in source.iter_capture(after, until, skip_origin=reader.subscriber,
                                                                  keep_flag=reader.returned_flag,
                                                                  value_columns=reader.value_columns,
                                                                  image_columns=reader.image_columns):
        if logged_commit != commit:
            if folder is not None:
                yield _last_piece(commit, origin, folder, ops)
                folder = None
            elif ops:
                yield from _transaction(commit, origin, ops)
            ops, held = [], 0
            commit, origin = logged_commit, logged_origin
            reader.at(commit)
        before = len(ops)
        reader.extend(logged_origin, rows, ops)
        held += op_count(islice(ops, before, None))
        if piece is not None and held >= piece + FOLD_WINDOW:
            if folder is None:
                folder = _Folder()
            folder.add(ops)
            ops, held = [], 0
            taken = folder.take(FOLD_WINDOW)
            if taken:
                yield PartialTransaction._trusted(commit, origin, tuple(taken))
    if folder is not None:
        yield _last_piece(commit, origin, folder, ops)
    elif ops:
        yield from _transaction(commit, origin, ops)

def _last_piece(commit: int, origin: str, folder: "_Folder", ops: list[Operation]) -> Transaction:
    """The last piece of a transaction read in pieces (perhaps empty: every
    piece before it was yielded already)."""
    folder.add(ops)
    return Transaction._trusted(commit, origin, tuple(folder.take(0)))

def read_fanout(source: CaptureSource, readers: list[SubscriberReader], ranges: list[tuple[int, int]], *,
                hold: int = FANOUT_HOLD, piece: int | None = None) -> Iterator[tuple[int, Transaction]]:
    """What :func:`read_transactions` yields for each reader over its range
    ``(after, until]`` (commit boundaries the caller checked), from one pass
    over the log: ``(index, transaction)`` pairs, each reader's in commit
    order.

    A log transaction from which more than ``hold`` operations are selected
    (for all readers together) is dropped from the pass and read for each of
    its subscribers in turn, so memory holds what one subscriber's read
    holds plus about ``hold`` operations (the check comes after each chunk
    of capture rows).  A single reader reads as :func:`read_transactions`
    does.  ``piece``: as for :func:`read_transactions`, where a log
    transaction is read for one subscriber.
    """
    if not readers:
        return iter(())
    if len(readers) == 1:
        after, until = ranges[0]
        pairs = ((0, transaction) for transaction in _read_transactions(source, readers[0], after, until, piece))
    else:
        pairs = _read_fanout(source, Fanout(readers, ranges), hold, piece)
    return with_applied(pairs, [reader.subscriber for reader in readers], source.applied)

def _read_fanout(source: CaptureSource, fanout: Fanout, hold: int, piece: int | None
                 ) -> Iterator[tuple[int, Transaction]]:
    readers, ranges = fanout.readers, fanout.ranges
    width = max(reader.value_columns for reader in readers)
    # INSERT and DELETE rows hold one image: read that narrow unless a
    # reader's tables have routes (which come after the widest image).
    images = [reader.image_columns for reader in readers]
    image_width = None if None in images else max(images)  # type: ignore[type-var]
    position = min(after for after, _ in ranges)
    until = max(until for _, until in ranges)
    while position < until:
        chunks = source.iter_capture(position, until, value_columns=width, image_columns=image_width)
        dropped = None
        for commit, origin, rows in chunks:
            yield from fanout.add(commit, origin, rows)
            if fanout.held > hold and len(fanout.active) > 1:
                dropped = fanout.drop()
                break
        if dropped is None:
            yield from fanout.finish()
            return
        chunks.close()
        commit, active = dropped
        for index in active:
            # (commit - 1, commit] holds that one log transaction (rules above).
            for transaction in _read_transactions(source, readers[index], commit - 1, commit, piece):
                yield index, transaction
                # Not held while the next subscriber's copy is built: one at a time.
                del transaction
        position = commit

def _transaction(commit: int, origin: str, ops: list[Operation]) -> Iterator[Transaction]:
    transaction = make_transaction(commit, origin, ops)
    if transaction is not None:
        yield transaction
