"""Mutated message files through the agent's real receive path.

A consolidated ``hq`` and remotes ``n1``, ``n2`` (the README's world, folder
inboxes); ``n1`` makes genuine files for ``hq`` (data and control, sealed).
Each batch writes mutated copies into hq's inbox and runs hq's agent once,
in this process.  After every batch:

* the run raised nothing, and no log line carries a traceback;
* every file addressed to hq left the inbox (stored or quarantined);
* hq's customer table holds only rows it had, or rows n1 committed;

and at the end the genuine files, delivered, still apply (the stream goes
on).  Mutations: bit flips, byte overwrites, truncation, appended junk,
splices, zeroed runs, empty and random files, edited header fields in the
name, and payloads of random or mutated msgpack signed with n1's real key
(what a thief of that key could send).

Run: ``python -m tests.security.fuzz --files 1000000 --json`` (docs/testing.md).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from agent.runner import Agent, RunOptions
from codec.errors import BadFileName
from codec.header import Header
from codec.message import compress, frame
from codec.names import Kind, MessageName

from .sites import build_world, keys_of

MUTATIONS = ("bitflip", "overwrite", "truncate", "extend", "splice", "zero", "empty", "random", "rename",
             "resign")


class FuzzFailure(Exception):
    """A check failed: the agent did something bad input must never make it do."""


@dataclass
class Summary:
    files: int = 0
    batches: int = 0
    quarantined: int = 0
    applied_messages: int = 0
    mutations: dict[str, int] = field(default_factory=lambda: {name: 0 for name in MUTATIONS})
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"files": self.files, "batches": self.batches, "quarantined": self.quarantined,
                "applied_messages": self.applied_messages, "mutations": self.mutations,
                "seconds": round(self.seconds, 2),
                "files_per_s": round(self.files / self.seconds, 1) if self.seconds else None}


class _Records(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.bad: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if record.exc_info or "Traceback" in text or "never retrieved" in text:
            self.bad.append(text[:300])


def _rows(database: Path) -> set[tuple]:
    with sqlite3.connect(database) as conn:
        return set(conn.execute("SELECT id, region, name FROM customer"))


async def _run(database: Path) -> object:
    async with Agent(database, RunOptions()) as agent:
        return await agent.run_once()


class Fuzzer:
    def __init__(self, root: Path, seed: int) -> None:
        self.random = random.Random(seed)
        self.seed = seed
        self.world = build_world(root)
        world = self.world
        with sqlite3.connect(world.n1) as conn:
            conn.executemany("INSERT INTO customer (id, region, name) VALUES (?, 'n1', ?)",
                             [(1000 + number, f"field row {number}") for number in range(40)])
        asyncio.run(_run(world.n1))
        self.corpus = {path.name: path.read_bytes() for path in sorted(world.inbox("hq").iterdir())}
        for name in self.corpus:
            (world.inbox("hq") / name).unlink()
        if not any(".d." in name for name in self.corpus):
            raise FuzzFailure("n1 made no data file to fuzz with")
        self.keys, self.incarnation = keys_of(world.n1)
        self.before = _rows(world.hq)
        self.n1_rows = _rows(world.n1)
        self.handler = _Records()
        self.summary = Summary()

    # -- mutations -------------------------------------------------------------------------

    def _pick(self) -> tuple[str, bytes]:
        return self.random.choice(list(self.corpus.items()))

    def mutate(self) -> tuple[str, str, bytes]:
        rnd = self.random
        how = rnd.choice(MUTATIONS)
        name, data = self._pick()
        buffer = bytearray(data)
        if how == "bitflip":
            for _ in range(rnd.randint(1, 8)):
                position = rnd.randrange(len(buffer))
                buffer[position] ^= 1 << rnd.randrange(8)
        elif how == "overwrite":
            position = rnd.randrange(len(buffer))
            buffer[position:position + 4] = rnd.randbytes(4)
        elif how == "truncate":
            del buffer[rnd.randrange(len(buffer)):]
        elif how == "extend":
            buffer += rnd.randbytes(rnd.randint(1, 64))
        elif how == "splice":
            _, other = self._pick()
            buffer = bytearray(data[:rnd.randrange(len(data))] + other[rnd.randrange(len(other)):])
        elif how == "zero":
            position = rnd.randrange(len(buffer))
            buffer[position:position + rnd.randint(1, 64)] = bytes(min(64, len(buffer) - position))
        elif how == "empty":
            buffer = bytearray()
        elif how == "random":
            buffer = bytearray(rnd.randbytes(rnd.randint(1, 400)))
        elif how == "rename":
            name = self._renamed(name)
        elif how == "resign":
            name, buffer = self._resigned()
        return how, name, bytes(buffer)

    def _header(self) -> Header:
        rnd = self.random
        prev = rnd.choice((0, rnd.randint(0, 50), 2**63 - 2))
        last = prev + rnd.choice((0, 1, rnd.randint(1, 50)))
        return Header(rnd.choice((0, 1, 2, 2**32 - 1)), prev, min(last, 2**63 - 1), rnd.choice((0, 0, 1, 3)))

    def _renamed(self, name: str) -> str:
        try:
            parsed = MessageName.parse(name)
        except BadFileName:
            return name
        header = self._header()
        if parsed.kind is Kind.CONTROL:
            return str(MessageName(parsed.sender, parsed.recipient, Kind.CONTROL, header,
                                   "%016x" % self.random.getrandbits(64)))
        return str(MessageName(parsed.sender, parsed.recipient, Kind.DATA, header))

    def _resigned(self) -> tuple[str, bytearray]:
        """A file n1's key really signed, carrying a payload a thief chose."""
        rnd = self.random
        choices = (rnd.randbytes(rnd.randint(0, 200)),
                   b"\x91\x93" + rnd.randbytes(rnd.randint(0, 60)),  # [[...]] with junk inside
                   b"\x94" + bytes(rnd.choice((0xcf, 0xd3, 0x00)) for _ in range(4)))
        payload = rnd.choice(choices)
        header = self._header()
        kind = rnd.choice((Kind.DATA, Kind.CONTROL))
        part = kind is Kind.DATA and header.is_part
        if kind is Kind.CONTROL:
            header = Header(header.resend_count, 0, header.last, 0)
        data = frame(kind, header, keys=self.keys, recipient="hq", incarnation=self.incarnation,
                     raw_length=len(payload), compressed=compress(payload), part=part)
        digest = "%016x" % rnd.getrandbits(64) if kind is Kind.CONTROL else None
        name = MessageName("n1", "hq", kind, header, digest) if digest else MessageName("n1", "hq", kind, header)
        return str(name), bytearray(data)

    # -- driving ---------------------------------------------------------------------------

    def batch(self, size: int) -> None:
        inbox = self.world.inbox("hq")
        written: dict[str, bytes] = {}
        for _ in range(size):
            how, name, data = self.mutate()
            for _ in range(8):  # the same name twice in one inbox is one file
                if name not in written:
                    break
                name = self._renamed(name)
            else:
                continue
            written[name] = data
            (inbox / name).write_bytes(data)
            self.summary.mutations[how] += 1
        self.summary.files += len(written)
        self.summary.batches += 1
        logger = logging.getLogger("fieldsync")
        logger.addHandler(self.handler)
        try:
            report = asyncio.run(_run(self.world.hq))
        except Exception as error:  # noqa: BLE001 - any escape is the finding
            raise FuzzFailure(f"seed {self.seed} batch {self.summary.batches}: the run raised "
                              f"{type(error).__name__}: {error}") from error
        finally:
            logger.removeHandler(self.handler)
        self.summary.quarantined += report.quarantined  # type: ignore[attr-defined]
        self.summary.applied_messages += report.applied_messages  # type: ignore[attr-defined]
        self.check()

    def check(self) -> None:
        where = f"seed {self.seed} batch {self.summary.batches}"
        if self.handler.bad:
            raise FuzzFailure(f"{where}: a log line carries a traceback: {self.handler.bad[0]}")
        for path in self.world.inbox("hq").iterdir():
            try:
                ours = MessageName.parse(path.name).recipient == "hq"
            except BadFileName:
                ours = False
            if ours and path.stat().st_nlink == 1 and path.stat().st_size <= 16 * 1024 * 1024:
                raise FuzzFailure(f"{where}: {path.name} was left in the inbox")
        strange = _rows(self.world.hq) - self.before - self.n1_rows
        if strange:
            raise FuzzFailure(f"{where}: hq holds rows n1 never committed: {sorted(strange)[:3]}")

    def finish(self) -> None:
        """The genuine files still apply: the stream went on."""
        for name, data in self.corpus.items():
            (self.world.inbox("hq") / name).write_bytes(data)
        for _ in range(3):
            asyncio.run(_run(self.world.hq))
            asyncio.run(_run(self.world.n1))
        missing = {row for row in self.n1_rows if row[1] == "n1"} - _rows(self.world.hq)
        if missing:
            raise FuzzFailure(f"seed {self.seed}: after the fuzz, {len(missing)} of n1's rows never reached hq")


def fuzz(files: int, *, seed: int = 0, batch: int = 2000, root: Path | None = None) -> Summary:
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="fieldsync-fuzz-") as temporary:
        fuzzer = Fuzzer(root or Path(temporary), seed)
        while fuzzer.summary.files < files:
            fuzzer.batch(min(batch, files - fuzzer.summary.files))
        fuzzer.finish()
    fuzzer.summary.seconds = time.perf_counter() - started
    return fuzzer.summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.security.fuzz", description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=20_000, help="mutated files in all (20000)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--batch", type=int, default=2000, help="files per run of the agent (2000)")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    arguments = parser.parse_args(argv)
    logging.basicConfig(level=logging.CRITICAL)
    try:
        summary = fuzz(arguments.files, seed=arguments.seed, batch=arguments.batch)
    except FuzzFailure as error:
        print(f"fuzz: {error}", file=sys.stderr)
        return 1
    if arguments.json:
        print(json.dumps(summary.as_dict()))
    else:
        for key, value in summary.as_dict().items():
            print(f"{key:18} {value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
