"""The worker that tests/spool/test_kill.py kills with SIGKILL.

Usage: python -m tests.spool.kill_child SPOOL JOURNAL SEED ROUND

Three threads, one peer each, put, delete and dequeue messages under load.
Every action is written to JOURNAL (one os.write per line, O_APPEND) as an
intent before it starts and as done only after the spool call returned; an
in-doubt dequeue writes ``A peer last`` when "the database transaction that
applies it" commits.  The parent checks the spool against the journal.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import traceback

from agent.spool import SpoolQueues

from .helpers import payload

PEERS = ("hq", "f2", "f3")
OPTIONS = dict(checkpoint_every=40, cpl_pairs=2, segment_bytes=16 * 1024)


def main(spool_path: str, journal_path: str, seed: int, round_number: int) -> None:
    journal = os.open(journal_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def note(*words: object) -> None:
        os.write(journal, (" ".join(str(word) for word in words) + "\n").encode())

    # The journal is there: the parent's kill may come from now on (its
    # interpreter's start-up, slow on a loaded machine, is not counted).
    print("started", flush=True)
    spool = SpoolQueues(spool_path, **OPTIONS)
    note("open", round_number)

    def work(index: int) -> None:
        try:
            loop(index)
        except BaseException:  # a failure must not look like a kill
            traceback.print_exc()
            os._exit(3)

    def loop(index: int) -> None:
        peer = PEERS[index]
        rng = random.Random(seed * 31 + index)
        inbound = list(spool.inbound(peer))
        outbound = list(spool.outbound(peer))
        last = round_number * 1_000_000
        counter = 0
        while True:
            counter += 1
            roll = rng.random()
            if roll < 0.45:
                direction = rng.choice(["in", "out"])
                name = f"r{round_number:02d}-{peer}-{counter:05d}-{'x' * rng.randint(0, 40)}.fsm"
                note("p+", direction, peer, name)
                if direction == "in":
                    spool.put_inbound(peer, name, payload("in", peer, name))
                    inbound.append(name)
                else:
                    spool.put_outbound(peer, name, payload("out", peer, name), 0)
                    outbound.append(name)
                note("P", direction, peer, name)
            elif roll < 0.6 and inbound:
                chosen = rng.sample(inbound, min(len(inbound), rng.randint(1, 3)))
                for name in chosen:
                    note("d+", "in", peer, name)
                spool.delete_inbound(peer, chosen)
                for name in chosen:
                    inbound.remove(name)
                    note("D", "in", peer, name)
            elif roll < 0.75 and outbound:
                name = outbound.pop(0)
                note("d+", "out", peer, name)
                spool.delete_outbound(peer, name)
                note("D", "out", peer, name)
            elif inbound:
                chosen = sorted(inbound)[:rng.randint(1, 2)]
                last += 10
                for name in chosen:
                    note("b+", peer, last, name)
                token = spool.begin_dequeue(peer, chosen, last)
                note("A", peer, last)  # the apply's database transaction commits
                spool.commit_dequeue(token)
                for name in chosen:
                    inbound.remove(name)

    threads = [threading.Thread(target=work, args=(index,), daemon=True) for index in range(len(PEERS))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
