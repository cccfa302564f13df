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
* No secret: the export holds the log range, the selection rules and the
  sends (public keys only).  It reaches the executors through Spark (the
  driver ships the log files), so its files are named for this export alone.
"""

from __future__ import annotations

import json
import os
import secrets
from dataclasses import dataclass
from itertools import repeat
from operator import itemgetter
from pathlib import Path
from typing import Callable, Iterable

import msgpack

from codec.message import DATA_VERSION

from ..outbound import BatchSend
from ..site import Site
from ..site.selection import plan_from_rows, value_columns_read
from .errors import SparkBatchError

FORMAT = 7
ROWS_PER_FILE = 250_000
ROWS_PER_GROUP = 50_000
_VALUES = itemgetter(slice(4, None))  # a capture row's value columns


@dataclass(frozen=True, slots=True)
class ExportSummary:
    directory: Path
    rows: int
    files: int
    range: tuple[int, int]
    bytes: int = 0


def _schema():  # type: ignore[no-untyped-def]
    import pyarrow as pa

    return pa.schema([("commit", pa.int64()), ("origin", pa.string()), ("seq", pa.int64()),
                      ("shape", pa.int64()), ("kind", pa.int8()), ("flags", pa.int64()),
                      ("returned", pa.string()), ("applied", pa.int64()), ("values", pa.binary())])


def export_batch(db: Site, sends: Iterable[BatchSend], directory: str | os.PathLike[str],
                 *, max_size: int, version: int = DATA_VERSION, rows_per_file: int = ROWS_PER_FILE,
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
    renames, removed = db.table_renames(), db.removed_articles()
    width = max((value_columns_read(shapes, plan_from_rows(send.subscriber, identity.role, articles,
                                                           [row[1:] for row in subscriptions
                                                            if row[0] == send.subscriber], renames, removed))
                 for send in sends), default=0)
    low, high = min(send.read_start for send in sends), max(send.end for send in sends)
    job = {
        "format": FORMAT, "site": identity.name, "role": identity.role.value,
        "incarnation": identity.incarnation.hex(), "max_size": max_size, "message_format": version,
        "value_columns": width,
        "shapes": [{"id": shape.id, "table": shape.table, "columns": list(shape.columns),
                    "key_columns": list(shape.key_columns)} for shape in shapes],
        "articles": [{"table": table, "publication": publication, "columns": columns, "subscribe_by": by}
                     for table, publication, columns, by in articles],
        "renames": renames,
        "removed": [{"table": table, "publication": publication, "columns": columns, "subscribe_by": by,
                     "until": until} for table, publication, columns, by, until in removed],
        "sends": [send.to_json() for send in sends],
        "range": [low, high],
    }
    _write_subscriptions(target / "subscriptions.parquet", subscriptions)
    # Executors keep the files the driver ships under their bare names, in
    # one folder per executor for the whole application: a name of this
    # export alone, as a session may run several jobs.
    token = secrets.token_hex(8)
    rows, names = _write_log(db, target / "log", token, low, high, width, rows_per_file, rows_per_group,
                             check_stop or (lambda: None))
    job["log"] = names
    # job.json last: an export without it is incomplete.
    (target / "job.json").write_text(json.dumps(job, indent=1) + "\n", encoding="utf-8")
    size = sum((target / "log" / name).stat().st_size for name in names)
    return ExportSummary(target, rows, len(names), (low, high), size)


def _write_subscriptions(path: Path, rows: list[tuple]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.table({"remote": pa.array([row[0] for row in rows], pa.string()),
                      "publication": pa.array([row[1] for row in rows], pa.string()),
                      "value": pa.array([msgpack.packb(row[2], use_bin_type=True) for row in rows], pa.binary()),
                      "since": pa.array([row[3] for row in rows], pa.int64()),
                      "until": pa.array([row[4] for row in rows], pa.int64())})
    pq.write_table(table, path)


def _write_log(db: Site, folder: Path, token: str, low: int, high: int, width: int, rows_per_file: int,
               rows_per_group: int, check_stop: Callable[[], None]) -> tuple[int, list[str]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    folder.mkdir()
    schema = _schema()
    pack = msgpack.Packer(use_bin_type=True).pack
    columns: list[list] = [[] for _ in range(9)]
    writer: pq.ParquetWriter | None = None
    total = in_file = 0
    names: list[str] = []

    def flush() -> None:
        nonlocal writer
        if not columns[0]:
            return
        if writer is None:
            names.append(f"log-{token}-{len(names):05d}.parquet")
            writer = pq.ParquetWriter(folder / names[-1], schema)
        writer.write_table(pa.Table.from_arrays([pa.array(column, field.type)
                                                 for column, field in zip(columns, schema)], schema=schema))
        for column in columns:
            column.clear()
        check_stop()

    commits, origins, seqs, shape_ids, kinds, flags, returned_column, applied_column, values = columns
    known: tuple[int, int | None] = (0, None)  # the last log transaction's applied (a large one comes in chunks)
    for commit, origin, chunk, returned in db.read_capture(low, high, value_columns=width):
        # Only a log transaction with rows written back carries one, on those rows.
        if returned and known[0] != commit:
            known = (commit, db.log_applied(commit))
        # A chunk at a time, column by column (the per-row work is the
        # values' encoding), cut where a row group or a file is full.
        done = 0
        while done < len(chunk):
            room = min(rows_per_group - len(seqs), rows_per_file - in_file)
            rows = chunk[done:done + room]
            done += len(rows)
            count = len(rows)
            chunk_seqs, chunk_shapes, chunk_kinds, chunk_flags = list(zip(*rows))[:4]
            commits.extend(repeat(commit, count))
            origins.extend(repeat(origin, count))
            seqs.extend(chunk_seqs)
            shape_ids.extend(chunk_shapes)
            kinds.extend(chunk_kinds)
            flags.extend(chunk_flags)
            returned_column.extend(map(returned.get, chunk_seqs) if returned else repeat(None, count))
            applied_column.extend([known[1] if seq in returned else None for seq in chunk_seqs] if returned
                                  else repeat(None, count))
            values.extend(map(pack, map(_VALUES, rows)))
            in_file += count
            if len(seqs) >= rows_per_group or in_file >= rows_per_file:
                flush()
                if in_file >= rows_per_file and writer is not None:
                    writer.close()
                    writer = None
                    in_file = 0
        total += len(chunk)
    flush()
    if writer is not None:
        writer.close()
    return total, names
