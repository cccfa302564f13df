"""Shared helpers: a recorded workload, state snapshots and byte surgery on
spool files."""

from __future__ import annotations

import random
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from agent.spool import SpoolQueues
from agent.spool._log import SegmentFile, ScanResult, list_segments, scan


def payload(direction: str, peer: str, name: str) -> bytes:
    """Every message's content is a function of where it is queued and its name."""
    seed = f"{direction}/{peer}/{name}".encode()
    return seed * (1 + len(name) % 7) + bytes(random.Random(seed).randbytes(len(name) * 3))


def snapshot(spool: SpoolQueues) -> tuple:
    """The committed queue state: queues with their names (in the order the
    interface lists them) and the in-doubt dequeues."""
    state = {}
    for depth in spool.depths():
        inbound, outbound = tuple(spool.inbound(depth.peer)), tuple(spool.outbound(depth.peer))
        if inbound:
            state[("in", depth.peer)] = inbound
        if outbound:
            state[("out", depth.peer)] = outbound
    doubts = tuple((doubt.peer, doubt.last, doubt.names) for doubt in spool.in_doubt())
    return state, doubts


def check_contents(spool: SpoolQueues, state: dict) -> None:
    for (direction, peer), names in state.items():
        for name in names:
            read = spool.read_inbound if direction == "in" else spool.read_outbound
            assert read(peer, name) == payload(direction, peer, name), (direction, peer, name)


@dataclass
class Recorded:
    """A workload run against a spool, with the state after every step and
    the log position at which that step was durable."""

    path: Path
    steps: list[tuple[int, tuple]] = field(default_factory=list)  # (end RBA, snapshot)

    def expected_at(self, rba: int) -> tuple:
        """The state a log cut at ``rba`` must restart to."""
        best: tuple = ({}, ())  # cut inside the first checkpoint: an empty spool
        for end, state in self.steps:
            if end <= rba:
                best = state
        return best


def record_workload(path: Path, *, seed: int = 1, steps: int = 40, **options) -> Recorded:
    """Puts, multi-message deletes, purges, in-doubt dequeues committed and
    aborted, and explicit checkpoints (which relog), each step recorded."""
    rng = random.Random(seed)
    options.setdefault("checkpoint_every", 10**9)
    options.setdefault("cpl_pairs", 2)
    spool = SpoolQueues(path, **options)
    recorded = Recorded(path)

    def note():
        recorded.steps.append((spool._log.next_rba, snapshot(spool)))

    note()
    counter = 0
    last = {"hq": 0, "f2": 0}
    for _step in range(steps):
        roll = rng.random()
        peer = rng.choice(["hq", "f2"])
        if roll < 0.4:
            counter += 1
            if rng.random() < 0.5:
                name = f"in-{counter:04d}.fsm"
                spool.put_inbound(peer, name, payload("in", peer, name))
            else:
                name = f"d.{rng.randint(0, 3):02d}-{counter:04d}"
                spool.put_outbound(peer, name, payload("out", peer, name), rng.randint(0, 3))
        elif roll < 0.55:
            queued = spool.inbound(peer)
            if queued:
                spool.delete_inbound(peer, rng.sample(queued, min(len(queued), rng.randint(1, 3))))
        elif roll < 0.65:
            queued = spool.outbound(peer)
            if queued:
                spool.delete_outbound(peer, queued[0])
        elif roll < 0.7:
            spool.purge_outbound(peer, rng.randint(0, 3))
        elif roll < 0.85:
            queued = spool.inbound(peer)
            if queued:
                last[peer] += 10
                token = spool.begin_dequeue(peer, queued[:rng.randint(1, 2)], last[peer])
                note()
                if rng.random() < 0.7:
                    spool.commit_dequeue(token, wait=True)
                else:
                    # The first compensation record decides an abort: restart finishes it.
                    start = spool._log.next_rba
                    spool.abort_dequeue(token)
                    _type, first = spool._log.read(start)
                    recorded.steps.append((start + 9 + len(first), snapshot(spool)))
        else:
            spool.checkpoint()
        note()
    spool.close()
    return recorded


def record_rbas(path: Path) -> list[tuple[int, int]]:
    """(RBA, total length) of every record in the spool's log."""
    segments = list_segments(path)
    result = ScanResult(0)
    found = []
    for rba, _type, payload_view in scan(segments, segments[0].base, result):
        found.append((rba, 9 + len(payload_view)))
    return found


def copy_spool(source: Path, target: Path) -> Path:
    shutil.copytree(source, target)
    return target


def segment_holding(path: Path, rba: int) -> SegmentFile:
    holder = None
    for segment in list_segments(path):
        if segment.base <= rba:
            holder = segment
    assert holder is not None
    return holder


def cut_log(path: Path, rba: int) -> None:
    """Make the log end at ``rba``, as if nothing after it reached the disk."""
    for segment in list_segments(path):
        if segment.base >= rba and segment.base > 0:
            segment.path.unlink()
    holder = segment_holding(path, rba)
    with open(holder.path, "r+b") as handle:
        handle.truncate(rba - holder.base)


def flip_byte(path: Path, rba: int) -> None:
    holder = segment_holding(path, rba)
    with open(holder.path, "r+b") as handle:
        handle.seek(rba - holder.base)
        byte = handle.read(1)
        handle.seek(rba - holder.base)
        handle.write(bytes([byte[0] ^ 0x5A]))
