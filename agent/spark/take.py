"""Taking over the output of a finished Spark job (docs/spark.md, "The
pipeline", step 3).

Rules of this file:
* Nothing of an output is trusted until checked: only an output with
  ``_SUCCESS.json`` is read; each manifest must describe exactly the send
  it answers; the files must chain over ``(start, end]``; each file must
  exist with the listed size and SHA-256, be named after its header and pass
  the codec's frame check (signed by this site, to the subscriber, this
  incarnation, sealed when the send is).
* Every problem is one :class:`SparkBatchError` line naming the subscriber
  and the file.
* Memory stays bounded: each file is read once to be checked and dropped;
  :meth:`TakenFile.read` reads it again when it is queued (and checks its
  digest again, so what is queued is what was checked).
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

from codec.errors import CodecError, MessageError
from codec.header import Header
from codec.keys import PublicKeys
from codec.message import check_message
from codec.names import Kind, MessageName

from .errors import SparkBatchError
from ..outbound import BatchSend

FORMAT = 1
_FILE_FIELDS = ("name", "resend_count", "prev", "last", "seq", "size", "sha256")


@dataclass(frozen=True, slots=True)
class TakenFile:
    """One checked message file of a job's output, in queue order."""

    path: Path
    name: str
    header: Header
    size: int
    sha256: str

    def read(self) -> bytes:
        """The file's bytes, which must still be the ones that were checked."""
        try:
            data = self.path.read_bytes()
        except OSError as error:
            raise SparkBatchError(f"{self.path}: cannot be read ({error.strerror or error})") from None
        if len(data) != self.size or hashlib.sha256(data).hexdigest() != self.sha256:
            raise SparkBatchError(f"{self.path}: changed after it was checked")
        return data


@dataclass(frozen=True, slots=True)
class Sender:
    """Who every file must come from: this site, its signing key, its
    incarnation."""

    name: str
    public: PublicKeys
    incarnation: bytes


def take_output(output: str | os.PathLike[str], sends: Iterable[BatchSend], sender: Sender
                ) -> dict[str, list[TakenFile]]:
    """Check a finished job's output for ``sends``; return, per subscriber,
    its message files in the order they are to be queued."""
    folder = Path(output)
    sends = list(sends)
    success = _read_json(folder / "_SUCCESS.json", "the job output",
                         missing=f"{folder} has no _SUCCESS.json: the job did not finish")
    if success.get("format") != FORMAT:
        raise SparkBatchError(f"{folder}/_SUCCESS.json: output format {success.get('format')!r} is not {FORMAT}")
    taken = {send.subscriber: _take_send(folder, send, sender) for send in sends}
    files = sum(len(found) for found in taken.values())
    if success.get("subscribers") != len(sends) or success.get("files") != files:
        raise SparkBatchError(f"{folder}/_SUCCESS.json: it counts {success.get('subscribers')} subscribers and "
                              f"{success.get('files')} files, the manifests {len(sends)} and {files}")
    return taken


def _take_send(folder: Path, send: BatchSend, sender: Sender) -> list[TakenFile]:
    subscriber = send.subscriber
    where = f"subscriber {subscriber}"
    manifest = _read_json(folder / "manifests" / f"{subscriber}.json", where,
                          missing=f"{where}: the job wrote no manifest")
    expected = {"format": FORMAT, "subscriber": subscriber, "start": send.start, "end": send.end,
                "resend_count": send.resend_count}
    for key, value in expected.items():
        if manifest.get(key) != value:
            raise SparkBatchError(f"{where}, manifest: {key} is {manifest.get(key)!r}, the send's is {value!r}")
    entries = manifest.get("files")
    if not isinstance(entries, list):
        raise SparkBatchError(f"{where}, manifest: no list of files")
    selected = manifest.get("transactions")
    if type(selected) is not int or selected < 0:
        raise SparkBatchError(f"{where}, manifest: no count of the transactions selected")
    if (selected == 0) != (not entries):
        # No file exactly when nothing was selected (docs/protocol.md, rule 5).
        raise SparkBatchError(f"{where}, manifest: {selected} transactions selected, {len(entries)} files")
    chain = _Chain(send)
    taken = []
    for index, entry in enumerate(entries):
        if not isinstance(entry, dict) or any(key not in entry for key in _FILE_FIELDS):
            raise SparkBatchError(f"{where}, manifest file entry {index}: it needs {', '.join(_FILE_FIELDS)}")
        name = entry["name"]
        try:
            header = Header(entry["resend_count"], entry["prev"], entry["last"], entry["seq"])
        except CodecError as error:
            raise SparkBatchError(f"{where}, file {name}: {error}") from None
        problem = chain.follow(header)
        if problem is not None:
            raise SparkBatchError(f"{where}, file {name}: {problem}")
        if name != str(MessageName(sender.name, subscriber, Kind.DATA, header)):
            raise SparkBatchError(f"{where}, file {name}: the name is not the name of its header {header}")
        taken.append(_check_file(folder / "files" / subscriber / name, entry, header, send, sender))
    problem = chain.finish()
    if problem is not None:
        raise SparkBatchError(f"{where}: {problem}")
    return taken


