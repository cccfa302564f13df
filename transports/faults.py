"""``faults``: a transport wrapper that does to files what real message systems do.

Rules of this file:
* Every decision comes from ``random.Random`` seeded with the wrapper's seed
  and the file's name and attempt number, so a run is reproducible whatever
  order files are sent in.
* Faults happen on the way out (``send``): a file is dropped, corrupted (bit
  flips, truncation, appended bytes), duplicated (delivered again later),
  held back and released later (reordering and delay), or refused because
  its destination is partitioned away for a while.
* Held files wait in ``hold_dir`` when one is given (so they survive the
  process, as mail in a queue does), else in memory.  Each later call
  (send, receive) counts as one tick; a held file is delivered when its tick
  comes.  ``flush()`` delivers everything still held.
* Every injected fault is recorded: ``injected`` (a list of
  :class:`InjectedFault`) and, with ``record``, one JSON line per fault in
  that file.
"""

from __future__ import annotations

import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import AsyncIterator, Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path

from codec.atomic import write_file_atomically

from .base import Incoming, NameFilter, Transport, TransportWrapper
from .errors import BadTransportOptions, TransportUnavailable

KINDS = ("drop", "corrupt", "duplicate", "reorder", "delay", "partition")
_CONTROL_DIGEST = re.compile(r"\.[0-9a-f]{16}(?=\.fsm$)")


@dataclass(frozen=True, slots=True)
class FaultRates:
    """Probability of each fault per file sent (partition: per send, starting
    an outage of the destination for ``partition_ticks`` ticks)."""

    drop: float = 0.0
    corrupt: float = 0.0
    duplicate: float = 0.0
    reorder: float = 0.0
    delay: float = 0.0
    partition: float = 0.0
    max_hold_ticks: int = 8
    partition_ticks: int = 5

    def __post_init__(self) -> None:
        for kind in KINDS:
            value = getattr(self, kind)
            if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
                raise BadTransportOptions(f"faults: rate {kind} must be between 0 and 1, got {value!r}")
        if sum(getattr(self, kind) for kind in KINDS) > 1.0:
            raise BadTransportOptions("faults: the rates add up to more than 1")
        for ticks in ("max_hold_ticks", "partition_ticks"):
            value = getattr(self, ticks)
            if type(value) is not int or value < 1:
                raise BadTransportOptions(f"faults: {ticks} must be a whole number >= 1, got {value!r}")

    @classmethod
    def from_config(cls, path: str | os.PathLike[str]) -> "FaultRates":
        """Rates from a small JSON file, e.g. ``{"drop": 0.05, "corrupt": 0.02}``."""
        try:
            data = json.loads(Path(path).read_text())
        except (OSError, ValueError) as error:
            raise BadTransportOptions(f"faults: cannot read config {path}: {error}") from None
        if not isinstance(data, dict) or set(data) - set(cls.__dataclass_fields__):
            raise BadTransportOptions(f"faults: config {path} must be an object with keys among "
                                      f"{', '.join(cls.__dataclass_fields__)}")
        return cls(**data)


@dataclass(frozen=True, slots=True)
class InjectedFault:
    kind: str
    name: str
    address: str
    detail: str = ""
    at: float = field(default_factory=time.time)


