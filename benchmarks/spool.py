"""The message spool: durable throughput, and restart after a long history.

(a) throughput — 16 producer threads each enqueue a 1 KB message durably
    and dequeue it durably, over and over (``by_producers`` repeats the
    comparison with 1, 4 and 8 threads):
    * spool: ``put_outbound`` then ``read_outbound`` + ``delete_outbound``,
      one destination queue per thread, every call fsync-backed (group
      commit lets one fsync cover the threads waiting together);
    * persist-queue: one ``SQLiteQueue(multithreading=True)`` shared by the
      threads (its documented multi-thread use), ``put`` then ``get``;
    * litequeue: one ``LiteQueue`` per thread on the same file, ``put`` then
      ``pop`` (``pop`` commits the dequeue; ``done`` is not called, which
      only favours litequeue).
    Both SQLite baselines are set to WAL with ``PRAGMA synchronous=FULL``, so
    every commit is fsynced, like the spool's.  ``ratio_vs_best_baseline`` is
    the spool's messages/s over the faster baseline's.

(b) restart — 1,000 messages are queued and stay queued while 1,000,000
    other messages are enqueued and dequeued (built in group commits of
    1,000 pairs); then the spool is reopened and the restart measured.  The
    same history is built three times: selective relogging (the patent,
    n = 3 CPL pairs), no relogging, and relog-everything checkpoints (the
    prior art), each with a checkpoint every 10,000 log records.  Reported:
    bytes the restart read over all bytes ever logged, restart seconds, what
    checkpoints wrote, and the disk space left.

(c) a large queue — ``--long-lived N`` runs this part alone: N messages of
    1 KB are queued to 1,000 destinations and stay queued (an outbound queue
    for thousands of email remotes), then ``--pairs`` other 1 KB messages
    (default 200,000 here) are enqueued and dequeued through the same
    queues, in group commits of 1,000 pairs, with the spool's default
    settings.  Then the spool is crashed and reopened several times.
    Reported: restart seconds (median of the reopens) and bytes read; the
    message content logged (``payload_bytes``) against what checkpoints
    wrote (``checkpoint_bytes``) and their ratio; and the same history under
    the ``baseline`` policy (every relog copies the message, a checkpoint
    every ``checkpoint_every`` records, as before large queues were handled).

Run: ``python -m benchmarks.spool --json``.  ``--pairs`` and ``--messages``
shrink the runs for a quick look; ``--json --long-lived 100000`` for (c).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time

from agent.spool import SpoolQueues

PRODUCERS = 16
SWEEP = (1, 4, 8)
MESSAGE = 1024


# -- (a) throughput -----------------------------------------------------------------------------------


def _run_threads(count: int, work) -> float:
    barrier = threading.Barrier(count + 1)
    errors: list[BaseException] = []

    def runner(index: int) -> None:
        try:
            barrier.wait()
            work(index)
        except BaseException as error:  # reported below
            errors.append(error)

    threads = [threading.Thread(target=runner, args=(index,)) for index in range(count)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise errors[0]
    return elapsed


def spool_throughput(directory: str, producers: int, messages: int) -> float:
    spool = SpoolQueues(os.path.join(directory, "spool"))
    data = os.urandom(MESSAGE)
    per_thread = messages // producers

    def work(index: int) -> None:
        peer = f"site{index}"
        for number in range(per_thread):
            name = f"hq.{peer}.d.{number:010d}.fsm"
            spool.put_outbound(peer, name, data, 0)
            assert spool.read_outbound(peer, name) == data
            spool.delete_outbound(peer, name)

    try:
        elapsed = _run_threads(producers, work)
    finally:
        spool.close()
    return per_thread * producers / elapsed


def persist_queue_throughput(directory: str, producers: int, messages: int) -> float | None:
    try:
        from persistqueue import SQLiteQueue
    except ImportError:
        return None
    queue = SQLiteQueue(os.path.join(directory, "persist-queue"), multithreading=True, auto_commit=True)
    for connection in {id(queue._getter): queue._getter, id(queue._putter): queue._putter}.values():
        connection.execute("PRAGMA synchronous=FULL")
    data = os.urandom(MESSAGE)
    per_thread = messages // producers

    def work(_index: int) -> None:
        for _ in range(per_thread):
            queue.put(data)
            assert len(queue.get(block=True, timeout=30)) == MESSAGE

    try:
        elapsed = _run_threads(producers, work)
    finally:
        queue.close()
    return per_thread * producers / elapsed


def litequeue_throughput(directory: str, producers: int, messages: int) -> float | None:
    try:
        from litequeue import LiteQueue
    except ImportError:
        return None
    path = os.path.join(directory, "litequeue.db")
    queues = []
    for _ in range(producers):
        queue = LiteQueue(path, queue_name="bench", timeout=60)
        queue.conn.execute("PRAGMA synchronous=FULL")
        queues.append(queue)
    data = os.urandom(MESSAGE).hex()[:MESSAGE]  # litequeue stores text
    per_thread = messages // producers

    def work(index: int) -> None:
        queue = queues[index]
        for _ in range(per_thread):
            queue.put(data)
            popped = None
            while popped is None:
                popped = queue.pop()
            assert len(popped.data) == MESSAGE

    try:
        elapsed = _run_threads(producers, work)
    finally:
        for queue in queues:
            queue.close()
    return per_thread * producers / elapsed


def _measure(producers: int, messages: int) -> dict:
    with tempfile.TemporaryDirectory(prefix="spool-bench-", dir=_scratch()) as directory:
        spool = spool_throughput(directory, producers, messages)
        baselines = {
            "persist_queue_msgs_per_s": persist_queue_throughput(directory, producers, messages),
            "litequeue_msgs_per_s": litequeue_throughput(directory, producers, messages),
        }
    results: dict = {"msgs_per_s": round(spool)}
    for key, value in baselines.items():
        results[key] = None if value is None else round(value)
    measured = [value for value in baselines.values() if value is not None]
    results["ratio_vs_best_baseline"] = round(spool / max(measured), 2) if measured else None
    return results


def throughput(producers: int, messages: int, sweep: tuple[int, ...] = SWEEP) -> dict:
    results: dict = {"producers": producers, "message_bytes": MESSAGE, "messages": messages // producers * producers,
                     "fsync": "every commit (spool: group commit; SQLite: WAL, synchronous=FULL)"}
    results.update(_measure(producers, messages))
    if results["ratio_vs_best_baseline"] is None:
        results["missing_baselines"] = "pip install persist-queue litequeue"
    results["by_producers"] = {str(count): _measure(count, max(count, messages // 2)) for count in sweep}
    return results


# -- (b) restart ----------------------------------------------------------------------------------------


def restart_after_history(directory: str, relog: str, pairs: int, long_lived: int, message: int,
                          checkpoint_every: int) -> dict:
    path = os.path.join(directory, f"spool-{relog}")
    options = dict(checkpoint_every=checkpoint_every, cpl_pairs=3, relog=relog, segment_bytes=16 * 1024 * 1024)
    spool = SpoolQueues(path, **options)
    data = os.urandom(message)
    started = time.perf_counter()
    with spool.group_commit():
        for number in range(long_lived):
            spool.put_inbound("hq", f"hq.f1.d.{number:010d}.fsm", data)
    batch = 1000
    for first in range(0, pairs, batch):
        with spool.group_commit():
            for number in range(first, min(pairs, first + batch)):
                name = f"f1.f2.d.{number:010d}.fsm"
                spool.put_outbound("f2", name, data, 0)
                spool.delete_outbound("f2", name)
    build_seconds = time.perf_counter() - started
    counters = spool.counters
    status = spool.status()
    spool._abandon()  # a crash: restart now
    started = time.perf_counter()
    spool = SpoolQueues(path, **options)
    restart_seconds = time.perf_counter() - started
    restart = spool.last_restart
    assert len(spool.inbound("hq")) == long_lived and spool.outbound("f2") == []
    assert spool.read_inbound("hq", f"hq.f1.d.{long_lived - 1:010d}.fsm") == data
    spool.close()
    log_bytes = status.end_rba
    result = {
        "log_bytes_total": log_bytes,
        "restart_bytes_read": restart.bytes_read,
        "restart_bytes_read_ratio": round(restart.bytes_read / log_bytes, 5),
        "restart_s": round(restart_seconds, 3),
        "restart_records_read": restart.records_read,
        "checkpoints": counters.checkpoints,
        "relog_records_written": counters.relogged,
        "checkpoint_bytes_written": counters.checkpoint_bytes,
        "checkpoint_bytes_ratio": round(counters.checkpoint_bytes / log_bytes, 4),
        "disk_bytes_after": status.disk_bytes,
        "build_s": round(build_seconds, 1),
    }
    shutil.rmtree(path, ignore_errors=True)
    return result


def restart(pairs: int, long_lived: int, message: int, checkpoint_every: int) -> dict:
    results: dict = {"pairs": pairs, "long_lived_messages": long_lived, "message_bytes": message,
                     "checkpoint_every_records": checkpoint_every, "cpl_pairs": 3}
    with tempfile.TemporaryDirectory(prefix="spool-bench-", dir=_scratch()) as directory:
        for relog in ("selective", "off", "all"):
            measured = restart_after_history(directory, relog, pairs, long_lived, message, checkpoint_every)
            if relog == "selective":
                results.update(measured)
            else:
                results[f"relog_{relog}"] = measured
    return results


# -- (c) a large queue ---------------------------------------------------------------------------------

LARGE_QUEUE_PAIRS = 200_000
DESTINATIONS = 1000
REOPENS = 5


def large_queue_history(directory: str, policy: str, long_lived: int, pairs: int, reopens: int) -> dict:
    """Build the history of (c) under ``policy`` ("current" or "baseline"), then crash and reopen."""
    path = os.path.join(directory, f"spool-{policy}")
    options = {} if policy == "current" else {"relog_by_reference": False}
    data = os.urandom(MESSAGE)
    spool = SpoolQueues(path, **options)
    started = time.perf_counter()
    batch = 1000
    for first in range(0, long_lived, batch):
        with spool.group_commit():
            for number in range(first, min(long_lived, first + batch)):
                spool.put_outbound(f"r{number % DESTINATIONS:04d}", f"hq.r.d.{number:010d}.fsm", data, 0)
    for first in range(0, pairs, batch):
        with spool.group_commit():
            for number in range(first, min(pairs, first + batch)):
                peer, name = f"r{number % DESTINATIONS:04d}", f"hq.r.d.{long_lived + number:010d}.fsm"
                spool.put_outbound(peer, name, data, 0)
                spool.delete_outbound(peer, name)
    build_seconds = time.perf_counter() - started
    counters = spool.counters
    status = spool.status()
    spool._abandon()  # a crash: every reopen below restarts from the same log
    seconds = []
    for _ in range(reopens):
        started = time.perf_counter()
        spool = SpoolQueues(path, **options)
        seconds.append(time.perf_counter() - started)
        restart = spool.last_restart
        assert spool.status().messages == long_lived
        spool._abandon()
    spool = SpoolQueues(path, **options)
    last = f"hq.r.d.{long_lived - 1:010d}.fsm"
    assert spool.read_outbound(f"r{(long_lived - 1) % DESTINATIONS:04d}", last) == data
    spool.close()
    payload = (long_lived + pairs) * MESSAGE
    result = {
        "restart_s": round(statistics.median(seconds), 3),
        "restart_s_runs": [round(value, 3) for value in seconds],
        "restart_bytes_read": restart.bytes_read,
        "restart_records_read": restart.records_read,
        "payload_bytes": payload,
        "log_bytes_total": status.end_rba,
        "checkpoint_bytes": counters.checkpoint_bytes,
        "checkpoint_bytes_over_payload": round(counters.checkpoint_bytes / payload, 3),
        "checkpoints": counters.checkpoints,
        "relog_records_written": counters.relogged,
        "relogged_content_bytes": counters.relogged_bytes,
        "disk_bytes_after": status.disk_bytes,
        "build_s": round(build_seconds, 1),
    }
    shutil.rmtree(path, ignore_errors=True)
    return result


def large_queue(long_lived: int, pairs: int, reopens: int = REOPENS, baseline: bool = True) -> dict:
    results: dict = {"long_lived_messages": long_lived, "pairs": pairs, "message_bytes": MESSAGE,
                     "destinations": DESTINATIONS, "reopens": reopens, "settings": "SpoolQueues defaults"}
    with tempfile.TemporaryDirectory(prefix="spool-bench-", dir=_scratch()) as directory:
        results.update(large_queue_history(directory, "current", long_lived, pairs, reopens))
        if baseline:
            results["baseline"] = large_queue_history(directory, "baseline", long_lived, pairs, reopens)
    return results


def _scratch() -> str | None:
    return os.environ.get("FIELDSYNC_BENCH_DIR")


def run(producers: int, messages: int, pairs: int, long_lived: int, restart_message: int,
        checkpoint_every: int) -> dict:
    return {
        "benchmark": "spool",
        "throughput": throughput(producers, messages),
        "restart": restart(pairs, long_lived, restart_message, checkpoint_every),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.spool", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--producers", type=int, default=PRODUCERS)
    parser.add_argument("--messages", type=int, default=8000, help="messages in the throughput run")
    parser.add_argument("--pairs", type=int, default=None,
                        help="enqueue/dequeue pairs in the history (default 1,000,000; 200,000 with --long-lived)")
    parser.add_argument("--long-lived", type=int, default=None,
                        help="run only (c): this many 1 KB messages stay queued")
    parser.add_argument("--reopens", type=int, default=REOPENS, help="reopens measured in (c)")
    parser.add_argument("--no-baseline", action="store_true", help="(c) without the baseline history")
    parser.add_argument("--restart-message-bytes", type=int, default=256)
    parser.add_argument("--checkpoint-every", type=int, default=10_000)
    args = parser.parse_args(argv)
    if args.long_lived is not None:
        pairs = LARGE_QUEUE_PAIRS if args.pairs is None else args.pairs
        result = {"benchmark": "spool",
                  "large_queue": large_queue(args.long_lived, pairs, args.reopens, not args.no_baseline)}
    else:
        result = run(args.producers, args.messages, 1_000_000 if args.pairs is None else args.pairs, 1000,
                     args.restart_message_bytes, args.checkpoint_every)
    if args.json:
        print(json.dumps(result))
    else:
        print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
