"""Packing a stream of transactions into size-limited message files.

Rules of this file:
* Messages are cut at commit boundaries only.  A transaction whose message
  would not fit even alone is split into parts that carry it alone, numbered
  ``seq`` 0..k, all but the final with ``prev == last``.
* Every finished file is at most ``max_size`` bytes, counted on the file.
* The cut points are a pure function of the input stream, the start offset,
  the limit and the names: any producer (the agent, the Spark job) that packs
  the same stream makes the same files.  The compressed-size estimate used
  to choose cut points is carried along the stream, never taken from a clock
  or from outside state.
* Memory is bounded by one message plus one transaction of look-ahead,
  whatever the backlog.  A transaction of more than LARGE_TRANSACTION_OPS
  operations is cut into entries of that many and split into parts as its
  entries are made (docs/message-format.md, "Large transactions"); it may
  come in pieces, :class:`~codec.ops.PartialTransaction` values followed by
  a plain ``Transaction`` with the same commit, so that no one holds it
  whole.  Pieces or not, the same operations make the same files.
* One algorithm, two ways to feed it: :class:`_Packer` is a coroutine that
  asks for the next transaction when it needs one.  :func:`pack_messages`
  answers from an iterable (pull); :class:`MessagePacker` is handed the
  transactions one at a time (push), for one pass over the log that feeds
  many subscribers.  Both make the same files from the same stream.
* A transaction that carries a schema change (codec.changes) travels alone
  in its message, written in format version 3 whatever the stream's
  version: the message before it ends before it, the next starts after.
* A message (or group of parts) that holds a transaction with ``applied``
  is written in format version 4 (codec.message.entry_version; in a
  version-1 stream the transaction goes without it); the cut points do not
  depend on it.
* Cutting and compressing need no secret: :class:`PayloadPacker` makes the
  compressed payloads with their headers (:class:`Payload`), knowing only
  the sender's name and whether the files are sealed; :meth:`Payload.frame`
  seals and signs one where the key is.  The Spark job packs on executors
  that never see the key and frames in its driver (docs/spark.md).
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import islice
from typing import Generator, Iterable, Iterator

from .errors import InvalidValue
from .header import Header
from .keys import PublicKeys, SiteKeys
from .changes import MAX_CHANGE_BYTES
from .message import (
    APPLIED_VERSION,
    CHANGE_VERSION,
    DATA_VERSION,
    LARGE_TRANSACTION_OPS,
    MAX_PAYLOAD,
    EncodedMessage,
    array_header,
    check_version,
    compress,
    entry_version,
    frame,
    frame_overhead,
    max_raw_length,
    serialize_entry,
    serialize_transaction,
    transaction_runs,
)
from .names import Kind, MessageName, check_site_name
from .ops import PartialTransaction, Transaction, change_of, op_count, split_ops
from .payloads import MAX_GROUP_PAYLOAD

DEFAULT_MAX_SIZE = 50_000
MIN_MAX_SIZE = 10_000
MAX_MAX_SIZE = 16 * 1024 * 1024

# Fill to this share of the space by estimate; the rest absorbs estimate error.
_FILL = 0.97
# A message whose compressed payload came out under this share of the space
# is grown once with the corrected estimate.
_GROW_BELOW = 0.90
_INITIAL_RATIO = 0.5


def check_max_size(max_size: int) -> int:
    if type(max_size) is not int or not MIN_MAX_SIZE <= max_size <= MAX_MAX_SIZE:
        raise InvalidValue(f"maximum message size must be {MIN_MAX_SIZE}..{MAX_MAX_SIZE} bytes, got {max_size!r}")
    return max_size


class _Candidate:
    """A compressed payload for the first ``count`` queued transactions."""

    __slots__ = ("count", "raw_length", "compressed")

    def __init__(self, count: int, raw_length: int, compressed: bytes) -> None:
        self.count = count
        self.raw_length = raw_length
        self.compressed = compressed

    @property
    def expands_too_much(self) -> bool:
        """Over the decoder's expansion limit: fewer transactions, or a split."""
        return self.raw_length > max_raw_length(len(self.compressed))


