"""Packing one send phase's sends on several cores: worker processes, each
packing its share of the sends (``agent run --pack-workers``;
docs/spark.md, "Packing on several cores").

Rules of this file:
* :func:`pack_due_sends` decides: worker processes for two sends or more
  whose backlog (log offsets over the sends, as ``--spark-threshold``
  counts it) reaches ``workers_from``, and only with more than one worker;
  else :func:`agent.outbound.pack_sends` here, in this process.
* A send is packed whole by one worker, as ``pack_sends`` packs it (each
  worker runs it on its share, over its own connection to the site, made
  with the agent's environment of the moment: libpq reads its password
  file and service file from there), so
  the files are byte for byte those one process makes.  The sends are
  dealt out in turn, so each worker gets a like share of subscribers.
* Only the agent puts: each message comes back through its worker's pipe
  and goes to ``put`` as it arrives, a send's messages in their order.  A
  worker waits while its pipe is full, and each worker's packers get their
  share of ``PACKING_MEMORY`` (a worker with more sends than fit makes
  more passes), so the workers together hold what one process's pass
  holds, and a message in flight per worker, whatever the backlog.
* The processes themselves (starting them, a worker's loop, what comes
  back) are :mod:`agent.pack_processes`, imported at the first batch that
  uses them: an agent that never packs on workers never imports
  multiprocessing (``agent run`` starts that much sooner).
* What the single process reports, this reports: a send that failed
  carries its error (also one its worker met, or a worker that stopped
  before it finished: the send's files put so far stay put, and the next
  run sends again); an error reading the log itself is raised.  Workers
  that cannot be started leave the batch, and every later one, to this
  process (logged once).
"""

from __future__ import annotations

import logging
import os
from typing import Callable, Sequence

from codec.keys import SiteKeys
from codec.message import DATA_VERSION, EncodedMessage

from .outbound import BatchSend, Packed, pack_sends
from .site import Site

log = logging.getLogger("fieldsync.agent")

# The backlog (log offsets summed over the due sends) from which sends are
# packed by workers: below it one process packs them in about a second or
# less (benchmarks.spark_batches: 10 million offsets to 50 subscribers in
# about 2 s on one core), which starting workers would not repay.
PACK_WORKERS_FROM = 1_000_000
# Workers used when --pack-workers is not given: the cores this process may
# run on, at most this many (each reads the whole log range again).
MAX_DEFAULT_WORKERS = 8

_unavailable: str | None = None  # why workers could not be started (then: never tried again)


def default_workers() -> int:
    """The workers ``--pack-workers`` gives when not set: the cores this
    process may run on, at most :data:`MAX_DEFAULT_WORKERS`."""
    try:
        cores = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cores = os.cpu_count() or 1
    return max(1, min(cores, MAX_DEFAULT_WORKERS))


def uses_workers(sends: Sequence[BatchSend], workers: int, workers_from: int) -> bool:
    """Whether :func:`pack_due_sends` packs ``sends`` in worker processes."""
    return workers > 1 and len(sends) > 1 and _unavailable is None and _backlog(sends) >= workers_from


def _backlog(sends: Sequence[BatchSend]) -> int:
    return sum(send.backlog for send in sends)


def pack_due_sends(db: Site, keys: SiteKeys, sends: Sequence[BatchSend],
                   put: Callable[[int, EncodedMessage], None], *, max_size: int, version: int = DATA_VERSION,
                   workers: int = 1, workers_from: int = PACK_WORKERS_FROM) -> list[Packed]:
    """:func:`agent.outbound.pack_sends` of ``sends``, by ``workers`` worker
    processes where the rules above say so."""
    global _unavailable
    if uses_workers(sends, workers, workers_from):
        log.info("packing %d sends (backlog %d log offsets) on %d workers", len(sends), _backlog(sends),
                 min(workers, len(sends)))
        from . import pack_processes  # multiprocessing, imported when first used

        try:
            return pack_processes.pack_in_workers(db, keys, sends, put, max_size=max_size, version=version,
                                                  workers=workers)
        except pack_processes.NotStarted as error:
            _unavailable = str(error)
            log.warning("packing workers cannot be started (%s); sends are packed in the agent's process", error)
    return pack_sends(db, keys, sends, put, max_size=max_size, version=version)
