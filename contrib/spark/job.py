"""The Spark job that prepares large outbound batches (docs/spark.md).

Run it with ``spark-submit contrib/spark/job.py EXPORT OUTPUT --keys KEYFILE``
or from Python with :func:`run_job`.  It reads an export written by
``agent.spark.export`` on the driver's machine, selects and packs each
subscriber's operations on the executors with the agent's own code, and
frames (seals, signs) and writes the message files and one manifest per
subscriber in the driver.

Rules of this file:
* Selection and packing are the agent's code (``SubscriberReader``,
  ``Fanout``, ``PayloadPacker``, and the loop that feeds the packers,
  ``agent.outbound.PackingPass``), never a copy, so the files are byte for
  byte the agent's.
* Nothing is shared but what Spark carries: the driver ships the export's
  log files to the executors (``SparkContext.addFile``) and the selection
  rules inside the tasks; the executors send back compressed payloads
  (through a shuffle, fetched one partition at a time), never a file path.
  The job runs in client mode: the driver is on the agent's machine.
* The site's secret key stays in the driver: executors cut and compress
  (``PayloadPacker``), the driver seals and signs (``Payload.frame``).
* Each task packs a group of subscribers from one pass over the whole log
  (the agent's own pass, ``Fanout``): no shuffle of operations, and a
  subscriber's stream is packed in order by one task.
* Output files are written to a temporary name and renamed, by the driver
  only; ``_SUCCESS.json`` is written last, when every file and manifest is.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

FORMAT = 7
OUTPUT_FORMAT = 1
# The driver fetches the payloads one partition at a time, as many
# partitions as tasks, more for a large export: one for about this many
# bytes of its log files (the payloads of a partition are about as large:
# compressed operations, each for the subscribers that receive it).  Each
# fetch is a Spark job of its own (some 50 ms).
_FETCH_BYTES = 64 * 2**20
_WATCH_SECONDS = 0.5


class NoExecutors(RuntimeError):
    """The cluster gave the job no executor within the time allowed."""


def load_export(export: str | os.PathLike[str]) -> dict:
    """``job.json`` with the subscriptions of every send, as the tasks need
    them (small: one entry per subscription)."""
    import msgpack
    import pyarrow.parquet as pq

    with open(os.path.join(export, "job.json"), encoding="utf-8") as handle:
        job = json.load(handle)
    if job.get("format") != FORMAT:
        raise ValueError(f"{export}/job.json: export format {job.get('format')!r} is not {FORMAT}")
    table = pq.read_table(os.path.join(export, "subscriptions.parquet"))
    found: dict[str, list[tuple]] = {}
    for remote, publication, value, since, until in zip(*(table.column(name).to_pylist() for name in (
            "remote", "publication", "value", "since", "until"))):
        found.setdefault(remote, []).append((publication, msgpack.unpackb(value, raw=False), since, until))
    job["subscriptions"] = found
    return job


# --- on the executors: select and pack a group of subscribers ---------------------------


def _capture_chunks(paths: list[str], low: int, high: int, returned: dict[int, str],
                    applied: dict[int, int]) -> Iterator[tuple[int, str, list[tuple]]]:
    """The capture rows of ``(low, high]`` as ``iter_capture`` gives them:
    ``(commit, origin, rows)``, rows ``(seq, shape, kind, flags, *values)``.
    ``returned`` holds the written-back columns of the rows of the current
    batch; ``applied`` is given the ``applied`` of each log transaction of
    rows written back, by commit offset, as its rows are read."""
    from functools import partial

    import msgpack
    import pyarrow.parquet as pq

    unpack = partial(msgpack.unpackb, raw=False, use_list=False)
    for path in paths:
        parquet = pq.ParquetFile(path)
        for batch in parquet.iter_batches(batch_size=10_000):
            commits = batch.column("commit").to_pylist()
            if commits[-1] <= low or commits[0] > high:
                continue
            origins, seqs, shapes, kinds, flags, returned_column, values = (
                batch.column(name).to_pylist() for name in ("origin", "seq", "shape", "kind", "flags", "returned",
                                                             "values"))
            returned.clear()
            if batch.column("returned").null_count < len(commits):
                returned.update((seq, columns) for seq, columns in zip(seqs, returned_column) if columns is not None)
            if batch.column("applied").null_count < len(commits):
                applied.update((commit, value) for commit, value in zip(commits, batch.column("applied").to_pylist())
                               if value is not None)
            # Column by column, then one tuple per row: the per-row work is
            # the values' decoding.
            rows = list(map(tuple.__add__, zip(seqs, shapes, kinds, flags), map(unpack, values)))
            first = 0
            for index in range(1, len(commits) + 1):
                if index < len(commits) and commits[index] == commits[first]:
                    continue
                commit = commits[first]
                if low < commit <= high:
                    yield commit, origins[first], rows[first:index]
                first = index


def _pack_group(job: dict, files: list[str], groups: int, fail_after: int | None,
                stall: tuple[str, float] | None, group: int) -> Iterator[tuple]:
    """The payloads of the subscribers of ``group`` (every ``groups``-th
    send), then one ``("m", send index, transactions)`` per subscriber.
    A payload is ``("p", send index, resend_count, prev, last, seq,
    raw_length, compressed, part, version)`` (the version is the job's,
    or 3 for a schema change: codec.packing)."""
    from pyspark import SparkFiles

    from agent.outbound import PackingPass
    from agent.site.capture import Shape, ShapeTable
    from agent.site.fanout import Fanout, with_applied
    from agent.site.selection import SubscriberReader, plan_from_rows
    from agent.site.identity import Role
    from codec.packing import Payload, PayloadPacker

    if stall is not None:
        _stall(*stall)
    sends = job["sends"]
    members = list(range(group, len(sends), groups))
    role = Role(job["role"])
    shapes = ShapeTable(Shape(s["id"], s["table"], tuple(s["columns"]), tuple(s["key_columns"]))
                        for s in job["shapes"])
    articles = [(a["table"], a["publication"], a["columns"], a["subscribe_by"]) for a in job["articles"]]
    removed = [(a["table"], a["publication"], a["columns"], a["subscribe_by"], a["until"]) for a in job["removed"]]
    returned: dict[int, str] = {}
    readers = [SubscriberReader(plan_from_rows(sends[index]["subscriber"], role, articles,
                                               job["subscriptions"].get(sends[index]["subscriber"], []),
                                               job["renames"], removed),
                                shapes, returned.get, job["value_columns"], runs=True)
               for index in members]
    ranges = [(sends[index]["read"], sends[index]["end"]) for index in members]
    fanout = Fanout(readers, ranges)

    def packer_for(position: int) -> PayloadPacker:
        send = sends[members[position]]
        return PayloadPacker(sender=job["site"], recipient=send["subscriber"], resend_count=send["resend_count"],
                             start=send["start"], max_size=job["max_size"], end=send["end"],
                             sealed=send["seal_to"] is not None, version=job["message_format"])

    low, high = min(start for start, _ in ranges), max(end for _, end in ranges)
    paths = [SparkFiles.get(name) for name in files]

    applied: dict[int, int] = {}  # a few: the log transactions of rows written back

    def selected() -> Iterator[tuple[int, Any]]:
        for commit, origin, rows in _capture_chunks(paths, low, high, returned, applied):
            yield from fanout.add(commit, origin, rows)
        yield from fanout.finish()

    subscribers = [sends[index]["subscriber"] for index in members]

    # The agent's packing loop; no error is isolated here: any fails the task.
    packing: PackingPass[Payload] = PackingPass(len(members), packer_for)
    made = 0
    for position, payload in packing.run(with_applied(selected(), subscribers, applied.get)):
        if fail_after is not None and made >= fail_after:
            raise RuntimeError(f"injected failure after {made} files (--fail-after-files)")
        made += 1
        header = payload.header
        yield ("p", members[position], header.resend_count, header.prev, header.last, header.seq,
               payload.raw_length, payload.compressed, payload.part, payload.version)
    for position in range(len(members)):
        yield ("m", members[position], packing.transactions[position])


def _stall(output: str, seconds: float) -> None:
    """Tests of a job that hangs: note this worker's pid in
    ``<output>/_stalled/`` (so a test can see it go), then sleep."""
    folder = Path(output, "_stalled")
    folder.mkdir(parents=True, exist_ok=True)
    Path(folder, str(os.getpid())).touch()
    time.sleep(seconds)


# --- on the driver: frame, write, check ----------------------------------------------------


class _Writer:
    """The driver's side: seals and signs each payload with the site's key,
    writes the files and, at the end, the manifests and ``_SUCCESS.json``."""

    def __init__(self, job: dict, keys: Any, output: Path) -> None:
        from codec.keys import PublicKeys

        self.job = job
        self.keys = keys
        self.output = output
        self.incarnation = bytes.fromhex(job["incarnation"])
        self.seal_to = [None if send["seal_to"] is None else PublicKeys.from_line(send["seal_to"])
                        for send in job["sends"]]
        self.files: list[list[dict]] = [[] for _ in job["sends"]]
        self.transactions: list[int | None] = [None] * len(job["sends"])

    def take(self, record: tuple) -> None:
        from codec.header import Header
        from codec.packing import Payload

        index = record[1]
        if record[0] == "m":
            self.transactions[index] = record[2]
            return
        _, _, resend_count, prev, last, seq, raw_length, compressed, part, version = record
        subscriber = self.job["sends"][index]["subscriber"]
        message = Payload(Header(resend_count, prev, last, seq), raw_length, compressed, part, version).frame(
            keys=self.keys, recipient=subscriber, incarnation=self.incarnation, seal_to=self.seal_to[index])
        folder = self.output / "files" / subscriber
        if not self.files[index]:
            folder.mkdir(parents=True, exist_ok=True)
        _write_atomic(folder / message.name, message.data)
        self.files[index].append({"name": message.name, "resend_count": resend_count, "prev": prev, "last": last,
                                  "seq": seq, "size": len(message.data),
                                  "sha256": hashlib.sha256(message.data).hexdigest()})

    def finish(self) -> dict:
        missing = [send["subscriber"] for send, count in zip(self.job["sends"], self.transactions) if count is None]
        if missing:
            raise RuntimeError(f"the job produced no manifest for {', '.join(missing)}")
        manifests = self.output / "manifests"
        manifests.mkdir(parents=True, exist_ok=True)
        for send, files, count in zip(self.job["sends"], self.files, self.transactions):
            (self.output / "files" / send["subscriber"]).mkdir(parents=True, exist_ok=True)
            files.sort(key=lambda entry: (entry["prev"], entry["seq"]))  # the chain's order
            manifest = {"format": OUTPUT_FORMAT, "subscriber": send["subscriber"], "start": send["start"],
                        "end": send["end"], "resend_count": send["resend_count"], "transactions": count,
                        "files": files}
            _write_atomic(manifests / f"{send['subscriber']}.json",
                          (json.dumps(manifest, indent=1) + "\n").encode("utf-8"))
        summary = {"format": OUTPUT_FORMAT, "subscribers": len(self.files),
                   "files": sum(len(files) for files in self.files),
                   "bytes": sum(entry["size"] for files in self.files for entry in files)}
        _write_atomic(self.output / "_SUCCESS.json", (json.dumps(summary) + "\n").encode("utf-8"))
        return summary


def _write_atomic(path: Path, data: bytes) -> None:
    """Whole or absent under its name.  No fsync: the output is a working
    copy the agent reads and queues (the queue makes it durable), deleted
    with the job folder whatever happens."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(temporary, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