@dataclass(frozen=True, slots=True)
class Payload:
    """A message before it is framed: its header and compressed payload,
    cut by the packer.  :meth:`frame` seals (when asked) and signs it."""

    header: Header
    raw_length: int
    compressed: bytes
    part: bool
    version: int = DATA_VERSION

    def frame(self, *, keys: SiteKeys, recipient: str, incarnation: bytes,
              seal_to: PublicKeys | None = None) -> EncodedMessage:
        data = frame(Kind.DATA, self.header, keys=keys, recipient=recipient, incarnation=incarnation,
                     raw_length=self.raw_length, compressed=self.compressed, part=self.part, seal_to=seal_to,
                     version=self.version)
        return EncodedMessage(str(MessageName(keys.site, recipient, Kind.DATA, self.header)), self.header, data)


# What the packer yields: a finished payload, or None to ask for the next
# transaction (sent back in; None when the input is exhausted).
_Steps = Generator["Payload | None", "Transaction | None", None]


def pack_messages(transactions: Iterable[Transaction], *, keys: SiteKeys, recipient: str,
                  incarnation: bytes, resend_count: int, start: int,
                  max_size: int = DEFAULT_MAX_SIZE, end: int | None = None,
                  seal_to: PublicKeys | None = None, version: int = DATA_VERSION) -> Iterator[EncodedMessage]:
    """Yield the message files for ``transactions`` (in commit order, after ``start``).

    ``start`` is the ``prev`` of the first message (the publisher's
    ``log_sent``).  When ``end`` is given and lies beyond the last
    transaction, the final message's ``last`` is raised to it (or, when
    there are no transactions at all, one empty message covers
    ``(start, end]``), so the receiver's ``log_received`` reaches the end of
    what was scanned even when the tail held nothing for it.  ``version``:
    the message format written (docs/message-format.md).
    """
    check_max_size(max_size)
    check_site_name(recipient)
    packer = _Packer(keys.site, recipient, resend_count, max_size, seal_to is not None, version)
    return (payload.frame(keys=keys, recipient=recipient, incarnation=incarnation, seal_to=seal_to)
            for payload in _pull_through(packer.run(start, end), iter(transactions)))


def _pull_through(steps: _Steps, source: Iterator[Transaction]) -> Iterator[Payload]:
    """Run the packer, answering each request for input from ``source``."""
    try:
        step = next(steps)
        while True:
            if step is None:
                step = steps.send(next(source, None))
            else:
                yield step
                step = next(steps)
    except StopIteration:
        return


class PayloadPacker:
    """The payloads of the files :func:`pack_messages` makes, for
    transactions handed over one at a time, without the key: ``sender`` is
    the site's name, ``sealed`` whether the files will be sealed (it changes
    the room a payload has).  :meth:`add` returns the payloads that became
    complete, :meth:`close` the rest; each :meth:`Payload.frame` with the
    site's key is the file :func:`pack_messages` makes.  Holds one message
    and the look-ahead it has been given.

    After an error (a bad transaction) the packer is spent: every later call
    raises :class:`InvalidValue`.
    """

    __slots__ = ("recipient", "_steps", "_spent")

    def __init__(self, *, sender: str, recipient: str, resend_count: int, start: int,
                 max_size: int = DEFAULT_MAX_SIZE, end: int | None = None, sealed: bool = False,
                 version: int = DATA_VERSION) -> None:
        check_max_size(max_size)
        self.recipient = check_site_name(recipient)
        self._steps = _Packer(sender, recipient, resend_count, max_size, sealed, version).run(start, end)
        # Run to the first request for input (checking ``start`` on the way).
        if next(self._steps) is not None:
            raise AssertionError("the packer made a message before it had any input")
        self._spent = False

    def add(self, transaction: Transaction) -> list[Payload]:
        """Queue ``transaction`` (the next in commit order); return the
        payloads it completed."""
        if transaction is None:
            raise InvalidValue(f"packer for {self.recipient}: a transaction is required (close() ends the stream)")
        return self._collect(transaction)

    def close(self) -> list[Payload]:
        """End the stream; return the remaining payloads."""
        return self._collect(None)

    def _collect(self, transaction: Transaction | None) -> list[Payload]:
        if self._spent:
            raise InvalidValue(f"packer for {self.recipient} was closed or failed")
        finished: list[Payload] = []
        try:
            step = self._steps.send(transaction)
            while step is not None:
                finished.append(step)
                step = next(self._steps)
        except StopIteration:
            self._spent = True
        except BaseException:
            self._spent = True
            raise
        return finished


