"""Message files, format versions 1 and 2 (docs/message-format.md is the specification).

Rules of this file:
* Encoding is a pure function of (content, header, names, incarnation, keys):
  no clock, no randomness, even when sealing.
* :func:`decode_message` raises only :class:`~codec.errors.MessageError`
  subclasses, each naming the file; cheap checks come first, the signature is
  verified before anything is decompressed, and decompression is capped.
* Data messages are written as version 2 (operations in runs, see
  codec.ops.Run), control messages as version 1; both are read.  A decoded
  transaction holds the operations (5-tuples) of either version, or, for
  the apply path that asks with ``runs=True``, a version-2 message's runs.
"""

from __future__ import annotations

import hashlib
import struct
from dataclasses import dataclass
from typing import Iterator, Mapping, Sequence

import msgpack
import zstandard
from cryptography.exceptions import InvalidSignature, InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from .errors import (
    BadSignature,
    CorruptMessage,
    InvalidValue,
    MessageTooLarge,
    SealError,
    UnknownSender,
    UnsupportedVersion,
    WrongRecipient,
)
from .header import Header
from .keys import PublicKeys, SiteKeys
from .names import Kind, MessageName, check_site_name
from .ops import INT64_MAX, Run, Transaction, operations_of, to_runs

MAGIC = b"FSMF"
# Format versions: data messages are written in DATA_VERSION, control
# messages (unchanged since version 1) in CONTROL_VERSION; both are read.
DATA_VERSION = 2
CONTROL_VERSION = 1
VERSIONS = (1, 2)
ZSTD_LEVEL = 3
SIGNATURE_SIZE = 64
INCARNATION_SIZE = 16
# Largest uncompressed payload a message may carry: the packer never makes
# more, the decoder refuses more (a decompression bomb is rejected, not expanded).
MAX_PAYLOAD = 16 * 1024 * 1024
# Largest file the decoder reads at all; senders may use any -l up to this.
MAX_FILE_SIZE = 16 * 1024 * 1024
# A payload may expand to at most EXPANSION_FLOOR + MAX_EXPANSION times its
# stored size (see max_raw_length): a small file cannot declare megabytes.
MAX_EXPANSION = 256
EXPANSION_FLOOR = 1024 * 1024
# Largest transaction entry a multi-part group may carry (summed over its
# parts for a group of one entry; docs/message-format.md, "Large transactions").
MAX_GROUP_PAYLOAD = 256 * 1024 * 1024
# A transaction of more operations travels as a group of parts whose
# payload is an entry per this many operations.
LARGE_TRANSACTION_OPS = 10_000
# Counters of the protocol's epochs travel in the header's 32-bit field.
COUNTER_MAX = 2**32 - 1

FLAG_SEALED = 0x01
FLAG_PART = 0x02
_KNOWN_FLAGS = FLAG_SEALED | FLAG_PART
_KIND_BYTE = {Kind.DATA: ord("D"), Kind.CONTROL: ord("C")}
_BYTE_KIND = {value: kind for kind, value in _KIND_BYTE.items()}

# magic, version, kind, flags, reserved, resend_count, prev, last, seq, incarnation
_FIXED = struct.Struct(">4sBBBBQQQI16s")
_LENGTHS = struct.Struct(">II")  # raw payload length, stored payload length
SEAL_OVERHEAD = 32 + 16  # ephemeral X25519 public key + Poly1305 tag
_NONCE = bytes(12)  # each sealing key encrypts exactly one payload

_compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                       write_checksum=False, write_dict_id=False)
_decompressor = zstandard.ZstdDecompressor()


def frame_overhead(sender: str, recipient: str, *, sealed: bool = False) -> int:
    """Bytes a message file adds around its compressed payload."""
    overhead = (_FIXED.size + 1 + len(sender.encode()) + 1 + len(recipient.encode())
                + _LENGTHS.size + SIGNATURE_SIZE)
    return overhead + (SEAL_OVERHEAD if sealed else 0)


def compress(payload: bytes) -> bytes:
    return _compressor.compress(payload)


def max_raw_length(stored_length: int) -> int:
    """The largest payload a file whose payload is ``stored_length`` bytes
    may carry (the packer keeps to it, the decoder refuses more before it
    decompresses anything)."""
    return min(MAX_PAYLOAD, EXPANSION_FLOOR + MAX_EXPANSION * stored_length)