class _Chain:
    """The headers of one send must cover ``(start, end]`` without a gap or
    an overlap, or be none at all (the range held nothing for the
    subscriber): each message's ``prev`` is the ``last`` of the one before,
    and the parts of one split transaction share their ``prev`` and count
    ``seq`` from 0 (codec/packing.py)."""

    def __init__(self, send: BatchSend) -> None:
        self.send = send
        self.prev = send.start
        self.next_seq: int | None = None  # inside a split transaction: the seq of the next part

    def follow(self, header: Header) -> str | None:
        if header.resend_count != self.send.resend_count:
            return f"epoch {header.resend_count} is not the send's {self.send.resend_count}"
        if header.prev != self.prev:
            return f"header {header} does not follow offset {self.prev}"
        if header.last > self.send.end:
            return f"header {header} goes past the send's end {self.send.end}"
        if not header.is_part:
            if self.next_seq is not None:
                return f"header {header} comes before the final part of the transaction after {self.prev}"
            self.prev = header.last
            return None
        expected = 0 if self.next_seq is None else self.next_seq
        if header.seq != expected:
            return f"part {header} is out of sequence (expected seq {expected})"
        if header.is_final_part:
            self.prev, self.next_seq = header.last, None
        else:
            self.next_seq = header.seq + 1
        return None

    def finish(self) -> str | None:
        if self.prev == self.send.start and self.next_seq is None:
            return None  # no file: the range held nothing for the subscriber (docs/protocol.md, rule 5)
        if self.next_seq is not None:
            return f"the transaction after {self.prev} ends without its final part"
        if self.prev != self.send.end:
            return f"the files cover ({self.send.start}, {self.prev}], the send is ({self.send.start}, {self.send.end}]"
        return None


def _check_file(path: Path, entry: dict[str, Any], header: Header, send: BatchSend, sender: Sender) -> TakenFile:
    where = f"subscriber {send.subscriber}, file {path.name}"
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SparkBatchError(f"{where}: listed in the manifest but missing") from None
    except OSError as error:
        raise SparkBatchError(f"{where}: cannot be read ({error.strerror or error})") from None
    digest = hashlib.sha256(data).hexdigest()
    if len(data) != entry["size"] or digest != entry["sha256"]:
        raise SparkBatchError(f"{where}: {len(data)} bytes with SHA-256 {digest[:16]}..., the manifest lists "
                              f"{entry['size']} bytes with {str(entry['sha256'])[:16]}...")
    try:
        message = check_message(data, source=path.name, keyring={sender.name: sender.public},
                                recipient=send.subscriber)
    except MessageError as error:
        raise SparkBatchError(f"{where}: {error.problem}") from None
    sealed = send.seal_to is not None
    if message.kind is not Kind.DATA or message.header != header:
        raise SparkBatchError(f"{where}: the file holds {message.kind.name.lower()} message {message.header}")
    if message.incarnation != sender.incarnation:
        raise SparkBatchError(f"{where}: made for incarnation {message.incarnation.hex()[:8]}, this site's is "
                              f"{sender.incarnation.hex()[:8]}")
    if message.sealed != sealed:
        raise SparkBatchError(f"{where}: the file is {'' if message.sealed else 'not '}sealed, the send "
                              f"{'is' if sealed else 'is not'}")
    return TakenFile(path, path.name, header, len(data), digest)


def _read_json(path: Path, where: str, *, missing: str) -> dict[str, Any]:
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise SparkBatchError(missing) from None
    except (OSError, ValueError) as error:
        raise SparkBatchError(f"{where}, {path.name}: cannot be read ({error})") from None
    if not isinstance(value, dict):
        raise SparkBatchError(f"{where}, {path.name}: not a JSON object")
    return value
