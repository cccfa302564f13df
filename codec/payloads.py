"""The msgpack payloads of message files (docs/message-format.md,
"Payloads"): the limits a reader decodes them under, a data payload's
transactions (version 1: operations; version 2: runs of rows; version 3:
runs, or one schema change alone; version 4: and a transaction's
``applied``), a control payload's counters, and a group of parts read part
by part.

Rules of this file:
* Everything here is behind the frame's checks (codec.message): the bytes
  were signed by the sender; these checks guard against a faulty peer.
* Errors are :class:`~codec.errors.CorruptMessage` or
  :class:`~codec.errors.MessageTooLarge`, naming the file or group.
* Lengths are bounded before a container is built; a group is never
  joined: a reader holds one part and one operation (version 2: one run).
* A whole version-2 payload is read the quick way first (msgspec, typed
  by codec.ops.Run; an array is never longer than the bytes left), which
  accepts nothing the careful way refuses and gives what it gives; any
  payload it does not take is read the careful way, which decides.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from itertools import repeat
from typing import Annotated, Iterator, Protocol, Sequence

import msgpack
import msgspec

from .changes import CHANGE_TAG, check_change
from .collector import collector_paused
from .errors import CorruptMessage, InvalidValue, MessageTooLarge
from .header import Header
from .ops import INT64_MAX, Operation, OpKind, Run, Transaction, change_of

# Largest uncompressed payload a message may carry: the packer never makes
# more, the decoder refuses more (a decompression bomb is rejected, not expanded).
MAX_PAYLOAD = 16 * 1024 * 1024
# Largest transaction entry a multi-part group may carry (summed over its
# parts for a group of one entry; docs/message-format.md, "Large transactions").
MAX_GROUP_PAYLOAD = 256 * 1024 * 1024
# Counters of the protocol's epochs travel in the header's 32-bit field.
COUNTER_MAX = 2**32 - 1
# The format version whose transactions may carry ``applied`` (codec.message.APPLIED_VERSION).
APPLIED_VERSION = 4


class Message(Protocol):
    """What a group reader needs of a decoded part (codec.message.Message)."""

    header: Header
    version: int
    part: bytes | None


@dataclass(frozen=True, slots=True)
class ControlState:
    """The sender's view of the pair, carried by a control message.

    Every field is monotone (receivers merge by max): ``log_received`` and
    ``rereceive_count`` describe what the sender received from the recipient
    (a confirmation, and a resend request when ``rereceive_count`` grew);
    ``log_sent`` and ``resend_count`` describe what the sender has sent, so a
    lost last message can be noticed.  ``asks_confirmation`` travels in the
    header (its ``seq``, 1 or 0), not the payload: the sender's own stream to
    the recipient is unconfirmed, and it asks for an answer (a probe); when
    False, the sender holds a confirmation of all it sent, up to ``log_sent``.
    ``schema_version`` (format version 3 only) is the commit offset, in the
    consolidated's log, of the last schema change applied at the sender (a
    remote); None: the message says nothing of it (docs/protocol.md,
    "Schema versions").
    """

    log_received: int
    rereceive_count: int
    log_sent: int
    resend_count: int
    asks_confirmation: bool = False
    schema_version: int | None = None

    def __post_init__(self) -> None:
        # Offsets are log positions (64-bit); the counters are epochs, which
        # every message header carries in 32 bits: a larger one could never
        # be sent again, so it is refused here, before it changes any state.
        for field, top in (("log_received", INT64_MAX), ("rereceive_count", COUNTER_MAX),
                           ("log_sent", INT64_MAX), ("resend_count", COUNTER_MAX)):
            value = getattr(self, field)
            if type(value) is not int or not 0 <= value <= top:
                raise InvalidValue(f"control {field} must be an integer in 0..{top}, got {value!r}")
        version = self.schema_version
        if version is not None and (type(version) is not int or not 0 <= version <= INT64_MAX):
            raise InvalidValue(f"control schema_version must be an integer in 0..{INT64_MAX}, got {version!r}")
        if type(self.asks_confirmation) is not bool:
            raise InvalidValue(f"control asks_confirmation must be a bool, got {self.asks_confirmation!r}")

    def header(self) -> Header:
        return Header(resend_count=self.rereceive_count, prev=0, last=self.log_received,
                      seq=int(self.asks_confirmation))


_UNPACK_ERRORS = (msgpack.UnpackException, ValueError, TypeError, UnicodeDecodeError, OverflowError,
                  RecursionError)


def _limits(size: int, version: int) -> dict[str, int]:
    """msgpack length limits for a payload of ``size`` bytes in format
    ``version`` (docs/message-format.md, "What a reader checks"): in
    version 1 an array holds transactions of 5 bytes at least and a map
    entry takes 2; in version 2 a row of nils takes a byte a value and there
    are no maps; no ext type is used.  A payload of millions of one-byte
    empty containers is refused instead of decoded."""
    if version == 1:
        return dict(max_array_len=size // 5 + 16, max_map_len=size // 2 + 16, max_str_len=size,
                    max_bin_len=size, max_ext_len=0)
    # max_map_len=0 still lets an empty map through: the hook refuses any
    # map as soon as it is made (a payload of empty maps would cost 64
    # bytes a byte).
    return dict(max_array_len=size + 16, max_map_len=0, max_str_len=size, max_bin_len=size, max_ext_len=0,
                object_hook=_no_map)


def _no_map(_map: dict) -> None:
    raise ValueError("a map in a version-2 payload")


def _unpack(payload: bytes, source: str, version: int = 1) -> object:
    try:
        return msgpack.unpackb(payload, use_list=False, raw=False, strict_map_key=True,
                               **_limits(len(payload), version))
    except _UNPACK_ERRORS as error:
        raise CorruptMessage(source, f"payload is not valid msgpack ({type(error).__name__})") from None


# A control payload of format version 3 may add the sender's schema version.
SCHEMA_VERSION_CONTROL = 3


def control_payload(state: ControlState) -> tuple[int, ...]:
    """The ints a control message's payload holds: four, and the schema
    version when the state carries one (then the file is version 3)."""
    counters = (state.log_received, state.rereceive_count, state.log_sent, state.resend_count)
    return counters if state.schema_version is None else (*counters, state.schema_version)


def control_state(payload: bytes, source: str, header: Header | None = None, version: int = 1) -> ControlState:
    """The control state of a control message's payload and ``header``
    (whose ``seq`` says whether it asks for a confirmation: 0 or 1) in
    format ``version``: four counters, and in version 3 perhaps the
    sender's schema version after them."""
    fields = _unpack(payload, source)
    sizes = (4, 5) if version >= SCHEMA_VERSION_CONTROL else (4,)
    if type(fields) is not tuple or len(fields) not in sizes:
        raise CorruptMessage(source, "control payload must hold four counters"
                             + (" and perhaps a schema version" if len(sizes) > 1 else ""))
    seq = 0 if header is None else header.seq
    if seq not in (0, 1):
        raise CorruptMessage(source, f"a control message's seq must be 0 or 1, got {seq}")
    try:
        return ControlState(*fields[:4], asks_confirmation=bool(seq),
                            schema_version=fields[4] if len(fields) == 5 else None)
    except InvalidValue as error:
        raise CorruptMessage(source, f"bad control payload: {error}") from None