class FaultsTransport(TransportWrapper):
    """Wraps another transport and injects faults into what it sends."""

    def __init__(self, inner: Transport, *, seed: int = 0, rates: FaultRates | None = None,
                 hold_dir: str | os.PathLike[str] | None = None, record: str | os.PathLike[str] | None = None,
                 config: str | os.PathLike[str] | None = None, active: bool = True,
                 drop: float | None = None, corrupt: float | None = None, duplicate: float | None = None,
                 reorder: float | None = None, delay: float | None = None, partition: float | None = None,
                 max_hold_ticks: int | None = None, partition_ticks: int | None = None) -> None:
        super().__init__(inner)
        if type(seed) is not int:
            raise BadTransportOptions(f"faults: seed must be a whole number, got {seed!r}")
        if type(active) is not bool:
            raise BadTransportOptions(f"faults: active must be true or false, got {active!r}")
        given = {name: value for name, value in (
            ("drop", drop), ("corrupt", corrupt), ("duplicate", duplicate), ("reorder", reorder), ("delay", delay),
            ("partition", partition), ("max_hold_ticks", max_hold_ticks), ("partition_ticks", partition_ticks))
            if value is not None}
        if sum((rates is not None, config is not None, bool(given))) > 1:
            raise BadTransportOptions("faults: give rates, a config file or rate options, not several")
        if config is not None and not str(config).strip():
            raise BadTransportOptions("faults: config must be the path of a JSON file of rates, got ''")
        if rates is None:
            rates = FaultRates.from_config(config) if config is not None else FaultRates(**given)
        elif isinstance(rates, Mapping):  # {"drop": 0.05, ...}, as in a config file
            if set(rates) - set(FaultRates.__dataclass_fields__):
                raise BadTransportOptions(f"faults: rates must have keys among "
                                          f"{', '.join(FaultRates.__dataclass_fields__)}, got {sorted(rates)}")
            rates = FaultRates(**rates)
        elif not isinstance(rates, FaultRates):
            raise BadTransportOptions(f"faults: rates must be FaultRates or a mapping of rates, got {rates!r}")
        self.seed = seed
        self.rates = rates
        self.active = active
        self.hold_dir = Path(hold_dir) if hold_dir is not None else None
        self.record = Path(record) if record is not None else None
        self.injected: list[InjectedFault] = []
        self._held: list[tuple[int, str, str, bytes]] = []  # (due tick, address, name, data)
        self._attempts: Counter[str] = Counter()
        self._partitioned_until: dict[str, int] = {}
        self._tick = 0
        if self.record is not None and self.record.is_dir():
            raise BadTransportOptions(f"faults: record {self.record} is a folder; give the file that gets one "
                                      "line per injected fault")
        if self.hold_dir is not None:
            try:
                self.hold_dir.mkdir(parents=True, exist_ok=True)
            except (FileExistsError, NotADirectoryError):
                raise BadTransportOptions(f"faults: hold_dir {self.hold_dir} is not a folder (a file is in the "
                                          "way); give a folder for the held files") from None
            self._tick = self._load_tick()

    # -- bookkeeping -------------------------------------------------------------------

    def counts(self) -> Counter[str]:
        return Counter(fault.kind for fault in self.injected)

    def _note(self, kind: str, name: str, address: str, detail: str = "") -> None:
        fault = InjectedFault(kind, name, address, detail)
        self.injected.append(fault)
        if self.record is not None:
            with open(self.record, "a", encoding="utf-8") as handle:
                handle.write(json.dumps(asdict(fault)) + "\n")

    def _load_tick(self) -> int:
        try:
            return int((self.hold_dir / "tick").read_text())  # type: ignore[operator]
        except (OSError, ValueError):
            return 0

    def _advance(self) -> None:
        self._tick += 1
        if self.hold_dir is not None:
            write_file_atomically(self.hold_dir / "tick", str(self._tick).encode())

    def _hold(self, due: int, address: str, name: str, data: bytes) -> None:
        if self.hold_dir is None:
            self._held.append((due, address, name, data))
            return
        serial = len(list(self.hold_dir.glob("*.held")))
        meta = json.dumps({"due": due, "address": address, "name": name}).encode()
        write_file_atomically(self.hold_dir / f"{due:012d}-{serial:06d}.held",
                              len(meta).to_bytes(4, "big") + meta + data)

    def _due(self, everything: bool = False) -> list[tuple[str, str, bytes]]:
        ready = []
        if self.hold_dir is None:
            keep = []
            for due, address, name, data in self._held:
                (ready if everything or due <= self._tick else keep).append((due, address, name, data))
            self._held = keep
            return [(a, n, d) for _, a, n, d in sorted(ready, key=lambda item: item[0])]
        for path in sorted(self.hold_dir.glob("*.held")):
            blob = path.read_bytes()
            size = int.from_bytes(blob[:4], "big")
            meta = json.loads(blob[4:4 + size])
            if everything or meta["due"] <= self._tick:
                ready.append((meta["address"], meta["name"], blob[4 + size:]))
                path.unlink()
        return ready

    async def _release_due(self, everything: bool = False) -> None:
        for address, name, data in self._due(everything):
            try:
                await self.inner.send(address, name, data)
            except TransportUnavailable:
                self._hold(self._tick + 1, address, name, data)

    async def flush(self) -> None:
        """Deliver every held file now (the faults have stopped)."""
        await self._release_due(everything=True)

    # -- hooks ------------------------------------------------------------------------

    async def _send(self, address: str, name: str, data: bytes) -> None:
        self._advance()
        await self._release_due()
        if not self.active:
            await self.inner.send(address, name, data)
            return
        # A control message's name ends in a digest of its bytes (which carry
        # random incarnation ids): decide by the rest, so a seed replays.
        key = _CONTROL_DIGEST.sub("", name)
        self._attempts[key] += 1
        rng = random.Random(f"{self.seed}:{key}:{self._attempts[key]}")
        if self._partitioned_until.get(address, 0) > self._tick:
            self._note("partition", name, address, "destination unreachable")
            raise TransportUnavailable(f"faults: {address} is partitioned away (injected)")
        roll = rng.random()
        rates = self.rates
        edge = 0.0
        for kind in KINDS:
            edge += getattr(rates, kind)
            if roll < edge:
                break
        else:
            await self.inner.send(address, name, data)
            return
        if kind == "drop":
            self._note("drop", name, address)
            return
        if kind == "corrupt":
            damaged, detail = _damage(rng, data)
            self._note("corrupt", name, address, detail)
            await self.inner.send(address, name, damaged)
            return
        if kind == "duplicate":
            self._note("duplicate", name, address)
            await self.inner.send(address, name, data)
            self._hold(self._tick + rng.randint(1, rates.max_hold_ticks), address, name, data)
            return
        if kind in ("reorder", "delay"):
            ticks = rng.randint(1, rates.max_hold_ticks)
            self._note(kind, name, address, f"held {ticks} ticks")
            self._hold(self._tick + ticks, address, name, data)
            return
        # partition: this destination is unreachable for a while, starting now.
        self._partitioned_until[address] = self._tick + rates.partition_ticks
        self._note("partition", name, address, f"for {rates.partition_ticks} ticks")
        raise TransportUnavailable(f"faults: {address} is partitioned away (injected)")

    async def _receive(self, address: str, wanted: NameFilter) -> AsyncIterator[Incoming]:
        self._advance()
        await self._release_due()
        async for incoming in self.inner.receive(address, wanted=wanted):
            yield incoming


def _damage(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    how = rng.choice(("flip", "truncate", "append"))
    if how == "flip" and data:
        position = rng.randrange(len(data))
        bit = 1 << rng.randrange(8)
        return data[:position] + bytes([data[position] ^ bit]) + data[position + 1:], f"bit flip at byte {position}"
    if how == "truncate" and len(data) > 1:
        length = rng.randrange(len(data))
        return data[:length], f"truncated to {length} bytes"
    extra = rng.randbytes(rng.randint(1, 64))
    return data + extra, f"{len(extra)} bytes appended"
