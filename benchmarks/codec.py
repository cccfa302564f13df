"""Codec throughput against its own libraries called directly.

Workload: 200,000 operations of realistic rows (inserts of 5-6 column rows,
updates of two columns, deletes) in transactions of 1-120 operations,
packed into 50,000-byte messages.

* encode: ``pack_messages`` (serialize, choose cut points, compress, frame,
  sign) over the whole stream;
* decode: ``decode_message`` of every file (parse, verify, decompress,
  unpack, check transactions);
* baseline: for the very same transactions of each message, the least
  work msgpack + ``zstandard`` (at the codec's level) + Ed25519 can do to
  take and give what the API takes and gives, on the wire structure the
  codec writes (format version 2: ``[commit, origin, [run, ...]]`` per
  transaction; the baseline's payload is checked to be the codec's, byte
  for byte).  Encode: lay out the transactions' operations in runs (the
  operations API; the runs API is handed runs), ``msgpack.packb`` once,
  compress once, sign.  Decode: verify, decompress, ``msgpack.unpackb``,
  and build what the API gives back: ``Operation`` values out of the runs'
  rows (operations API) or ``Run`` values (runs API), per transaction.
  No framing, no packing decisions, no checks of the structure.

The codec itself writes and reads its msgpack with msgspec (byte for byte
what msgpack writes, about twice as fast; docs/message-format.md), so the
runs figures are also given against the same least work done with
msgspec (``msgspec_runs_encode_ratio``, ``msgspec_runs_decode_ratio``: its
encoder, and its decoder typed as the codec's, into ``Run`` values):
what the codec costs over its own library.

Each figure is the best of several alternating rounds, so both sides see
the same machine noise.  Run: ``python -m benchmarks.codec --json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import sys
import time

import msgpack
import msgspec
import zstandard

from codec.header import Header
from codec.keys import Keyring, SiteKeys
from codec.message import ZSTD_LEVEL, decode_message
from codec.ops import RUN_ROWS, Operation, OpKind, Run, Transaction, to_runs
from codec.packing import DEFAULT_MAX_SIZE, pack_messages
from codec.payloads import VERSION2_SHAPE

FIRST = ["Ana", "Bruno", "Chloé", "Dmitri", "Eun-ji", "Farid", "Greta", "Hiro", "Ines", "Jonas"]
LAST = ["Silva", "Moreau", "Novak", "Okafor", "Lindqvist", "Tanaka", "García", "Müller"]
CITIES = ["Lyon", "Tromsø", "Kraków", "Porto", "Nairobi", "Osaka", "Quito", "Hobart"]
INSERT, UPDATE, DELETE = OpKind.INSERT, OpKind.UPDATE, OpKind.DELETE


def make_workload(operations: int, seed: int = 7) -> list[Transaction]:
    rng = random.Random(seed)
    transactions: list[Transaction] = []
    commit = 1000
    next_id = 1
    live: list[int] = []
    produced = 0
    while produced < operations:
        size = min(operations - produced, rng.randint(1, 120))
        ops = []
        for _ in range(size):
            roll = rng.random()
            if roll < 0.6 or len(live) < 100:
                row_id = next_id
                next_id += 1
                live.append(row_id)
                row = {
                    "id": row_id,
                    "name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                    "city": rng.choice(CITIES),
                    "balance": round(rng.uniform(-500, 25_000), 2),
                    "visits": rng.randint(0, 400),
                }
                if rng.random() < 0.3:
                    row["note"] = rng.choice([None, "call back", "prefers email", "VIP"])
                ops.append(Operation.insert("customer", (row_id,), row))
            elif roll < 0.9:
                row_id = rng.choice(live)
                old = {"balance": round(rng.uniform(-500, 25_000), 2), "visits": rng.randint(0, 400)}
                new = {"balance": round(rng.uniform(-500, 25_000), 2), "visits": old["visits"] + 1}
                ops.append(Operation.update("customer", (row_id,), old, new))
            else:
                row_id = live.pop(rng.randrange(len(live)))
                ops.append(Operation.delete("customer", (row_id,), {
                    "id": row_id, "name": f"{rng.choice(FIRST)} {rng.choice(LAST)}",
                    "city": rng.choice(CITIES), "balance": 0.0, "visits": 0}))
        commit += rng.randint(40, 400)
        transactions.append(Transaction(commit, "hq", tuple(ops)))
        produced += size
    return transactions


def _chunks(transactions: list[Transaction], messages: list) -> list[list[Transaction]]:
    """The transactions of each message, as the packer cut them."""
    chunks = []
    by_commit = iter(transactions)
    for message in messages:
        header: Header = message.header
        assert not header.is_part, "the workload's transactions each fit one message"
        chunk: list[Transaction] = []
        for transaction in by_commit:
            chunk.append(transaction)
            if transaction.commit == header.last:
                break
        chunks.append(chunk)
    return chunks


def baseline_runs(ops: tuple[Operation, ...]) -> list[tuple]:
    """The runs of ``ops`` as the wire lays them out (format version 2):
    consecutive operations of one table, kind and columns, at most RUN_ROWS
    rows a run, each row ``key ‖ before values ‖ after values``."""
    runs: list[tuple] = []
    head = None
    rows: list = []
    for table, kind, key, before, after in ops:
        if kind == INSERT:
            mine = (table, kind, len(key), (), (*after,))
            row = (*key, *after.values())
        elif kind == UPDATE:
            mine = (table, kind, len(key), (*before,), (*after,))
            row = (*key, *before.values(), *after.values())
        else:
            mine = (table, kind, len(key), (*before,), ())
            row = (*key, *before.values())
        if mine == head and len(rows) < RUN_ROWS:
            rows.append(row)
        else:
            head, rows = mine, [row]
            runs.append((*mine, rows))
    return runs


def run(operations: int = 200_000, rounds: int = 3) -> dict:
    sender = SiteKeys.from_seeds("hq", bytes(range(32)), bytes(range(32, 64)))
    keyring = Keyring([sender.public])
    incarnation = bytes(16)
    transactions = make_workload(operations)
    as_runs = [Transaction._trusted(t.commit, t.origin, tuple(to_runs(t.ops))) for t in transactions]
    total_ops = sum(len(t.ops) for t in transactions)

    def encode(source: list[Transaction]) -> list:
        return list(pack_messages(source, keys=sender, recipient="field1", incarnation=incarnation,
                                  resend_count=0, start=0, max_size=DEFAULT_MAX_SIZE))

    messages = encode(transactions)
    assert [m.data for m in encode(as_runs)] == [m.data for m in messages]  # the same files either way
    # The baselines work on exactly the transactions the packer put in each
    # message, and take and give the objects the API does: Operations, or runs.
    op_chunks = _chunks(transactions, messages)
    run_chunks = _chunks(as_runs, messages)
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    decompressor = zstandard.ZstdDecompressor()
    signer = sender.signer
    verifier = sender.public.verifier()
    packb, unpackb = msgpack.packb, msgpack.unpackb

    def baseline_encode_ops() -> list:
        out = []
        for chunk in op_chunks:
            payload = packb([(t.commit, t.origin, baseline_runs(t.ops)) for t in chunk])
            compressed = compressor.compress(payload)
            out.append((compressed, signer.sign(compressed)))
        return out

    def baseline_encode_runs() -> list:
        out = []
        for chunk in run_chunks:
            compressed = compressor.compress(packb([(t.commit, t.origin, t.ops) for t in chunk]))
            out.append((compressed, signer.sign(compressed)))
        return out

    files = baseline_encode_ops()
    assert files == baseline_encode_runs()
    payload_start = 62 + len("hq") + len("field1")  # docs/message-format.md, "File layout"
    codec_payloads = [decompressor.decompress(message.data[payload_start:-64]) for message in messages]
    assert [decompressor.decompress(compressed) for compressed, _ in files] == codec_payloads, \
        "the baseline writes the codec's payloads"
    new = tuple.__new__

    # Each decode gives one file's transactions and drops them before the
    # next file, as the API's side does (holding them all would make the
    # collector walk them again and again).
    def baseline_decode_ops(compressed: bytes, signature: bytes) -> list:
        verifier.verify(signature, compressed)
        out = []
        for commit, origin, runs in unpackb(decompressor.decompress(compressed), use_list=False):
            ops = []
            for table, kind, width, before, after, rows in runs:
                if kind == INSERT:
                    ops += [new(Operation, (table, kind, row[:width], None, dict(zip(after, row[width:]))))
                            for row in rows]
                elif kind == DELETE:
                    ops += [new(Operation, (table, kind, row[:width], dict(zip(before, row[width:])), None))
                            for row in rows]
                else:
                    middle = width + len(before)
                    ops += [new(Operation, (table, kind, row[:width], dict(zip(before, row[width:middle])),
                                            dict(zip(after, row[middle:])))) for row in rows]
            out.append((commit, origin, ops))
        return out

    def baseline_decode_runs(compressed: bytes, signature: bytes) -> list:
        verifier.verify(signature, compressed)
        return [(commit, origin, [new(Run, run) for run in runs])
                for commit, origin, runs in unpackb(decompressor.decompress(compressed), use_list=False)]

    decoded = [t for m in messages for t in decode_message(m.data, source=m.name, keyring=keyring,
                                                            recipient="field1").transactions]
    assert [(t.commit, t.origin, list(t.ops)) for t in decoded] == [
        t for compressed, signature in files for t in baseline_decode_ops(compressed, signature)], \
        "the baseline gives back the codec's operations"

    library_encoder = msgspec.msgpack.Encoder()
    library_decoder = msgspec.msgpack.Decoder(VERSION2_SHAPE)

    def library_encode_runs() -> list:
        out = []
        for chunk in run_chunks:
            compressed = compressor.compress(library_encoder.encode([(t.commit, t.origin, t.ops) for t in chunk]))
            out.append((compressed, signer.sign(compressed)))
        return out

    def library_decode_runs(compressed: bytes, signature: bytes) -> tuple:
        verifier.verify(signature, compressed)
        return library_decoder.decode(decompressor.decompress(compressed))

    assert library_encode_runs() == files
    assert [(commit, origin, list(runs)) for compressed, signature in files
            for commit, origin, runs in library_decode_runs(compressed, signature)] == [
        t for compressed, signature in files for t in baseline_decode_runs(compressed, signature)]

    def baseline_decode(decode_file) -> None:  # type: ignore[no-untyped-def]
        for compressed, signature in files:
            decode_file(compressed, signature)

    def decode(runs: bool) -> None:
        for message in messages:
            decode_message(message.data, source=message.name, keyring=keyring, recipient="field1", runs=runs)

    gc.collect()
    gc.freeze()  # the workload itself is long-lived; keep the collector off it
    best: dict[str, float] = {}
    cases = (("encode", lambda: encode(transactions)), ("baseline_encode", baseline_encode_ops),
             ("decode", lambda: decode(False)), ("baseline_decode", lambda: baseline_decode(baseline_decode_ops)),
             ("runs_encode", lambda: encode(as_runs)), ("runs_baseline_encode", baseline_encode_runs),
             ("runs_decode", lambda: decode(True)),
             ("runs_baseline_decode", lambda: baseline_decode(baseline_decode_runs)),
             ("msgspec_runs_baseline_encode", library_encode_runs),
             ("msgspec_runs_baseline_decode", lambda: baseline_decode(library_decode_runs)))
    for _ in range(rounds):
        for name, function in cases:
            started = time.perf_counter()
            function()
            elapsed = time.perf_counter() - started
            best[name] = min(best.get(name, elapsed), elapsed)
    gc.unfreeze()
    sizes = [len(m.data) for m in messages]
    result = {
        "benchmark": "codec",
        "operations": total_ops,
        "transactions": len(transactions),
        "mean_op_bytes": round(sum(len(packb(op)) for t in transactions for op in t.ops) / total_ops, 1),
        "messages": len(messages),
        "max_message_size": DEFAULT_MAX_SIZE,
        "largest_file_bytes": max(sizes),
        "mean_file_bytes": round(sum(sizes) / len(sizes)),
    }
    for prefix in ("", "runs_"):
        for step in ("encode", "decode"):
            result[f"{prefix}{step}_ops_per_s"] = round(total_ops / best[f"{prefix}{step}"])
            result[f"{prefix}baseline_{step}_ops_per_s"] = round(total_ops / best[f"{prefix}baseline_{step}"])
            result[f"{prefix}{step}_ratio"] = round(best[f"{prefix}baseline_{step}"] / best[f"{prefix}{step}"], 3)
    for step in ("encode", "decode"):
        result[f"msgspec_runs_baseline_{step}_ops_per_s"] = round(total_ops / best[f"msgspec_runs_baseline_{step}"])
        result[f"msgspec_runs_{step}_ratio"] = round(best[f"msgspec_runs_baseline_{step}"] / best[f"runs_{step}"], 3)
    result["target_ratio"] = 0.9
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.codec", description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--operations", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    result = run(args.operations, args.rounds)
    if args.json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key:>28}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