def transactions_of(payload: bytes, header: Header, source: str, version: int,
                    runs: bool) -> tuple[Transaction, ...]:
    """The transactions of a data payload in format ``version`` (``runs``:
    a version-2 to 4 payload's runs instead of the operations they stand
    for), checked; CorruptMessage names ``source``.  Version 2, the one
    data messages are written in, is read the quick way first.  Made
    into operations, the runs read are dropped as they go: the cyclic
    collector is paused meanwhile (codec.collector).  Runs handed
    back live on, and the collector would walk them all at once when it
    runs again, costing more than the passes it made as they were read."""
    if runs:
        return _transactions_of(payload, header, source, version, runs)
    with collector_paused():
        return _transactions_of(payload, header, source, version, runs)


def _transactions_of(payload: bytes, header: Header, source: str, version: int,
                     runs: bool) -> tuple[Transaction, ...]:
    if version == 2:
        checked = version2_runs(payload, header, runs)
        if checked is not None and runs:
            return tuple([Transaction._trusted(commit, origin, entry_runs) for commit, origin, entry_runs in checked])
        if checked is not None:
            made = [(commit, origin, _operations(entry_runs, check=True)) for commit, origin, entry_runs in checked]
            if all(made_ops is not None for _, _, made_ops in made):
                return tuple(Transaction._trusted(commit, origin, made_ops) for commit, origin, made_ops in made)
    # Not one the quick reading vouches for: the careful one says why, or reads it.
    return careful_transactions(payload, header, source, version, runs)