@dataclass(frozen=True, slots=True)
class ControlState:
    """The sender's view of the pair, carried by a control message.

    Every field is monotone (receivers merge by max): ``log_received`` and
    ``rereceive_count`` describe what the sender received from the recipient
    (a confirmation, and a resend request when ``rereceive_count`` grew);
    ``log_sent`` and ``resend_count`` describe what the sender has sent, so a
    lost last message can be noticed.
    """

    log_received: int
    rereceive_count: int
    log_sent: int
    resend_count: int

    def __post_init__(self) -> None:
        # Offsets are log positions (64-bit); the counters are epochs, which
        # every message header carries in 32 bits: a larger one could never
        # be sent again, so it is refused here, before it changes any state.
        for field, top in (("log_received", INT64_MAX), ("rereceive_count", COUNTER_MAX),
                           ("log_sent", INT64_MAX), ("resend_count", COUNTER_MAX)):
            value = getattr(self, field)
            if type(value) is not int or not 0 <= value <= top:
                raise InvalidValue(f"control {field} must be an integer in 0..{top}, got {value!r}")

    def header(self) -> Header:
        return Header(resend_count=self.rereceive_count, prev=0, last=self.log_received, seq=0)


@dataclass(frozen=True, slots=True)
class Message:
    """A decoded message file.

    A data message carries ``transactions``; a part of a split transaction
    carries ``part`` (raw payload bytes to join with its siblings, see
    :func:`reassemble`); a control message carries ``control``.
    """

    kind: Kind
    header: Header
    sender: str
    recipient: str
    incarnation: bytes
    sealed: bool
    version: int
    transactions: tuple[Transaction, ...] | None = None
    part: bytes | None = None
    control: ControlState | None = None

    @property
    def is_part(self) -> bool:
        return self.part is not None


@dataclass(frozen=True, slots=True)
class EncodedMessage:
    """A finished message file: its name, header and bytes."""

    name: str
    header: Header
    data: bytes


# --- encoding ------------------------------------------------------------------

_packer_options = {"use_bin_type": True}


def serialize_transaction(transaction: Transaction, version: int = DATA_VERSION) -> bytes:
    """The payload bytes of one transaction (a msgpack array element)."""
    return serialize_entry(transaction.commit, transaction.origin, transaction.ops, version)


def serialize_entry(commit: int, origin: str, ops: Sequence, version: int = DATA_VERSION) -> bytes:
    """The payload bytes of one entry: a transaction, or a piece of a large
    one, in format ``version`` (2: its operations in runs; 1: one by one,
    whether they came as operations or runs)."""
    check_version(version)
    try:
        return msgpack.packb((commit, origin, to_runs(ops) if version == 2 else tuple(operations_of(ops))),
                             **_packer_options)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidValue(f"transaction {commit} cannot be serialized: {error}") from None


def check_version(version: int) -> int:
    if version not in VERSIONS:
        raise InvalidValue(f"message format version must be one of {VERSIONS}, got {version!r}")
    return version


def array_header(count: int) -> bytes:
    packer = msgpack.Packer()
    return packer.pack_array_header(count)


def _seal(keys: SiteKeys, recipient: PublicKeys, aad: bytes, compressed: bytes) -> bytes:
    # The ephemeral key is derived from the sender's secret and the content,
    # so sealing stays deterministic and each key encrypts one payload only.
    ephemeral_seed = HKDF(hashes.SHA256(), 32, salt=hashlib.sha256(aad + compressed).digest(),
                          info=b"fieldsync v1 ephemeral").derive(keys.secret_seed())
    ephemeral = X25519PrivateKey.from_private_bytes(ephemeral_seed)
    ephemeral_public = ephemeral.public_key().public_bytes(serialization.Encoding.Raw,
                                                           serialization.PublicFormat.Raw)
    key = _seal_key(ephemeral.exchange(recipient.seal_key()), ephemeral_public, recipient.seal)
    return ephemeral_public + ChaCha20Poly1305(key).encrypt(_NONCE, compressed, aad)


def _seal_key(shared: bytes, ephemeral_public: bytes, recipient_public: bytes) -> bytes:
    return HKDF(hashes.SHA256(), 32, salt=None,
                info=b"fieldsync v1 seal" + ephemeral_public + recipient_public).derive(shared)