class MessagePacker:
    """The files :func:`pack_messages` makes, for transactions handed over one
    at a time: :meth:`add` returns the messages that became complete,
    :meth:`close` the rest.  Holds what the pull form holds (one message and
    the look-ahead it has been given), so a caller feeding many subscribers
    from one pass over the log holds about one message for each.

    After an error (a bad transaction, a message that cannot be sealed) the
    packer is spent: every later call raises :class:`InvalidValue`.
    """

    __slots__ = ("recipient", "_payloads", "_keys", "_incarnation", "_seal_to")

    def __init__(self, *, keys: SiteKeys, recipient: str, incarnation: bytes, resend_count: int, start: int,
                 max_size: int = DEFAULT_MAX_SIZE, end: int | None = None,
                 seal_to: PublicKeys | None = None, version: int = DATA_VERSION) -> None:
        self._payloads = PayloadPacker(sender=keys.site, recipient=recipient, resend_count=resend_count,
                                       start=start, max_size=max_size, end=end, sealed=seal_to is not None,
                                       version=version)
        self.recipient = self._payloads.recipient
        self._keys, self._incarnation, self._seal_to = keys, incarnation, seal_to

    def add(self, transaction: Transaction) -> list[EncodedMessage]:
        """Queue ``transaction`` (the next in commit order); return the
        messages it completed."""
        return self._framed(self._payloads.add, transaction)

    def close(self) -> list[EncodedMessage]:
        """End the stream; return the remaining messages."""
        return self._framed(self._payloads.close)

    def _framed(self, step, *args) -> list[EncodedMessage]:  # type: ignore[no-untyped-def]
        payloads = step(*args)
        try:
            return [payload.frame(keys=self._keys, recipient=self.recipient, incarnation=self._incarnation,
                                  seal_to=self._seal_to) for payload in payloads]
        except BaseException:
            self._payloads._spent = True
            raise


class _Alone(bytes):
    """The serialized entry of a transaction that travels alone in its
    message (a schema change), in format version 3."""


class _Applied(bytes):
    """The serialized entry of a transaction with ``applied``, in format
    version 4: the message that holds it is written in that version."""


class _Large:
    """A transaction of more than LARGE_TRANSACTION_OPS operations being
    split: the operations handed over and not yet serialized, whether more
    pieces follow, and the serialized entries not yet put into parts (each
    with ``applied`` when its format ``version`` carries it)."""

    __slots__ = ("commit", "origin", "ops", "more", "data", "applied", "version")

    def __init__(self, commit: int, origin: str, ops: list, more: bool, applied: int | None, version: int) -> None:
        self.commit = commit
        self.origin = origin
        self.ops = ops
        self.more = more
        self.data = bytearray()
        self.applied = applied if version >= APPLIED_VERSION else None
        self.version = version

    @property
    def done(self) -> bool:
        return not (self.data or self.ops or self.more)