def careful_transactions(payload: bytes, header: Header, source: str, version: int,
                         runs: bool) -> tuple[Transaction, ...]:
    """:func:`transactions_of` of a payload of any version, read and checked
    in Python: what the quick reading of version 2 (:func:`version2_runs`)
    hands over, and the error it does not give."""
    entries = _unpack(payload, source, version)
    if type(entries) is not tuple:
        raise CorruptMessage(source, "payload must be an array of transactions")
    previous, last = header.prev, header.last
    result = []
    heads: dict = {}  # the run heads this payload holds, each checked once
    for entry in entries:
        transaction = _transaction(entry, source, version, runs, heads)
        commit = transaction.commit
        if not previous < commit <= last:
            raise CorruptMessage(source, f"transaction {commit} is outside {header} or out of order")
        previous = commit
        result.append(transaction)
    # Only versions 3 and after carry schema changes (in version 2 one is a malformed run).
    if version >= 3 and len(result) > 1 and any(change_of(transaction) is not None for transaction in result):
        raise CorruptMessage(source, "a schema change travels alone in its message")
    return tuple(result)


# The quick reading of a version-2 payload: msgspec decodes it in the
# shape Run's annotations give (arrays of the right lengths, ints and
# strings in their ranges, scalar values), in C, into Run values; what a
# type cannot say is checked below over the whole payload.
_version2 = threading.local()
VERSION2_SHAPE = tuple[tuple[Annotated[int, msgspec.Meta(ge=1)], Annotated[str, msgspec.Meta(min_length=1)],
                             tuple[Run, ...]], ...]
_INSERT, _UPDATE, _DELETE = OpKind.INSERT, OpKind.UPDATE, OpKind.DELETE
# Column lists a quick reading remembers as checked, for each kind's
# before and after lists: a payload's runs use a few, and a run's list is
# compared with this many at most before its names are checked.
SEEN_COLUMN_LISTS = 8


def version2_runs(payload: bytes, header: Header,
                  runs: bool = True) -> tuple[tuple[int, str, tuple[Run, ...]], ...] | None:
    """The entries of a version-2 payload, checked as the careful reading
    (:func:`_transaction`) checks them, or more (values are scalars);
    None when any of it does not hold, or the payload holds a blob: the
    careful reading then says what is wrong, or reads it.  ``runs`` False:
    what each run holds (its names distinct, its kind's column lists, its
    rows' lengths) is left to the caller, which makes the operations they
    stand for and checks it as it goes (``_operations(..., check=True)``)."""
    decoder = getattr(_version2, "decoder", None)
    if decoder is None:
        decoder = _version2.decoder = msgspec.msgpack.Decoder(VERSION2_SHAPE)
    try:
        entries = decoder.decode(payload)
    except (ValueError, TypeError, RecursionError):  # msgspec's DecodeError and UnicodeDecodeError are ValueErrors
        return None
    previous, last = header.prev, header.last
    for commit, _, _ in entries:
        if not previous < commit <= last:
            return None
        previous = commit
    if not runs:
        return entries
    # A payload repeats a few column lists many times: those checked are
    # remembered (_checked), by kind and side, and a run's lists are
    # compared with them, as equal strings compare without being hashed.
    insert_after: list[tuple[str, ...]] = []
    update_before: list[tuple[str, ...]] = []
    update_after: list[tuple[str, ...]] = []
    delete_before: list[tuple[str, ...]] = []
    for _, _, entry_runs in entries:
        for _, kind, key_width, before, after, rows in entry_runs:
            if kind == _INSERT:  # no before columns
                if before or (after not in insert_after and not _checked(after, insert_after)):
                    return None
            elif kind == _UPDATE:
                if ((before not in update_before and not _checked(before, update_before))
                        or (after not in update_after and not _checked(after, update_after))):
                    return None
            elif after or (before not in delete_before and not _checked(before, delete_before)):  # a DELETE
                return None
            width = key_width + len(before) + len(after)
            for row in rows:
                if len(row) != width:
                    return None
    return entries


def _checked(names: tuple[str, ...], seen: list[tuple[str, ...]]) -> bool:
    """Whether a column list's names are distinct; one that is goes into
    ``seen`` while it holds fewer than SEEN_COLUMN_LISTS (a list beyond
    them is checked again each time it comes)."""
    if len(set(names)) != len(names):
        return False
    if len(seen) < SEEN_COLUMN_LISTS:
        seen.append(names)
    return True


