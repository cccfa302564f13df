"""Message files, format versions 1 to 4 (docs/message-format.md is the specification).

Rules of this file:
* Encoding is a pure function of (content, header, names, incarnation, keys):
  no clock, no randomness, even when sealing.
* :func:`decode_message` raises only :class:`~codec.errors.MessageError`
  subclasses, each naming the file; cheap checks come first, the signature is
  verified before anything is decompressed, and decompression is capped.
* Data messages are written as version 2 (operations in runs, see
  codec.ops.Run), control messages as version 1, and a message that
  carries a schema change (codec.changes), or a control message that
  carries the sender's schema version, as version 3, the one version that
  can; a message that holds a transaction with ``applied`` (rows written
  back to their origin) as version 4, the one version that carries it;
  all four are read.  A decoded transaction holds the
  operations (5-tuples) of any version, or, for the apply path that asks
  with ``runs=True``, a version-2 to 4 message's runs; a schema change
  alone.
"""

from __future__ import annotations

import hashlib
import struct
import threading
from dataclasses import dataclass
from typing import Mapping, Sequence

import msgpack
import msgspec
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
from .changes import SchemaChange
from .ops import Run, Transaction, change_of, operations_of, runs_counted, to_runs
from .payloads import (APPLIED_VERSION, MAX_PAYLOAD, SCHEMA_VERSION_CONTROL, ControlState, control_payload,
                       control_state, transactions_of)

MAGIC = b"FSMF"
# Format versions: data messages are written in DATA_VERSION, control
# messages (unchanged since version 1) in CONTROL_VERSION, a message that
# carries a schema change in CHANGE_VERSION (version 2 with schema changes
# added), a control message with a schema version in SCHEMA_VERSION_CONTROL
# (the same version 3), a message holding a transaction with ``applied``
# in APPLIED_VERSION (version 3 with it added); all are read.
DATA_VERSION = 2
CONTROL_VERSION = 1
CHANGE_VERSION = 3
VERSIONS = (1, 2, 3, APPLIED_VERSION)
ZSTD_LEVEL = 3
SIGNATURE_SIZE = 64
INCARNATION_SIZE = 16
# Largest file the decoder reads at all; senders may use any -l up to this.
MAX_FILE_SIZE = 16 * 1024 * 1024
# A payload may expand to at most EXPANSION_FLOOR + MAX_EXPANSION times its
# stored size (see max_raw_length): a small file cannot declare megabytes.
MAX_EXPANSION = 256
EXPANSION_FLOOR = 1024 * 1024
# A transaction of more operations travels as a group of parts whose
# payload is an entry per this many operations.
LARGE_TRANSACTION_OPS = 10_000

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

# python-zstandard's compressor and decompressor objects, and the msgpack
# encoder, are not safe for simultaneous use: each thread (the agent's worker
# threads, two agents in one process) has its own, made at its first use.
_zstd = threading.local()
_msgpack = threading.local()


def zstd_pair() -> tuple[zstandard.ZstdCompressor, zstandard.ZstdDecompressor]:
    """This thread's zstd compressor and decompressor."""
    pair = getattr(_zstd, "pair", None)
    if pair is None:
        pair = _zstd.pair = (zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True,
                                                      write_checksum=False, write_dict_id=False),
                             zstandard.ZstdDecompressor())
    return pair


def frame_overhead(sender: str, recipient: str, *, sealed: bool = False) -> int:
    """Bytes a message file adds around its compressed payload."""
    overhead = (_FIXED.size + 1 + len(sender.encode()) + 1 + len(recipient.encode())
                + _LENGTHS.size + SIGNATURE_SIZE)
    return overhead + (SEAL_OVERHEAD if sealed else 0)


def compress(payload: bytes) -> bytes:
    return zstd_pair()[0].compress(payload)


def max_raw_length(stored_length: int) -> int:
    """The largest payload a file whose payload is ``stored_length`` bytes
    may carry (the packer keeps to it, the decoder refuses more before it
    decompresses anything)."""
    return min(MAX_PAYLOAD, EXPANSION_FLOOR + MAX_EXPANSION * stored_length)


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


def _encoder() -> msgspec.msgpack.Encoder:
    """This thread's msgpack encoder for entries.  msgspec writes the same
    bytes as msgpack's packer (``use_bin_type``: the smallest form of
    each int, float64, str and bin) at about twice its speed; the golden
    files and tests/codec/test_encoding.py hold it to that."""
    encoder = getattr(_msgpack, "encoder", None)
    if encoder is None:
        encoder = _msgpack.encoder = msgspec.msgpack.Encoder(enc_hook=_base_value)
    return encoder


def _base_value(value: object) -> object:
    """A subclass of str, int, float or bytes as the base value msgpack's
    packer writes for it (msgspec leaves subclasses to this hook)."""
    for base in (str, int, float, bytes):
        if isinstance(value, base):
            return base(value)  # type: ignore[call-overload]
    raise TypeError(f"cannot serialize {type(value).__name__!r} object")


def serialize_transaction(transaction: Transaction, version: int = DATA_VERSION,
                          runs: list[Run] | None = None) -> bytes:
    """The payload bytes of one transaction (a msgpack array element), with
    its ``applied`` when ``version`` is :data:`APPLIED_VERSION`; ``runs``:
    to_runs of its operations, when the caller made them."""
    applied = transaction.applied if version >= APPLIED_VERSION else None
    return serialize_entry(transaction.commit, transaction.origin, transaction.ops, version, applied, runs)