def frame(kind: Kind, header: Header, *, keys: SiteKeys, recipient: str, incarnation: bytes,
          raw_length: int, compressed: bytes, part: bool = False,
          seal_to: PublicKeys | None = None, version: int | None = None) -> bytes:
    """Assemble, optionally seal, and sign a message file around a compressed
    payload in format ``version`` (None: the version written for ``kind``)."""
    if version is None:
        version = DATA_VERSION if kind is Kind.DATA else CONTROL_VERSION
    check_version(version)
    if type(incarnation) is not bytes or len(incarnation) != INCARNATION_SIZE:
        raise InvalidValue(f"incarnation id must be {INCARNATION_SIZE} bytes")
    if not 0 <= raw_length <= MAX_PAYLOAD:
        raise InvalidValue(f"payload of {raw_length} bytes is over the {MAX_PAYLOAD}-byte limit")
    check_site_name(recipient)
    if seal_to is not None and seal_to.site != recipient:
        raise InvalidValue(f"sealing key is for {seal_to.site}, not the recipient {recipient}")
    sender_bytes = keys.site.encode()
    recipient_bytes = recipient.encode()
    flags = (FLAG_SEALED if seal_to is not None else 0) | (FLAG_PART if part else 0)
    stored_length = len(compressed) + (SEAL_OVERHEAD if seal_to is not None else 0)
    prefix = b"".join((
        _FIXED.pack(MAGIC, version, _KIND_BYTE[kind], flags, 0, header.resend_count, header.prev,
                    header.last, header.seq, incarnation),
        bytes((len(sender_bytes),)), sender_bytes, bytes((len(recipient_bytes),)), recipient_bytes,
        _LENGTHS.pack(raw_length, stored_length),
    ))
    stored = _seal(keys, seal_to, prefix, compressed) if seal_to is not None else compressed
    body = prefix + stored
    return body + keys.signer.sign(body)


def encode_data_message(transactions: Sequence[Transaction], header: Header, *, keys: SiteKeys,
                        recipient: str, incarnation: bytes,
                        seal_to: PublicKeys | None = None, version: int = DATA_VERSION) -> EncodedMessage:
    """Encode one whole data message (no size limit is applied; see codec.packing)."""
    if header.is_part:
        raise InvalidValue(f"header {header} is a part header; whole messages need prev < last")
    previous = header.prev
    for transaction in transactions:
        if not previous < transaction.commit <= header.last:
            raise InvalidValue(f"transaction {transaction.commit} is outside {header} or out of order")
        previous = transaction.commit
    payload = array_header(len(transactions)) + b"".join(
        serialize_transaction(transaction, version) for transaction in transactions)
    data = frame(Kind.DATA, header, keys=keys, recipient=recipient, incarnation=incarnation,
                 raw_length=len(payload), compressed=compress(payload), seal_to=seal_to, version=version)
    return EncodedMessage(str(MessageName(keys.site, recipient, Kind.DATA, header)), header, data)


def encode_control_message(state: ControlState, *, keys: SiteKeys, recipient: str,
                           incarnation: bytes, seal_to: PublicKeys | None = None) -> EncodedMessage:
    payload = msgpack.packb((state.log_received, state.rereceive_count, state.log_sent,
                             state.resend_count))
    header = state.header()
    data = frame(Kind.CONTROL, header, keys=keys, recipient=recipient, incarnation=incarnation,
                 raw_length=len(payload), compressed=compress(payload), seal_to=seal_to)
    digest = hashlib.sha256(data).hexdigest()[:16]
    return EncodedMessage(str(MessageName(keys.site, recipient, Kind.CONTROL, header, digest)),
                          header, data)


# --- decoding ------------------------------------------------------------------

_MIN_SIZE = _FIXED.size + 1 + 1 + 1 + 1 + _LENGTHS.size + SIGNATURE_SIZE