class _ExecutorWatch:
    """Cancels the job when the cluster has given it no executor within
    ``seconds`` of its start (a job asking more memory or cores than any
    worker has waits for ever otherwise).  Local masters run the tasks in
    the driver: nothing to watch."""

    def __init__(self, spark: Any, seconds: float | None) -> None:
        self.context = spark.sparkContext
        self.seconds = seconds
        self.expired = False
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> "_ExecutorWatch":
        if self.seconds is not None and not self.context.master.startswith("local"):
            self._thread = threading.Thread(target=self._watch, name="executor-watch", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()

    def executors(self) -> int:
        # The driver counts as one block manager.
        return self.context._jsc.sc().getExecutorMemoryStatus().size() - 1

    def _watch(self) -> None:
        deadline = time.monotonic() + (self.seconds or 0)
        while not self._done.wait(_WATCH_SECONDS):
            if self.executors() > 0:
                return
            if time.monotonic() >= deadline:
                self.expired = True
                self.context.cancelAllJobs()
                return


def run_job(spark: Any, export: str | os.PathLike[str], output: str | os.PathLike[str], *, keys: Any,
            executor_wait: float | None = None, fail_after_files: int | None = None,
            stall_seconds: float | None = None) -> dict:
    """Run the job on ``spark`` (a SparkSession whose driver runs here);
    ``keys`` are the site's (``codec.keys.SiteKeys``), used here only.
    Return the summary that is also written to ``<output>/_SUCCESS.json``.
    ``executor_wait``: seconds the cluster has to give the job an executor
    (None: no limit), else :class:`NoExecutors`.  Tests only:
    ``fail_after_files`` makes every task fail after making that many
    payloads; ``stall_seconds`` makes every task sleep that long first."""
    export = os.fspath(Path(export).resolve())
    output_path = Path(output).resolve()
    if Path(output_path, "_SUCCESS.json").exists():
        raise ValueError(f"{output_path} already holds a finished job")
    job = load_export(export)
    if keys.site != job["site"]:
        raise ValueError(f"the keys are site {keys.site}'s, the export site {job['site']}'s")
    context = spark.sparkContext
    for name in job["log"]:
        context.addFile(os.path.join(export, "log", name))
    groups = max(1, min(len(job["sends"]), context.defaultParallelism))
    stall = None if stall_seconds is None else (os.fspath(output_path), stall_seconds)
    files = list(job["log"])
    tasks = context.parallelize(range(groups), groups)
    packed = tasks.flatMap(lambda group: _pack_group(job, files, groups, fail_after_files, stall, group))
    # Fetched one partition at a time, through a shuffle: it runs every task
    # at once (in the first fetch), the later fetches read its output.
    log_bytes = sum(os.path.getsize(os.path.join(export, "log", name)) for name in files)
    fetched = packed.repartition(max(groups, math.ceil(log_bytes / _FETCH_BYTES)))
    output_path.mkdir(parents=True, exist_ok=True)
    writer = _Writer(job, keys, output_path)
    with _ExecutorWatch(spark, executor_wait) as watch:
        try:
            for record in fetched.toLocalIterator():
                writer.take(record)
        except Exception:
            if watch.expired:
                raise NoExecutors(f"the cluster ({context.master}) gave the job no executor within "
                                  f"{_seconds(executor_wait or 0)} s") from None
            raise
    return writer.finish()


def describe_failure(error: BaseException) -> str:
    """One line for a failed job: for an error a task raised, the Python
    exception line of its traceback (Spark wraps it in Java errors whose
    first line says only which call failed)."""
    line = f"{type(error).__name__}: {error}".splitlines()[0]
    java = getattr(error, "java_exception", None)
    if java is None:
        return line
    try:
        text = str(java)
    except Exception:  # the JVM is gone
        return line
    causes = [match.group(0).strip() for match in _PYTHON_ERROR.finditer(text)]
    return causes[-1] if causes else (text.strip().splitlines() or [line])[0]


# A Python exception line: a bare name (no Java package) ending in Error or Exception.
_PYTHON_ERROR = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(?:Error|Exception|Denied): .*$", re.MULTILINE)


def _seconds(value: float) -> str:
    return str(int(value)) if value == int(value) else str(value)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="contrib/spark/job.py",
                                     description="Pack a fieldsync batch export into message files.")
    parser.add_argument("export", help="folder written by the agent's batch export (holds job.json)")
    parser.add_argument("output", help="folder for the message files, manifests and _SUCCESS.json")
    parser.add_argument("--keys", required=True, help="the site's secret key file (<db>.agent/keys/site.key)")
    parser.add_argument("--executor-wait", type=float, default=None,
                        help="seconds the cluster has to give the job an executor (default: no limit)")
    parser.add_argument("--fail-after-files", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--stall-seconds", type=float, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.executor_wait is not None and not 0 < args.executor_wait < math.inf:
        parser.error("--executor-wait must be a number of seconds > 0")
    from pyspark.sql import SparkSession

    from codec.keys import SiteKeys

    spark = None
    try:
        keys = SiteKeys.load(args.keys)
        spark = SparkSession.builder.appName("fieldsync-batches").getOrCreate()
        summary = run_job(spark, args.export, args.output, keys=keys, executor_wait=args.executor_wait,
                          fail_after_files=args.fail_after_files, stall_seconds=args.stall_seconds)
    except Exception as error:  # the agent reads the last line of stderr
        print(f"fieldsync batch job failed: {describe_failure(error)}", file=sys.stderr)
        return 1
    finally:
        if spark is not None:
            spark.stop()
    print(json.dumps(summary))
    return 0


if __name__ == "__main__":
    sys.exit(main())