def _transaction(entry: object, source: str, version: int = 1, runs: bool = False,
                 heads: dict | None = None) -> Transaction:
    # Operations stay the plain 5-tuples (version 1) or rows (version 2)
    # msgpack made (see codec.ops): their values are checked where they are
    # applied, which touches each value anyway; checking them here would
    # cost more than decoding.
    applied = None
    try:
        commit, origin, ops = entry  # type: ignore[misc]
    except (TypeError, ValueError):
        if version < APPLIED_VERSION or type(entry) is not tuple or len(entry) != 4:
            raise CorruptMessage(source, "payload holds a malformed transaction") from None
        commit, origin, applied, ops = entry
        _check_applied(applied, commit, source)
    if (type(commit) is not int or not 0 < commit <= INT64_MAX or type(origin) is not str
            or not origin or type(ops) is not tuple):
        raise CorruptMessage(source, "payload holds a malformed transaction")
    if version >= 3 and len(ops) >= 1 and type(ops[0]) is tuple and ops[0] and type(ops[0][0]) is int:
        if len(ops) != 1 or len(ops[0]) != 3 or ops[0][0] != CHANGE_TAG or applied is not None:
            raise CorruptMessage(source, f"transaction {commit} holds a malformed schema change")
        try:
            change = check_change(ops[0][1:], f"transaction {commit}'s schema change")
        except InvalidValue as error:
            raise CorruptMessage(source, str(error)) from None
        return Transaction._trusted(commit, origin, (change,))
    if version >= 2:
        return Transaction._trusted(commit, origin, _runs(ops, commit, source, heads, runs), applied)
    if ops and (set(map(type, ops)) != {tuple} or set(map(len, ops)) != {5}):
        raise CorruptMessage(source, f"transaction {commit} holds a malformed operation")
    return Transaction._trusted(commit, origin, ops)


def _check_applied(applied: object, commit: int, source: str) -> None:
    if type(applied) is not int or not 0 < applied <= INT64_MAX:
        raise CorruptMessage(source, f"transaction {commit} holds a malformed applied offset (an int in "
                                     f"1..{INT64_MAX}), got {applied!r:.40}")


_NAMES = frozenset({str})
_new = tuple.__new__


def _runs(ops: tuple, commit: int, source: str, heads: dict | None = None,
          runs: bool = True) -> tuple[Run, ...] | tuple[Operation, ...]:
    """Decoded version-2 runs, checked for structure (their values are
    checked where they are applied); ``runs`` False: the operations they
    stand for (as :meth:`Run.operations` makes them), made once all are checked.
    ``heads`` maps a run's head (table, kind, key width, column names) to
    its row width once checked: a payload repeats a few heads many times."""
    if heads is None:
        heads = {}
    for run in ops:
        try:
            table, kind, key_width, before, after, rows = run
        except (TypeError, ValueError):  # not an array of six (a string of six is refused by its head)
            raise CorruptMessage(source, f"transaction {commit} holds a malformed run") from None
        head = (table, kind, key_width, before, after)
        try:
            width = heads.get(head)
        except TypeError:  # a list or map where a name belongs
            width = None
        if width is None:
            width = heads[head] = _head_width(head, commit, source)
        # true and 1.0 are equal to 1: a head equal to a checked one may
        # hold them where its ints are.
        if type(kind) is not int or type(key_width) is not int or type(rows) is not tuple or not rows:
            raise CorruptMessage(source, f"transaction {commit} holds a malformed run")
        for row in rows:
            if type(row) is not tuple or len(row) != width:
                raise CorruptMessage(source, f"transaction {commit} holds a run with a malformed row")
    if runs:
        return tuple(map(_new, repeat(Run), ops))
    return _operations(ops)