def decode_message(data: bytes, *, source: str, keyring: Mapping[str, PublicKeys],
                   recipient: str, recipient_keys: SiteKeys | None = None,
                   max_file_size: int = MAX_FILE_SIZE, verified: bool = False, runs: bool = False) -> Message:
    """Check and decode one message file.

    ``source`` names the file in errors; ``recipient`` is the site reading it.
    ``recipient_keys`` opens sealed messages.  ``verified``: the signature
    of these very bytes was checked already (by :func:`check_message`, when
    the file was received, before it was queued durably), so it is not
    checked again; every other check is made.  ``runs``: a version-2
    message's transactions hold its runs (codec.ops.Run) instead of the
    operations they stand for.  Raises only MessageError subclasses.
    """
    frame_info = _open_frame(data, source, keyring, recipient, max_file_size, verify=not verified)
    kind, header, sender, to, incarnation, flags, raw_length, position, body_end, version = frame_info
    stored = data[position:body_end]
    sealed = bool(flags & FLAG_SEALED)
    if sealed:
        stored = _unseal(stored, data[:position], recipient_keys, source)
    payload = _decompress(stored, raw_length, source)
    base = dict(kind=kind, header=header, sender=sender, recipient=to, incarnation=incarnation,
                sealed=sealed, version=version)
    is_part = bool(flags & FLAG_PART)
    if kind is Kind.CONTROL:
        return Message(**base, control=_control_state(payload, source))
    if is_part:
        return Message(**base, part=payload)
    return Message(**base, transactions=_transactions(payload, header, source, version, runs))


def check_message(data: bytes, *, source: str, keyring: Mapping[str, PublicKeys], recipient: str,
                  max_file_size: int = MAX_FILE_SIZE, verified: bool = False) -> Message:
    """Check a file's frame and signature without opening its payload.

    The returned Message carries the header fields only (no transactions,
    part or control); :func:`decode_message` later opens the payload.  This
    is what a receiver does before queueing a file durably: cheap, and a
    file that passes was made by the sender for this site.  ``verified`` as
    for :func:`decode_message` (the agent reads its queued files' headers
    again at a restart).
    """
    kind, header, sender, to, incarnation, flags, _, _, _, version = _open_frame(
        data, source, keyring, recipient, max_file_size, verify=not verified)
    return Message(kind=kind, header=header, sender=sender, recipient=to, incarnation=incarnation,
                   sealed=bool(flags & FLAG_SEALED), version=version)


def _open_frame(data: bytes, source: str, keyring: Mapping[str, PublicKeys], recipient: str,
                max_file_size: int, *, verify: bool = True) -> tuple:
    size = len(data)
    if size > max_file_size:
        raise MessageTooLarge(source, f"file is {size} bytes, over the {max_file_size}-byte limit")
    if size < _MIN_SIZE:
        if data[:4] != MAGIC[:min(4, size)]:
            raise CorruptMessage(source, "not a fieldsync message (bad magic)")
        raise CorruptMessage(source, f"truncated: {size} bytes is shorter than any message")
    (magic, version, kind_byte, flags, reserved, resend_count, prev, last, seq,
     incarnation) = _FIXED.unpack_from(data, 0)
    if magic != MAGIC:
        raise CorruptMessage(source, "not a fieldsync message (bad magic)")
    if version not in VERSIONS:
        raise UnsupportedVersion(source, f"format version {version} (this agent reads versions "
                                         f"{', '.join(map(str, VERSIONS))})")
    kind = _BYTE_KIND.get(kind_byte)
    if kind is None or reserved != 0 or flags & ~_KNOWN_FLAGS:
        raise CorruptMessage(source, "bad kind, flags or reserved byte")
    position = _FIXED.size
    sender, position = _read_name(data, position, source, "sender")
    to, position = _read_name(data, position, source, "recipient")
    if position + _LENGTHS.size > size:
        raise CorruptMessage(source, "truncated inside the fixed fields")
    raw_length, stored_length = _LENGTHS.unpack_from(data, position)
    position += _LENGTHS.size
    if position + stored_length + SIGNATURE_SIZE != size:
        raise CorruptMessage(source, f"length fields say {position + stored_length + SIGNATURE_SIZE} "
                                     f"bytes, file has {size} (truncated or extended)")
    sender_key = keyring.get(sender)
    if sender_key is None:
        raise UnknownSender(source, f"sender {sender!r} is not in the keyring")
    if to != recipient:
        raise WrongRecipient(source, f"addressed to {to!r}, this site is {recipient!r}")
    body_end = position + stored_length
    try:
        if verify:
            sender_key.verifier().verify(data[body_end:], data[:body_end])
    except InvalidSignature:
        raise BadSignature(source, f"signature does not verify with the key of {sender} "
                                   f"({sender_key.fingerprint})", claimed_incarnation=incarnation) from None
    # Everything below is signed by the sender; checks guard against a faulty peer.
    try:
        header = Header(resend_count, prev, last, seq)
    except InvalidValue as error:
        raise CorruptMessage(source, f"bad header: {error}") from None
    if raw_length > MAX_PAYLOAD:
        raise MessageTooLarge(source, f"payload expands to {raw_length} bytes, over the "
                                      f"{MAX_PAYLOAD}-byte limit (decompression bomb?)")
    if raw_length > max_raw_length(stored_length):
        raise MessageTooLarge(source, f"payload of {stored_length} bytes declares {raw_length} bytes, more than "
                                      f"{EXPANSION_FLOOR} + {MAX_EXPANSION} times its size (decompression bomb?)")
    is_part = bool(flags & FLAG_PART)
    if kind is Kind.CONTROL and is_part:
        raise CorruptMessage(source, "a control message cannot be a part")
    if kind is Kind.DATA and is_part != header.is_part:
        raise CorruptMessage(source, f"part flag disagrees with header {header}")
    return kind, header, sender, to, incarnation, flags, raw_length, position, body_end, version