class _Packer:
    def __init__(self, sender: str, recipient: str, resend_count: int, max_size: int, sealed: bool,
                 version: int) -> None:
        self.recipient = recipient
        self.version = check_version(version)
        self.resend_count = resend_count
        self.space = max_size - frame_overhead(sender, recipient, sealed=sealed)
        if self.space < 1024:
            raise InvalidValue(f"maximum message size {max_size} leaves no room for a payload")
        self.target = int(self.space * _FILL)
        self.ratio = _INITIAL_RATIO
        # Transactions read but not yet placed: (commit, serialized bytes),
        # or a large transaction last, which holds the input until it is split.
        self.queue: list[tuple[int, bytes | _Large]] = []
        self.large: _Large | None = None
        self.exhausted = False
        self.last_commit = 0

    # -- input ------------------------------------------------------------------

    def _pull(self) -> Generator[None, Transaction | None, bool]:
        """Queue one more transaction; False when the input is exhausted (or
        a large transaction, still being handed over, waits to be split)."""
        if self.exhausted or self.large is not None:
            return False
        transaction = yield None
        if transaction is None:
            self.exhausted = True
            return False
        if transaction.commit <= self.last_commit:
            raise InvalidValue(f"transaction {transaction.commit} does not follow {self.last_commit}: "
                               "commit offsets must increase")
        self.last_commit = transaction.commit
        if change_of(transaction) is not None:
            alone = _Alone(serialize_transaction(transaction, CHANGE_VERSION))
            if len(alone) > MAX_CHANGE_BYTES:
                raise InvalidValue(f"the schema change at {transaction.commit} is {len(alone)} bytes, over the "
                                   f"{MAX_CHANGE_BYTES}-byte limit of one (docs/message-format.md)")
            self.queue.append((transaction.commit, alone))
            return True
        more = type(transaction) is PartialTransaction
        version = entry_version(self.version, transaction.applied)  # of its pieces, the first's
        runs = None  # to_runs of its operations, counted in the same pass (a run counts its rows)
        if self.version >= 2 and not more and len(transaction.ops) <= LARGE_TRANSACTION_OPS:
            runs, count = transaction_runs(transaction)
        else:
            count = op_count(transaction.ops)
        if more or count > LARGE_TRANSACTION_OPS:
            ops = list(transaction.ops)
            while more and count <= LARGE_TRANSACTION_OPS:
                piece = yield from self._piece(transaction.commit)
                ops.extend(piece.ops)
                count += op_count(piece.ops)
                more = type(piece) is PartialTransaction
            if count > LARGE_TRANSACTION_OPS:
                self.large = _Large(transaction.commit, transaction.origin, ops, more, transaction.applied, version)
                self.queue.append((transaction.commit, self.large))
                return True
            transaction = Transaction._trusted(transaction.commit, transaction.origin, tuple(ops),
                                               transaction.applied)
            runs = None
        serialized = serialize_transaction(transaction, version, runs)
        if version != self.version:
            serialized = _Applied(serialized)
        if len(serialized) > MAX_GROUP_PAYLOAD:
            raise InvalidValue(f"transaction {transaction.commit} is {len(serialized)} bytes, over the "
                               f"{MAX_GROUP_PAYLOAD}-byte limit of one transaction (docs/message-format.md, "
                               "\"Limits\"); commit it in smaller transactions")
        self.queue.append((transaction.commit, serialized))
        return True

    def _piece(self, commit: int) -> Generator[None, Transaction | None, Transaction]:
        """The next piece of the transaction ``commit``, handed over in pieces."""
        piece = yield None
        if piece is None or piece.commit != commit:
            raise InvalidValue(f"transaction {commit} was handed over in pieces, but "
                               f"{'the input ended' if piece is None else f'transaction {piece.commit} followed'}"
                               " before its last piece")
        return piece

    def _large_bytes(self, large: _Large, want: int) -> Generator[None, Transaction | None, None]:
        """Serialize entries of ``large`` until ``want`` bytes wait to be put
        into parts, or all of it does: each entry of exactly
        LARGE_TRANSACTION_OPS operations but the last, however the pieces came."""
        while len(large.data) < want and (large.ops or large.more):
            while large.more and op_count(large.ops) < LARGE_TRANSACTION_OPS:
                piece = yield from self._piece(large.commit)
                large.ops.extend(piece.ops)
                large.more = type(piece) is PartialTransaction
            head, large.ops = split_ops(large.ops, LARGE_TRANSACTION_OPS)
            entry = serialize_entry(large.commit, large.origin, head, large.version, large.applied)
            if len(entry) > MAX_GROUP_PAYLOAD:
                raise InvalidValue(f"transaction {large.commit} holds an entry of {len(entry)} bytes, over the "
                                   f"{MAX_GROUP_PAYLOAD}-byte limit (docs/message-format.md, \"Limits\")")
            large.data += entry

    def _count_by_estimate(self, minimum: int) -> Generator[None, Transaction | None, int]:
        """How many queued transactions fill the space by the current estimate."""
        count = 0
        raw = 1
        while True:
            if count == len(self.queue):
                # When no further transaction could join, whatever it is, do
                # not wait for one: a transaction pushed alone over the target
                # is packed (split) at once instead of held until the next.
                if count >= minimum and raw * self.ratio > self.target:
                    break
                if count >= max(minimum, 1) and raw >= MAX_PAYLOAD:
                    break
                if not (yield from self._pull()):
                    break
            entry = self.queue[count][1]
            if type(entry) is _Large:
                break  # it travels alone, in parts
            if type(entry) is _Alone:  # it travels alone, whole: a message of its own
                if count == 0:
                    raw += len(entry)
                    count = 1
                break
            size = len(entry)
            if count >= minimum and (raw + size) * self.ratio > self.target:
                break
            if count >= max(minimum, 1) and raw + size > MAX_PAYLOAD:
                break
            raw += size
            count += 1
        return count

    def _compress(self, count: int) -> _Candidate:
        payload = array_header(count) + b"".join(entry[1] for entry in islice(self.queue, count))  # type: ignore[misc]
        return _Candidate(count, len(payload), compress(payload))

    # -- output -----------------------------------------------------------------

    def run(self, start: int, end: int | None) -> _Steps:
        if start < 0:
            raise InvalidValue(f"start offset must be >= 0, got {start}")
        self.last_commit = start
        prev = start
        # (format version, header, raw length, compressed payload, part) of the message made last
        pending: tuple[int, Header, int, bytes, bool] | None = None
        while True:
            if self.queue and type(self.queue[0][1]) is _Large:
                commit, large = self.queue.pop(0)
                seq = 0
                while True:
                    chunk_raw, chunk, final = yield from self._large_part(large)  # type: ignore[arg-type]
                    if pending is not None:
                        yield self._finish(pending, None)
                    header = Header(self.resend_count, prev, commit if final else prev, seq)
                    pending = (large.version, header, chunk_raw, chunk, True)  # type: ignore[union-attr]
                    seq += 1
                    if final:
                        break
                self.large = None
                prev = commit
                continue
            count = yield from self._count_by_estimate(1)
            if count == 0:
                if self.queue:
                    continue  # a large transaction came: split it
                break
            candidate = yield from self._fit(count)
            if candidate is None:
                # The first queued transaction does not fit alone: split it.
                commit, serialized = self.queue.pop(0)
                version = APPLIED_VERSION if type(serialized) is _Applied else self.version
                for seq, chunk_raw, chunk, final in self._split(serialized):
                    if pending is not None:
                        yield self._finish(pending, None)
                    header = Header(self.resend_count, prev, commit if final else prev, seq)
                    pending = (version, header, chunk_raw, chunk, True)
                prev = commit
                continue
            last = self.queue[candidate.count - 1][0]
            if type(self.queue[0][1]) is _Alone:
                version = CHANGE_VERSION
            elif any(type(entry) is _Applied for _, entry in islice(self.queue, candidate.count)):
                version = APPLIED_VERSION
            else:
                version = self.version
            del self.queue[:candidate.count]
            if pending is not None:
                yield self._finish(pending, None)
            pending = (version, Header(self.resend_count, prev, last, 0), candidate.raw_length,
                       candidate.compressed, False)
            prev = last
        if pending is not None:
            yield self._finish(pending, end)
        elif end is not None and end > start:
            payload = array_header(0)
            yield self._finish((self.version, Header(self.resend_count, start, end, 0), len(payload),
                                compress(payload), False), None)

    def _finish(self, pending: tuple[int, Header, int, bytes, bool], end: int | None) -> Payload:
        version, header, raw_length, compressed, part = pending
        if end is not None and end > header.last:
            if header.is_part and not header.is_final_part:
                raise AssertionError("a non-final part cannot end the stream")
            header = Header(header.resend_count, header.prev, end, header.seq)
        return Payload(header, raw_length, compressed, part, version)

    def _fit(self, count: int) -> Generator[None, Transaction | None, _Candidate | None]:
        """The largest candidate that fits, by estimate plus correction; None
        when even the first transaction alone does not fit."""
        candidate = self._compress(count)
        if candidate.count == 1 and candidate.raw_length > MAX_PAYLOAD:
            return None  # compresses into one file, but a payload may not expand beyond MAX_PAYLOAD
        grown = False
        while len(candidate.compressed) > self.space or candidate.expands_too_much:
            self.ratio = len(candidate.compressed) / candidate.raw_length
            if candidate.count == 1:
                return None
            smaller = min((yield from self._count_by_estimate(0)), candidate.count - 1)
            candidate = self._compress(max(smaller, 1))
            grown = True  # never grow after shrinking
        self.ratio = len(candidate.compressed) / candidate.raw_length
        more_available = candidate.count < len(self.queue) or (yield from self._pull())
        if not grown and more_available and len(candidate.compressed) < self.space * _GROW_BELOW:
            larger = yield from self._count_by_estimate(candidate.count)
            if larger > candidate.count:
                attempt = self._compress(larger)
                if len(attempt.compressed) <= self.space and not attempt.expands_too_much:
                    candidate = attempt
                    self.ratio = len(candidate.compressed) / candidate.raw_length
        return candidate

    def _split(self, serialized: bytes) -> Iterator[tuple[int, int, bytes, bool]]:
        """Cut one transaction's bytes into parts that each fit."""
        offset = 0
        seq = 0
        total = len(serialized)
        while offset < total:
            length = min(total - offset, self._part_length())
            length, chunk = self._cut(serialized, offset, length)
            final = offset + length == total
            yield seq, length, chunk, final
            offset += length
            seq += 1

    def _large_part(self, large: _Large) -> Generator[None, Transaction | None, tuple[int, bytes, bool]]:
        """The next part of a large transaction, cut as :meth:`_split` cuts:
        ``(raw length, compressed, final)``."""
        want = self._part_length()
        yield from self._large_bytes(large, want)
        length, chunk = self._cut(large.data, 0, min(len(large.data), want))
        del large.data[:length]
        if not large.data:  # is this the last part?  Only if nothing more comes.
            yield from self._large_bytes(large, 1)
        return length, chunk, large.done

    def _part_length(self) -> int:
        return min(MAX_PAYLOAD, max(1, int(self.target / self.ratio)))

    def _cut(self, data: bytes | bytearray, offset: int, length: int) -> tuple[int, bytes]:
        """The longest part from ``offset`` of at most ``length`` bytes
        (by the running estimate) that fits, compressed."""
        while True:
            chunk = compress(data[offset:offset + length])
            if len(chunk) <= self.space and length <= max_raw_length(len(chunk)):
                break
            if len(chunk) <= self.space:  # compresses too well for the decoder's expansion limit
                length = max_raw_length(len(chunk))
                continue
            self.ratio = len(chunk) / length
            length = max(1, min(length - 1, int(self.target / self.ratio)))
        self.ratio = len(chunk) / length
        return length, chunk

