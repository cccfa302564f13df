"""The Spark job that prepares large outbound batches (docs/spark.md).

Run it with ``spark-submit contrib/spark/job.py EXPORT OUTPUT`` or from
Python with :func:`run_job`.  It reads an export written by
``agent.spark.export``, selects each subscriber's operations with the
agent's own reader, packs them with the codec's packer and writes the
message files and one manifest per subscriber.

Rules of this file:
* Selection and packing are the agent's code (``SubscriberReader``,
  ``Router``, ``make_transaction``, ``pack_messages``), never a copy, so the
  files are byte for byte the agent's.
* No step collects the log on the driver: the driver reads ``job.json`` and
  collects one summary row per subscriber.
* Output files are written to a temporary name and renamed; a task that is
  run again writes the same bytes.  ``_SUCCESS.json`` is written last, by
  the driver, when every task succeeded; an output without it is partial.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import time
from itertools import chain, groupby
from pathlib import Path
from typing import Any, Iterator

FORMAT = 1

_ROUTED = "sub int, seq long, commit long, origin string, op binary"
_SUMMARY = "subscriber string, files long, bytes long"


class _Spec:
    """``job.json`` and what is built from it, once per Python worker."""

    def __init__(self, export: str) -> None:
        from codec.keys import PublicKeys, SiteKeys
        from agent.site.capture import Shape, ShapeTable
        from agent.site.schema import Role

        self.export = export
        self.job = job = _load_job(export)
        self.role = Role(job["role"])
        self.incarnation = bytes.fromhex(job["incarnation"])
        self.max_size = job["max_size"]
        self.value_columns = job["value_columns"]
        self.sends = job["sends"]
        self.shapes = ShapeTable(Shape(s["id"], s["table"], tuple(s["columns"]), tuple(s["key_columns"]))
                                 for s in job["shapes"])
        self.articles = [(a["table"], a["publication"], a["columns"], a["subscribe_by"]) for a in job["articles"]]
        with open(os.path.join(export, "keys"), encoding="ascii") as handle:
            self.keys = SiteKeys.from_text(handle.read(), f"{export}/keys")
        self.seal_to = [None if send["seal_to"] is None else PublicKeys.from_line(send["seal_to"])
                        for send in self.sends]

    def subscriptions(self) -> dict[str, list[tuple]]:
        import msgpack
        import pyarrow.parquet as pq

        table = pq.read_table(os.path.join(self.export, "subscriptions.parquet"))
        found: dict[str, list[tuple]] = {}
        for remote, publication, value in zip(*(table.column(name).to_pylist()
                                                for name in ("remote", "publication", "value"))):
            found.setdefault(remote, []).append((publication, msgpack.unpackb(value, raw=False)))
        return found


def _load_job(export: str) -> dict:
    with open(os.path.join(export, "job.json"), encoding="utf-8") as handle:
        job = json.load(handle)
    if job.get("format") != FORMAT:
        raise ValueError(f"{export}/job.json: export format {job.get('format')!r} is not {FORMAT}")
    return job


_specs: dict[str, _Spec] = {}


def _spec(export: str) -> _Spec:
    spec = _specs.get(export)
    if spec is None:
        spec = _specs[export] = _Spec(export)
    return spec


# --- stage 1: route every capture row to the subscribers it concerns ------------------


def _route(export: str, batches: Iterator[Any], stall: tuple[str, float] | None = None) -> Iterator[Any]:
    import msgpack
    import pyarrow as pa

    from agent.site.selection import Router, SubscriberReader, plan_from_rows

    if stall is not None:
        _stall(*stall)
    spec = _spec(export)
    subscriptions = spec.subscriptions()
    returned: dict[int, str] = {}
    readers = [SubscriberReader(plan_from_rows(send["subscriber"], spec.role, spec.articles,
                                               subscriptions.get(send["subscriber"], [])),
                                spec.shapes, returned.get, spec.value_columns)
               for send in spec.sends]
    router = Router(readers)
    starts = [send.get("read", send["start"]) for send in spec.sends]  # (start, read] held nothing for it
    ends = [send["end"] for send in spec.sends]
    unpackb = msgpack.unpackb
    pack = msgpack.Packer(use_bin_type=True).pack
    for batch in batches:
        commits, origins, seqs, shapes, kinds, flags, returned_column, values = (
            batch.column(name).to_pylist() for name in ("commit", "origin", "seq", "shape", "kind", "flags",
                                                         "returned", "values"))
        returned.clear()
        out_sub: list[int] = []
        out_seq: list[int] = []
        out_commit: list[int] = []
        out_origin: list[str] = []
        out_op: list[bytes] = []
        for index, seq in enumerate(seqs):
            if returned_column[index] is not None:
                returned[seq] = returned_column[index]
            origin = origins[index]
            commit = commits[index]
            row = (seq, shapes[index], kinds[index], flags[index], *unpackb(values[index], raw=False))
            # Readers of one class see the row alike: convert and pack it once.
            for members in router.classes(origin, row):
                subs = [sub for sub in members if starts[sub] < commit <= ends[sub]]
                if not subs:
                    continue
                op = readers[subs[0]].operation(origin, row)
                if op is None:
                    continue
                packed = pack(op)
                for sub in subs:
                    out_sub.append(sub)
                    out_seq.append(seq)
                    out_commit.append(commit)
                    out_origin.append(origin)
                    out_op.append(packed)
        if out_sub:
            yield pa.RecordBatch.from_arrays(
                [pa.array(out_sub, pa.int32()), pa.array(out_seq, pa.int64()), pa.array(out_commit, pa.int64()),
                 pa.array(out_origin, pa.string()), pa.array(out_op, pa.binary())],
                names=["sub", "seq", "commit", "origin", "op"])


def _stall(output: str, seconds: float) -> None:
    """Tests of a job that hangs: note this worker's pid in
    ``<output>/_stalled/`` (so a test can see it go), then sleep."""
    folder = Path(output, "_stalled")
    folder.mkdir(parents=True, exist_ok=True)
    Path(folder, str(os.getpid())).touch()
    time.sleep(seconds)


# --- stage 2: pack each subscriber's operations ---------------------------------------


def _rows(batches: Iterator[Any]) -> Iterator[tuple]:
    for batch in batches:
        yield from zip(*(batch.column(name).to_pylist() for name in ("sub", "seq", "commit", "origin", "op")))


def _transactions(rows: Iterator[tuple]) -> Iterator[Any]:
    import msgpack

    from agent.site.folding import make_transaction
    from codec.ops import Operation

    new = tuple.__new__
    for (commit, origin), group in groupby((row for row in rows if row[1] >= 0), key=lambda row: (row[2], row[3])):
        ops = [new(Operation, msgpack.unpackb(row[4], raw=False, use_list=False)) for row in group]
        transaction = make_transaction(commit, origin, ops)
        if transaction is not None:
            yield transaction


def _pack(export: str, output: str, fail_after_files: int | None, batches: Iterator[Any]) -> Iterator[Any]:
    import pyarrow as pa

    from codec.packing import pack_messages

    spec = _spec(export)
    written = 0
    names: list[str] = []
    counts: list[int] = []
    sizes: list[int] = []
    source = _rows(batches)
    for sub, rows in groupby(source, key=lambda row: row[0]):
        send = spec.sends[sub]
        subscriber = send["subscriber"]
        folder = Path(output, "files", subscriber)
        folder.mkdir(parents=True, exist_ok=True)
        files = []
        selected = [0]

        def counted(transactions: Iterator[Any]) -> Iterator[Any]:
            for transaction in transactions:
                selected[0] += 1
                yield transaction

        transactions = counted(_transactions(rows))
        first = next(transactions, None)
        # Nothing for the subscriber (only its marker row): no file at all,
        # as the agent's own packing (docs/protocol.md, rule 5).
        messages = () if first is None else pack_messages(
            chain([first], transactions), keys=spec.keys, recipient=subscriber, incarnation=spec.incarnation,
            resend_count=send["resend_count"], start=send["start"], max_size=spec.max_size, end=send["end"],
            seal_to=spec.seal_to[sub])
        for message in messages:
            if fail_after_files is not None and written >= fail_after_files:
                # Read the rest of the input first: a worker that stops
                # reading can surface in Spark as a broken pipe instead.
                for _ in source:
                    pass
                raise RuntimeError(f"injected failure after {written} files (--fail-after-files)")
            _write_atomic(folder / message.name, message.data)
            written += 1
            header = message.header
            files.append({"name": message.name, "resend_count": header.resend_count, "prev": header.prev,
                          "last": header.last, "seq": header.seq, "size": len(message.data),
                          "sha256": hashlib.sha256(message.data).hexdigest()})
        manifest = {"format": FORMAT, "subscriber": subscriber, "start": send["start"], "end": send["end"],
                    "resend_count": send["resend_count"], "transactions": selected[0], "files": files}
        manifests = Path(output, "manifests")
        manifests.mkdir(parents=True, exist_ok=True)
        _write_atomic(manifests / f"{subscriber}.json", (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
        names.append(subscriber)
        counts.append(len(files))
        sizes.append(sum(entry["size"] for entry in files))
    yield pa.RecordBatch.from_arrays([pa.array(names, pa.string()), pa.array(counts, pa.int64()),
                                      pa.array(sizes, pa.int64())], names=["subscriber", "files", "bytes"])


def _write_atomic(path: Path, data: bytes) -> None:
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(temporary, path)


# --- the job ----------------------------------------------------------------------------


def run_job(spark: Any, export: str | os.PathLike[str], output: str | os.PathLike[str], *,
            fail_after_files: int | None = None, stall_seconds: float | None = None) -> dict:
    """Run the job on ``spark`` (a SparkSession); return the summary that is
    also written to ``<output>/_SUCCESS.json``.  Tests only:
    ``fail_after_files`` makes every pack task fail after writing that many
    files; ``stall_seconds`` makes every route task sleep that long first."""
    from pyspark import StorageLevel
    from pyspark.sql import functions as F

    export = os.fspath(Path(export).resolve())
    output = os.fspath(Path(output).resolve())
    # Not _spec(): its cache would travel to the workers with the closures.
    sends = _load_job(export)["sends"]
    if Path(output, "_SUCCESS.json").exists():
        raise ValueError(f"{output} already holds a finished job")
    log = spark.read.parquet(os.path.join(export, "log"))
    stall = None if stall_seconds is None else (output, stall_seconds)
    routed = log.mapInArrow(lambda batches: _route(export, batches, stall), _ROUTED)
    # One marker row per send, so a subscriber with nothing selected still
    # gets its manifest (with no file: docs/protocol.md, rule 5).
    markers = spark.createDataFrame([(index, -1, -1, "", None) for index in range(len(sends))], _ROUTED)
    partitions = max(1, min(len(sends), spark.sparkContext.defaultParallelism * 2))
    # Routing is the costly pass: keep its output, or the range partitioner's
    # sampling pass would route the whole log a second time.
    routed = routed.persist(StorageLevel.DISK_ONLY)
    packed = (routed.unionByName(markers)
              .repartitionByRange(partitions, F.col("sub"))
              .sortWithinPartitions("sub", "seq")
              .mapInArrow(lambda batches: _pack(export, output, fail_after_files, batches), _SUMMARY))
    try:
        rows = packed.collect()
    finally:
        routed.unpersist()
    done = {row["subscriber"] for row in rows}
    missing = [send["subscriber"] for send in sends if send["subscriber"] not in done]
    if missing:
        raise RuntimeError(f"the job produced no manifest for {', '.join(missing)}")
    summary = {"format": FORMAT, "subscribers": len(rows), "files": sum(row["files"] for row in rows),
               "bytes": sum(row["bytes"] for row in rows)}
    temporary = Path(output, "._SUCCESS.json.tmp")
    temporary.write_text(json.dumps(summary) + "\n", encoding="utf-8")
    os.replace(temporary, Path(output, "_SUCCESS.json"))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contrib/spark/job.py",
                                     description="Pack a fieldsync batch export into message files.")
    parser.add_argument("export", help="folder written by the agent's batch export (holds job.json)")
    parser.add_argument("output", help="folder for the message files, manifests and _SUCCESS.json")
    parser.add_argument("--fail-after-files", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stall-seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.appName("fieldsync-batches").getOrCreate()
    try:
        summary = run_job(spark, args.export, args.output, fail_after_files=args.fail_after_files,
                          stall_seconds=args.stall_seconds)
    except Exception as error:  # the agent reads the last line of stderr
        print(f"fieldsync batch job failed: {type(error).__name__}: {error}".splitlines()[0], file=sys.stderr)
        return 1
    finally:
        spark.stop()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