def _read_name(data: bytes, position: int, source: str, what: str) -> tuple[str, int]:
    if position >= len(data):
        raise CorruptMessage(source, f"truncated before the {what} name")
    length = data[position]
    end = position + 1 + length
    if end > len(data):
        raise CorruptMessage(source, f"truncated inside the {what} name")
    try:
        name = check_site_name(data[position + 1:end].decode("ascii"))
    except (UnicodeDecodeError, InvalidValue):
        raise CorruptMessage(source, f"{what} name is not a valid site name") from None
    return name, end


def _unseal(stored: bytes, aad: bytes, keys: SiteKeys | None, source: str) -> bytes:
    if keys is None:
        raise SealError(source, "message is sealed and no sealing key was given to open it")
    if len(stored) < SEAL_OVERHEAD:
        raise CorruptMessage(source, "sealed payload is too short")
    ephemeral_public = stored[:32]
    try:
        shared = keys.sealer.exchange(X25519PublicKey.from_public_bytes(ephemeral_public))
        key = _seal_key(shared, ephemeral_public, keys.public.seal)
        return ChaCha20Poly1305(key).decrypt(_NONCE, stored[32:], aad)
    except (InvalidTag, ValueError):
        raise SealError(source, f"sealed payload does not open with the key of {keys.site}") from None


def _decompress(stored: bytes, raw_length: int, source: str) -> bytes:
    try:
        declared = zstandard.frame_content_size(stored)
    except zstandard.ZstdError:
        raise CorruptMessage(source, "payload is not a zstd frame") from None
    if declared != raw_length:
        raise CorruptMessage(source, f"zstd frame declares {declared} bytes, header says {raw_length}")
    try:
        stream = _decompressor.decompressobj()
        payload = stream.decompress(stored)
    except zstandard.ZstdError as error:
        raise CorruptMessage(source, f"payload does not decompress ({error})") from None
    if not stream.eof or stream.unused_data:
        raise CorruptMessage(source, "payload has bytes after its zstd frame, or its frame is cut short")
    if len(payload) != raw_length:
        raise CorruptMessage(source, f"payload decompressed to {len(payload)} bytes, expected {raw_length}")
    return payload


# What msgpack raises on bad input: its own errors, and builtins for bad
# UTF-8, unhashable or non-string map keys, and over-deep nesting.
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


def _control_state(payload: bytes, source: str) -> ControlState:
    fields = _unpack(payload, source)
    if type(fields) is not tuple or len(fields) != 4:
        raise CorruptMessage(source, "control payload must hold four counters")
    try:
        return ControlState(*fields)
    except InvalidValue as error:
        raise CorruptMessage(source, f"bad control payload: {error}") from None