def transaction_runs(transaction: Transaction) -> tuple[list[Run], int]:
    """to_runs of a transaction's operations and how many they are
    (codec.ops.runs_counted), for :func:`serialize_transaction`; an
    operation no run can carry is refused as serializing it would be."""
    try:
        return runs_counted(transaction.ops)
    except (TypeError, ValueError, OverflowError) as error:
        raise InvalidValue(f"transaction {transaction.commit} cannot be serialized: {error}") from None


def entry_version(version: int, applied: int | None) -> int:
    """The format version of an entry of a stream written in ``version``:
    :data:`APPLIED_VERSION` for a transaction with ``applied`` (but in
    version 1, which writes it without: docs/message-format.md)."""
    return APPLIED_VERSION if applied is not None and version >= 2 else version


def serialize_entry(commit: int, origin: str, ops: Sequence, version: int = DATA_VERSION,
                    applied: int | None = None, runs: list[Run] | None = None) -> bytes:
    """The payload bytes of one entry: a transaction, or a piece of a large
    one, in format ``version`` (2 to 4: its operations in runs, ``runs``
    when the caller made them with codec.ops.to_runs; 1: one by one,
    whether they came as operations or runs).  A schema change (``ops`` is
    ``(change,)``) is written in version 3 only; ``applied`` (not None) in
    version 4 only, before the runs."""
    check_version(version)
    if len(ops) == 1 and type(ops[0]) is SchemaChange:
        if version < CHANGE_VERSION:
            raise InvalidValue(f"transaction {commit} carries a schema change, which only format version "
                               f"{CHANGE_VERSION} can carry")
        if applied is not None:
            raise InvalidValue(f"transaction {commit} carries a schema change, which carries no applied offset")
        items: tuple | list | None = (ops[0].wire(),)
    else:
        items = None
    if applied is not None and version < APPLIED_VERSION:
        raise InvalidValue(f"transaction {commit} carries an applied offset, which only format version "
                           f"{APPLIED_VERSION} can carry")
    try:
        if items is None:
            if version < 2:
                items = tuple(operations_of(ops))
            else:
                items = to_runs(ops) if runs is None else runs
        if applied is not None:
            return _encoder().encode((commit, origin, applied, items))
        return _encoder().encode((commit, origin, items))
    except (TypeError, ValueError, OverflowError, RecursionError, msgspec.EncodeError) as error:
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
    if any(change_of(transaction) is not None for transaction in transactions) and len(transactions) > 1:
        raise InvalidValue("a schema change travels alone in its message")
    previous = header.prev
    for transaction in transactions:
        if not previous < transaction.commit <= header.last:
            raise InvalidValue(f"transaction {transaction.commit} is outside {header} or out of order")
        previous = transaction.commit
    # A message holding a transaction with ``applied`` is version 4 (codec.packing does the same).
    version = max((entry_version(version, transaction.applied) for transaction in transactions), default=version)
    payload = array_header(len(transactions)) + b"".join(
        serialize_transaction(transaction, version) for transaction in transactions)
    data = frame(Kind.DATA, header, keys=keys, recipient=recipient, incarnation=incarnation,
                 raw_length=len(payload), compressed=compress(payload), seal_to=seal_to, version=version)
    return EncodedMessage(str(MessageName(keys.site, recipient, Kind.DATA, header)), header, data)


def encode_control_message(state: ControlState, *, keys: SiteKeys, recipient: str,
                           incarnation: bytes, seal_to: PublicKeys | None = None) -> EncodedMessage:
    """Encode a control message: version 1, four counters, unless the
    state carries a schema version (then version 3, with it after them)."""
    payload = msgpack.packb(control_payload(state))
    header = state.header()
    version = CONTROL_VERSION if state.schema_version is None else SCHEMA_VERSION_CONTROL
    data = frame(Kind.CONTROL, header, keys=keys, recipient=recipient, incarnation=incarnation,
                 raw_length=len(payload), compressed=compress(payload), seal_to=seal_to, version=version)
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
        return Message(**base, control=control_state(payload, source, header, version))
    if is_part:
        return Message(**base, part=payload)
    return Message(**base, transactions=transactions_of(payload, header, source, version, runs))


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
    # One call for the good file: one frame, whole, with nothing after it
    # (the declared length is checked above, so the one buffer it fills is
    # bounded); a file it refuses is read again as a stream to say why.
    try:
        payload = zstd_pair()[1].decompress(stored, allow_extra_data=False)
    except zstandard.ZstdError:
        _decompress_stream(stored, source)
        raise CorruptMessage(source, "payload does not decompress as one zstd frame") from None
    if len(payload) != raw_length:
        raise CorruptMessage(source, f"payload decompressed to {len(payload)} bytes, expected {raw_length}")
    return payload


def _decompress_stream(stored: bytes, source: str) -> None:
    """Decompress ``stored`` as a stream: raise the CorruptMessage that
    says what is wrong with its frame."""
    try:
        stream = zstd_pair()[1].decompressobj()
        stream.decompress(stored)
    except zstandard.ZstdError as error:
        raise CorruptMessage(source, f"payload does not decompress ({error})") from None
    if not stream.eof or stream.unused_data:
        raise CorruptMessage(source, "payload has bytes after its zstd frame, or its frame is cut short")


# What msgpack raises on bad input: its own errors, and builtins for bad
# UTF-8, unhashable or non-string map keys, and over-deep nesting.
