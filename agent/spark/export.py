"""Writing the log range of a batch to Parquet for the Spark job.

Rules of this file:
* The layout is docs/spark.md, "Export format"; this file and
  ``contrib/spark/job.py`` are its only writer and reader.
* Streaming: capture rows go from the log reader to a Parquet writer one
  chunk at a time; memory holds one chunk and one row group, whatever the
  range.
* Nothing here selects: every capture row of the range is written, and the
  job selects with the same reader the agent uses.
* Values keep their SQLite type: they are msgpack-encoded, as in messages.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

import msgpack

from codec.keys import PublicKeys, SiteKeys

from ..site import SiteDatabase
from ..site.selection import plan_from_rows, value_columns_read
from .errors import SparkBatchError

FORMAT = 1
ROWS_PER_FILE = 250_000
ROWS_PER_GROUP = 50_000


@dataclass(frozen=True, slots=True)
class BatchSend:
    """One due send: the subscriber's log in ``(start, end]`` at epoch
    ``resend_count``, sealed to ``seal_to`` when given, read from
    ``read_from`` (None: ``start``; ``(start, read_from]`` held nothing for
    the subscriber, docs/protocol.md rule 5)."""

    subscriber: str
    start: int
    end: int
    resend_count: int
    seal_to: PublicKeys | None = None
    read_from: int | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.start < self.end:
            raise SparkBatchError(f"send to {self.subscriber}: range ({self.start}, {self.end}] is empty")
        if self.read_from is not None and not self.start <= self.read_from < self.end:
            raise SparkBatchError(f"send to {self.subscriber}: read from {self.read_from} is outside "
                                  f"[{self.start}, {self.end})")

    @property
    def read_start(self) -> int:
        return self.start if self.read_from is None else self.read_from

    @property
    def backlog(self) -> int:
        return self.end - self.read_start

    def to_json(self) -> dict:
        return {"subscriber": self.subscriber, "start": self.start, "end": self.end, "read": self.read_start,
                "resend_count": self.resend_count,
                "seal_to": None if self.seal_to is None else self.seal_to.to_line()}


@dataclass(frozen=True, slots=True)
class ExportSummary:
    directory: Path
    rows: int
    files: int
    range: tuple[int, int]


def _schema():  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.schema([("commit", pa.int64()), ("origin", pa.string()), ("seq", pa.int64()),
                      ("shape", pa.int64()), ("kind", pa.int8()), ("flags", pa.int64()),
                      ("returned", pa.string()), ("values", pa.binary())])


def export_batch(db: SiteDatabase, keys: SiteKeys, sends: Iterable[BatchSend], directory: str | os.PathLike[str],
                 *, max_size: int, rows_per_file: int = ROWS_PER_FILE,
                 rows_per_group: int = ROWS_PER_GROUP,
                 check_stop: Callable[[], None] | None = None) -> ExportSummary:
    """Write what the job needs for ``sends`` into ``directory`` (new or empty).

    ``check_stop`` is called after each row group written, and may raise
    to stop a long export (the agent is stopping); the caller deletes the
    folder."""
    sends = list(sends)
    if not sends:
        raise SparkBatchError("a batch needs at least one send")
    if len({send.subscriber for send in sends}) != len(sends):
        raise SparkBatchError("a batch holds at most one send per subscriber")
    target = Path(directory)
    target.mkdir(parents=True, exist_ok=True)
    if any(target.iterdir()):
        raise SparkBatchError(f"export folder {target} is not empty")
    for send in sends:
        db.check_log_range(send.read_start, send.end)
    identity = db.identity
    shapes, articles, subscriptions = db.selection_rows(send.subscriber for send in sends)
    width = max((value_columns_read(shapes, plan_from_rows(send.subscriber, identity.role, articles,
                                                           [row[1:] for row in subscriptions
                                                            if row[0] == send.subscriber]))
                 for send in sends), default=0)
    low, high = min(send.read_start for send in sends), max(send.end for send in sends)
    job = {
        "format": FORMAT, "site": identity.name, "role": identity.role.value,
        "incarnation": identity.incarnation.hex(), "max_size": max_size, "value_columns": width,
        "shapes": [{"id": shape.id, "table": shape.table, "columns": list(shape.columns),
                    "key_columns": list(shape.key_columns)} for shape in shapes],
        "articles": [{"table": table, "publication": publication, "columns": columns, "subscribe_by": by}
                     for table, publication, columns, by in articles],
        "sends": [send.to_json() for send in sends],
        "range": [low, high],
    }
    _write_private(target / "keys", keys.to_text())
    _write_subscriptions(target / "subscriptions.parquet", subscriptions)
    rows, files = _write_log(db, target / "log", low, high, width, rows_per_file, rows_per_group,
                             check_stop or (lambda: None))
    # job.json last: an export without it is incomplete.
    (target / "job.json").write_text(json.dumps(job, indent=1) + "\n", encoding="utf-8")
    return ExportSummary(target, rows, files, (low, high))


def _write_private(path: Path, text: str) -> None:
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(descriptor, "w", encoding="ascii") as handle:
        handle.write(text)


def _write_subscriptions(path: Path, rows: list[tuple]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"remote": pa.array([row[0] for row in rows], pa.string()),
                      "publication": pa.array([row[1] for row in rows], pa.string()),
                      "value": pa.array([msgpack.packb(row[2], use_bin_type=True) for row in rows], pa.binary())})
    pq.write_table(table, path)


def _write_log(db: SiteDatabase, folder: Path, low: int, high: int, width: int, rows_per_file: int,
               rows_per_group: int, check_stop: Callable[[], None]) -> tuple[int, int]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    schema = _schema()
    pack = msgpack.Packer(use_bin_type=True).pack
    columns: list[list] = [[] for _ in range(8)]
    writer: pq.ParquetWriter | None = None
    total = in_file = files = 0

    def flush() -> None:
        nonlocal writer, files
        if not columns[0]:
            return
        if writer is None:
            writer = pq.ParquetWriter(folder / f"part-{files:05d}.parquet", schema)
            files += 1
        writer.write_table(pa.Table.from_arrays([pa.array(column, field.type)
                                                 for column, field in zip(columns, schema)], schema=schema))
        for column in columns:
            column.clear()
        check_stop()

    commits, origins, seqs, shape_ids, kinds, flags, returned_column, values = columns
    for commit, origin, rows, returned in db.read_capture(low, high, value_columns=width):
        for row in rows:
            seq = row[0]
            commits.append(commit)
            origins.append(origin)
            seqs.append(seq)
            shape_ids.append(row[1])
            kinds.append(row[2])
            flags.append(row[3])
            returned_column.append(returned.get(seq) if returned else None)
            values.append(pack(row[4:]))
            in_file += 1
            if len(seqs) >= rows_per_group or in_file >= rows_per_file:
                flush()
                if in_file >= rows_per_file and writer is not None:
                    writer.close()
                    writer = None
                    in_file = 0
        total += len(rows)
    flush()
    if writer is not None:
        writer.close()
    return total, files