def _operations(runs: Sequence[tuple], check: bool = False) -> tuple[Operation, ...] | None:
    """The operations runs stand for: Run.operations of each, without
    making the Runs (the hot path of a reader of operations).  ``check``:
    None unless each run holds what the careful reading checks (its
    kind's column lists, rows of its width, names the images of its last
    operation hold as many of: a name twice would be one key), checked as
    the operations are made (a row of another width makes none).  A run
    of one row (most of them) is made without a comprehension, which
    costs a call of its own."""
    made: list = []
    append = made.append
    for table, kind, key_width, before, after, rows in runs:
        width = key_width + len(before) + len(after)
        if check and ((kind == _INSERT and before) or (kind == _DELETE and after)):
            return None
        if len(rows) == 1:
            row = rows[0]
            if len(row) != width:
                if check:
                    return None
                continue
            if kind == _INSERT:
                append(_new(Operation, (table, kind, row[:key_width], None, dict(zip(after, row[key_width:])))))
            elif kind == _DELETE:
                append(_new(Operation, (table, kind, row[:key_width], dict(zip(before, row[key_width:])), None)))
            else:
                middle = key_width + len(before)
                append(_new(Operation, (table, kind, row[:key_width], dict(zip(before, row[key_width:middle])),
                                        dict(zip(after, row[middle:])))))
        else:
            start = len(made)
            if kind == _INSERT:
                made += [_new(Operation, (table, kind, row[:key_width], None, dict(zip(after, row[key_width:]))))
                         for row in rows if len(row) == width]
            elif kind == _DELETE:
                made += [_new(Operation, (table, kind, row[:key_width], dict(zip(before, row[key_width:])), None))
                         for row in rows if len(row) == width]
            else:
                middle = key_width + len(before)
                made += [_new(Operation, (table, kind, row[:key_width], dict(zip(before, row[key_width:middle])),
                                          dict(zip(after, row[middle:])))) for row in rows if len(row) == width]
            if check and len(made) - start != len(rows):
                return None
        if check:
            last = made[-1]
            if (last[3] is not None and len(last[3]) != len(before)) or (
                    last[4] is not None and len(last[4]) != len(after)):
                return None
    return tuple(made)


def _head_width(head: tuple, commit: int, source: str) -> int:
    """The row width of a run with this head, or CorruptMessage."""
    table, kind, width, before, after = head
    if (type(table) is not str or not table or type(kind) is not int or not 1 <= kind <= 3
            or type(width) is not int or width < 1 or type(before) is not tuple or type(after) is not tuple
            or (kind == 1 and before) or (kind == 3 and after)):
        raise CorruptMessage(source, f"transaction {commit} holds a malformed run")
    names = before + after
    if (not _NAMES.issuperset(map(type, names)) or "" in names or len(set(before)) != len(before)
            or len(set(after)) != len(after)):
        raise CorruptMessage(source, f"transaction {commit} holds a run with bad column names")
    return width + len(names)


def _run(run: object, commit: int, source: str) -> Run:
    """One decoded version-2 run, checked for structure."""
    return _runs((run,), commit, source)[0]  # type: ignore[return-value]


def reassemble(parts: Sequence[Message], *, source: str = "multi-part group") -> Transaction:
    """Join the parts of one split transaction (in seq order) back into it,
    whole.  :func:`read_group` reads the same group one part at a time."""
    if not parts:
        raise CorruptMessage(source, "no parts")
    total = sum(len(part.part) for part in parts if part.part is not None)
    if total > MAX_GROUP_PAYLOAD:
        raise MessageTooLarge(source, f"the group's parts hold {total} bytes, over the {MAX_GROUP_PAYLOAD}-byte "
                                      "limit of one transaction")
    transaction = read_group(iter(parts), source=source)
    return Transaction._trusted(transaction.commit, transaction.origin, tuple(transaction.ops), transaction.applied)


def read_group(parts: Iterator[Message], *, source: str = "multi-part group", runs: bool = False) -> Transaction:
    """The transaction a group of parts carries, read part by part: its
    commit and origin are read from the first part now; its ``ops`` is an
    iterator that decodes the operations as they are taken, pulling the
    next part from ``parts`` only when the ones before are used up
    (docs/message-format.md, "Large transactions").  Memory holds one part
    and one operation (version 2: one run of at most 1,000 rows) being
    decoded, whatever the size of the transaction.
    Any problem with the group raises :class:`CorruptMessage` (or
    :class:`MessageTooLarge`) from wherever it is found, so a caller
    applying the operations as they come must be able to undo them.
    ``runs`` as for :func:`decode_message`: a version-2 group's ``ops``
    yields its runs."""
    group = _GroupReader(parts, source, runs)
    commit, origin, applied = group.entry_start()
    return Transaction._trusted(commit, origin, group.operations(commit, origin, applied),  # type: ignore[arg-type]
                                applied)