def _transactions(payload: bytes, header: Header, source: str, version: int,
                  runs: bool) -> tuple[Transaction, ...]:
    entries = _unpack(payload, source, version)
    if type(entries) is not tuple:
        raise CorruptMessage(source, "payload must be an array of transactions")
    previous = header.prev
    result = []
    for entry in entries:
        transaction = _transaction(entry, source, version, runs)
        if not previous < transaction.commit <= header.last:
            raise CorruptMessage(source, f"transaction {transaction.commit} is outside {header} or out of order")
        previous = transaction.commit
        result.append(transaction)
    return tuple(result)


def _transaction(entry: object, source: str, version: int = 1, runs: bool = False) -> Transaction:
    # Operations stay the plain 5-tuples (version 1) or rows (version 2)
    # msgpack made (see codec.ops): their values are checked where they are
    # applied, which touches each value anyway; checking them here would
    # cost more than decoding.
    try:
        commit, origin, ops = entry  # type: ignore[misc]
    except (TypeError, ValueError):
        raise CorruptMessage(source, "payload holds a malformed transaction") from None
    if (type(commit) is not int or not 0 < commit <= INT64_MAX or type(origin) is not str
            or not origin or type(ops) is not tuple):
        raise CorruptMessage(source, "payload holds a malformed transaction")
    if version == 2:
        checked = tuple(_run(run, commit, source) for run in ops)
        if not runs:
            return Transaction._trusted(commit, origin, tuple(op for run in checked for op in run.operations()))
        return Transaction._trusted(commit, origin, checked)
    if ops and (set(map(type, ops)) != {tuple} or set(map(len, ops)) != {5}):
        raise CorruptMessage(source, f"transaction {commit} holds a malformed operation")
    return Transaction._trusted(commit, origin, ops)


_NAMES = frozenset({str})


def _run(run: object, commit: int, source: str) -> Run:
    """A decoded version-2 run, checked for structure (its values are
    checked where they are applied)."""
    if type(run) is not tuple or len(run) != 6:
        raise CorruptMessage(source, f"transaction {commit} holds a malformed run")
    table, kind, width, before, after, rows = run
    if (type(table) is not str or not table or type(kind) is not int or not 1 <= kind <= 3
            or type(width) is not int or width < 1 or type(before) is not tuple or type(after) is not tuple
            or (kind == 1 and before) or (kind == 3 and after) or type(rows) is not tuple or not rows):
        raise CorruptMessage(source, f"transaction {commit} holds a malformed run")
    names = before + after
    if (not _NAMES.issuperset(map(type, names)) or "" in names or len(set(before)) != len(before)
            or len(set(after)) != len(after)):
        raise CorruptMessage(source, f"transaction {commit} holds a run with bad column names")
    if set(map(type, rows)) != {tuple} or set(map(len, rows)) != {width + len(names)}:
        raise CorruptMessage(source, f"transaction {commit} holds a run with a malformed row")
    return Run(table, kind, width, before, after, rows)


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
    return Transaction._trusted(transaction.commit, transaction.origin, tuple(transaction.ops))


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
    commit, origin = group.entry_start()
    return Transaction._trusted(commit, origin, group.operations(commit, origin))  # type: ignore[arg-type]


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

    def entry_start(self) -> tuple[int, str]:
        """Read the head of the next entry: its commit and origin."""
        if self._read(self._start().read_array_header) != 3:
            raise CorruptMessage(self.source, "payload holds a malformed transaction")
        commit = self._read(self.unpacker.unpack)
        origin = self._read(self.unpacker.unpack)
        if type(commit) is not int or not 0 < commit <= INT64_MAX or type(origin) is not str or not origin:
            raise CorruptMessage(self.source, "payload holds a malformed transaction")
        return commit, origin

    def operations(self, commit: int, origin: str) -> Iterator[tuple]:
        while True:
            count = self._read(self.unpacker.read_array_header)
            for _ in range(count):
                op = self._read(self.unpacker.unpack)
                if self.version == 2:
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
            if self.entry_start() != (commit, origin):
                raise CorruptMessage(self.source, f"an entry of transaction {commit} holds another transaction")
        first, last = self.first, self.last
        assert first is not None and last is not None
        if not last.is_final_part:
            raise CorruptMessage(self.source, f"part {last} is not the final part")
        if not first.prev < commit <= last.last:
            raise CorruptMessage(self.source, f"transaction {commit} is outside ({first.prev}, {last.last}]")
