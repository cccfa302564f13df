"""Codec throughput against its own libraries called directly.

Workload: 200,000 operations of realistic rows (inserts of 5-6 column rows,
updates of two columns, deletes) in transactions of 1-120 operations,
packed into 50,000-byte messages.

* encode: ``pack_messages`` (serialize, choose cut points, compress, frame,
  sign) over the whole stream;
* decode: ``decode_message`` of every file (parse, verify, decompress,
  unpack, check transactions);
* baseline: for the very same chunks of operations, ``msgpack.packb`` +
  ``zstandard`` at the codec's level + Ed25519 sign, and Ed25519 verify +
  decompress + ``msgpack.unpackb`` — no framing, no packing decisions.

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
import zstandard

from codec.header import Header
from codec.keys import Keyring, SiteKeys
from codec.message import ZSTD_LEVEL, decode_message
from codec.ops import Operation, Run, Transaction, to_runs
from codec.packing import DEFAULT_MAX_SIZE, pack_messages

FIRST = ["Ana", "Bruno", "Chloé", "Dmitri", "Eun-ji", "Farid", "Greta", "Hiro", "Ines", "Jonas"]
LAST = ["Silva", "Moreau", "Novak", "Okafor", "Lindqvist", "Tanaka", "García", "Müller"]
CITIES = ["Lyon", "Tromsø", "Kraków", "Porto", "Nairobi", "Osaka", "Quito", "Hobart"]


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


def _chunks(transactions: list[Transaction], messages: list) -> list[list]:
    """The operations (or runs) of each message, as the packer cut them."""
    chunks = []
    by_commit = iter(transactions)
    for message in messages:
        header: Header = message.header
        chunk: list = []
        for transaction in by_commit:
            chunk.extend(transaction.ops)
            if transaction.commit == header.last:
                break
        chunks.append(chunk)
    return chunks


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
    # The baselines work on exactly the chunks the packer chose, and take
    # and give the objects the API does: Operations, or runs.
    op_chunks = _chunks(transactions, messages)
    run_chunks = _chunks(as_runs, messages)
    compressor = zstandard.ZstdCompressor(level=ZSTD_LEVEL, write_content_size=True)
    decompressor = zstandard.ZstdDecompressor()
    signer = sender.signer
    verifier = sender.public.verifier()

    def baseline_encode(chunks: list[list]) -> list:
        out = []
        for chunk in chunks:
            compressed = compressor.compress(msgpack.packb(chunk, use_bin_type=True))
            out.append((compressed, signer.sign(compressed)))
        return out

    op_files, run_files = baseline_encode(op_chunks), baseline_encode(run_chunks)
    new = tuple.__new__

    def baseline_decode_ops() -> None:
        for compressed, signature in op_files:
            verifier.verify(signature, compressed)
            [new(Operation, op) for op in msgpack.unpackb(decompressor.decompress(compressed), use_list=False,
                                                          raw=False)]

    def baseline_decode_runs() -> None:
        for compressed, signature in run_files:
            verifier.verify(signature, compressed)
            [new(Run, run) for run in msgpack.unpackb(decompressor.decompress(compressed), use_list=False,
                                                      raw=False)]

    def decode(runs: bool) -> None:
        for message in messages:
            decode_message(message.data, source=message.name, keyring=keyring, recipient="field1", runs=runs)

    gc.collect()
    gc.freeze()  # the workload itself is long-lived; keep the collector off it
    best: dict[str, float] = {}
    cases = (("encode", lambda: encode(transactions)), ("baseline_encode", lambda: baseline_encode(op_chunks)),
             ("decode", lambda: decode(False)), ("baseline_decode", baseline_decode_ops),
             ("runs_encode", lambda: encode(as_runs)), ("runs_baseline_encode", lambda: baseline_encode(run_chunks)),
             ("runs_decode", lambda: decode(True)), ("runs_baseline_decode", baseline_decode_runs))
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
        "mean_op_bytes": round(sum(len(msgpack.packb(op, use_bin_type=True)) for c in op_chunks for op in c)
                               / total_ops, 1),
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