class _GroupReader:
    """The parts of one group fed to a streaming msgpack reader."""

    def __init__(self, parts: Iterator[Message], source: str, runs: bool) -> None:
        self.parts = parts
        self.source = source
        self.runs = runs
        self.first: Header | None = None
        self.last: Header | None = None
        self.count = 0
        self.fed = 0
        self.version = 0
        self.unpacker: msgpack.Unpacker | None = None  # made for the first part's format version

    def _start(self) -> msgpack.Unpacker:
        if self.unpacker is None and not self._feed():
            raise CorruptMessage(self.source, "no parts")
        assert self.unpacker is not None
        return self.unpacker

    def _feed(self) -> bool:
        """Feed the next part; False when there is none."""
        part = next(self.parts, None)
        if part is None:
            return False
        header = part.header
        if part.part is None:
            raise CorruptMessage(self.source, f"message {header} is not a part")
        first = self.first if self.first is not None else header
        if (header.seq != self.count or header.resend_count != first.resend_count or header.prev != first.prev
                or (self.last is not None and self.last.is_final_part)):
            raise CorruptMessage(self.source, f"part {header} does not follow {first} in sequence")
        if self.unpacker is None:
            self.version = part.version
            limits = {**_limits(MAX_PAYLOAD, part.version), "max_str_len": MAX_GROUP_PAYLOAD,
                      "max_bin_len": MAX_GROUP_PAYLOAD}
            self.unpacker = msgpack.Unpacker(use_list=False, raw=False, strict_map_key=True,
                                             max_buffer_size=MAX_GROUP_PAYLOAD, **limits)
        elif part.version != self.version:
            raise CorruptMessage(self.source, f"part {header} is of format version {part.version}, the group's "
                                              f"first of {self.version}")
        self.first, self.last = first, header
        self.count += 1
        self.fed += len(part.part)
        try:
            self.unpacker.feed(part.part)
        except msgpack.BufferFull:
            raise MessageTooLarge(self.source, f"an entry of the group is over the {MAX_GROUP_PAYLOAD}-byte limit "
                                               "of one transaction") from None
        return True

    def _read(self, read):  # type: ignore[no-untyped-def]
        while True:
            try:
                return read()
            except msgpack.OutOfData:
                if not self._feed():
                    raise CorruptMessage(self.source, "the group ends inside a transaction") from None
            except _UNPACK_ERRORS as error:
                raise CorruptMessage(self.source, f"payload is not valid msgpack ({type(error).__name__})") from None

    def _at_end(self) -> bool:
        """Whether every byte of every part was read."""
        while self.unpacker.tell() == self.fed:
            if not self._feed():
                return True
        return False

    def entry_start(self) -> tuple[int, str, int | None]:
        """Read the head of the next entry: its commit, origin and applied
        offset (version 4: None when the entry has none)."""
        size = self._read(self._start().read_array_header)
        if size != 3 and (size != 4 or self.version < APPLIED_VERSION):
            raise CorruptMessage(self.source, "payload holds a malformed transaction")
        commit = self._read(self.unpacker.unpack)
        origin = self._read(self.unpacker.unpack)
        if type(commit) is not int or not 0 < commit <= INT64_MAX or type(origin) is not str or not origin:
            raise CorruptMessage(self.source, "payload holds a malformed transaction")
        applied = None
        if size == 4:
            applied = self._read(self.unpacker.unpack)
            _check_applied(applied, commit, self.source)
        return commit, origin, applied

    def operations(self, commit: int, origin: str, applied: int | None = None) -> Iterator[tuple]:
        while True:
            count = self._read(self.unpacker.read_array_header)
            for _ in range(count):
                op = self._read(self.unpacker.unpack)
                if self.version >= 2:  # a schema change never travels in parts: it is no run
                    run = _run(op, commit, self.source)
                    if self.runs:
                        yield run
                    else:
                        yield from run.operations()
                    continue
                if type(op) is not tuple or len(op) != 5:
                    raise CorruptMessage(self.source, f"transaction {commit} holds a malformed operation")
                yield op
            if self._at_end():
                break
            if self.entry_start() != (commit, origin, applied):
                raise CorruptMessage(self.source, f"an entry of transaction {commit} holds another transaction")
        first, last = self.first, self.last
        assert first is not None and last is not None
        if not last.is_final_part:
            raise CorruptMessage(self.source, f"part {last} is not the final part")
        if not first.prev < commit <= last.last:
            raise CorruptMessage(self.source, f"transaction {commit} is outside ({first.prev}, {last.last}]")
