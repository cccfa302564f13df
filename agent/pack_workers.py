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
* Workers are forked from a server process started for the purpose
  (multiprocessing's ``forkserver``): the agent has threads, so it never
  forks itself.  The server starts at the first use (about half a second:
  a fresh interpreter importing the packing modules) and serves every
  later batch of the agent's life.  A worker runs this module's code
  alone: it is not handed the agent's main module to run again (what
  multiprocessing does by default, which would import the whole command
  line in every worker).  Workers ignore Ctrl-C and SIGTERM:
  the agent decides when they stop (it kills those still running when it
  leaves early), and a worker whose agent is gone stops at its next
  message.
* What the single process reports, this reports: a send that failed
  carries its error (also one its worker met, or a worker that stopped
  before it finished: the send's files put so far stay put, and the next
  run sends again); an error reading the log itself is raised.  Workers
  that cannot be started leave the batch to this process (logged once); a
  worker that cannot open the site (a PostgreSQL server at its
  connection limit) leaves its share to this process, once the others are
  done (logged each time).
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
from multiprocessing import popen_forkserver, spawn
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

from codec.keys import SiteKeys
from codec.message import DATA_VERSION, EncodedMessage

from .errors import AgentError
from . import outbound
from .outbound import SEND_ERRORS, BatchSend, Packed, pack_sends
from .site import Site
from .site.errors import SiteError
from .site.locate import is_uri, open_site

log = logging.getLogger("fieldsync.agent")

# The backlog (log offsets summed over the due sends) from which sends are
# packed by workers: below it one process packs them in about a second or
# less (benchmarks.spark_batches: 10 million offsets to 50 subscribers in
# about 2 s on one core), which starting workers would not repay.
PACK_WORKERS_FROM = 1_000_000
# Workers used when --pack-workers is not given: the cores this process may
# run on, at most this many (each reads the whole log range again).
MAX_DEFAULT_WORKERS = 8

_context: Any = None
_unavailable: str | None = None  # why workers could not be started (then: never tried again)


class PackWorkerError(AgentError):
    """A packing worker could not pack a send: it stopped before it
    finished, or met an error that cannot be carried back as it is."""


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
    if uses_workers(sends, workers, workers_from):
        log.info("packing %d sends (backlog %d log offsets) on %d workers", len(sends), _backlog(sends),
                 min(workers, len(sends)))
        try:
            return pack_in_workers(db, keys, sends, put, max_size=max_size, version=version, workers=workers)
        except _NotStarted as error:
            log.warning("packing workers cannot be started (%s); sends are packed in the agent's process", error)
    return pack_sends(db, keys, sends, put, max_size=max_size, version=version)


def pack_in_workers(db: Site, keys: SiteKeys, sends: Sequence[BatchSend],
                    put: Callable[[int, EncodedMessage], None], *, max_size: int, version: int,
                    workers: int) -> list[Packed]:
    """``pack_sends`` of ``sends`` by ``workers`` worker processes (rules
    above); raises ``_NotStarted`` when no worker could be started."""
    parts = [list(range(start, len(sends), workers)) for start in range(min(workers, len(sends)))]
    location = db.path if is_uri(db.path) else os.path.abspath(db.path)
    counts = [0] * len(sends)
    errors: dict[int, Exception] = {}
    reported: set[int] = set()  # sends a worker reported on
    running: dict[Any, tuple[Any, list[int]]] = {}
    here: list[int] = []  # the sends of workers that could not open the site
    try:
        _start(running, parts, location, keys.to_text(), sends, max_size, version,
               outbound.PACKING_MEMORY // len(parts), dict(os.environ))
        while running:
            for conn in wait(list(running)):
                process, part = running[conn]
                try:
                    what = conn.recv()  # type: ignore[union-attr]
                except EOFError:
                    del running[conn]
                    conn.close()  # type: ignore[union-attr]
                    process.join()
                    for index in part:
                        if index not in reported:
                            errors.setdefault(index, PackWorkerError(
                                f"the packing worker of the send to {sends[index].subscriber} stopped (exit code "
                                f"{process.exitcode}) before it finished; the next run sends it again"))
                    continue
                if what[0] == "message":
                    index = part[what[1]]
                    if index in errors:
                        continue  # its put failed: the rest of the send is not wanted
                    try:
                        put(index, what[2])
                    except SEND_ERRORS as error:
                        errors[index] = error
                    else:
                        counts[index] += 1
                elif what[0] == "done":
                    for position, error in enumerate(what[1]):
                        reported.add(part[position])
                        if error is not None:
                            errors.setdefault(part[position], error)
                elif what[0] == "unopened":  # nothing of its share was made: made here instead
                    log.warning("a packing worker could not open %s (%s); its %d sends are packed in the agent's "
                                "process", location, what[1], len(part))
                    reported.update(part)
                    here.extend(part)
                else:  # "raised": reading the log failed, which stops the whole batch
                    raise what[1]
    finally:
        for conn, (process, _) in running.items():  # left early (an error, or the agent stopping)
            process.kill()
            process.join()
            conn.close()
    if here:
        here.sort()
        made = pack_sends(db, keys, [sends[index] for index in here],
                          lambda position, message: put(here[position], message), max_size=max_size, version=version)
        for index, outcome in zip(here, made):
            counts[index] = outcome.messages
            if outcome.error is not None:
                errors[index] = outcome.error
    return [Packed(counts[index], errors.get(index)) for index in range(len(sends))]


class _NotStarted(Exception):
    """No packing worker could be started."""


def _workers_context() -> Any:
    global _context
    if _context is None:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload([__name__])
        _context = context
    return _context


class _Popen(popen_forkserver.Popen):
    """multiprocessing's forkserver launch, without the main module in what
    the worker is told to prepare: a worker needs this module alone.  The
    launch asks ``spawn.get_preparation_data``, which is wrapped for its
    duration, under a lock (nothing else in the agent starts processes
    with multiprocessing).  Python 3.11's server would not take the main
    module ahead either: it looks for a ``main_path`` the preparation data
    names ``init_main_from_path``.
    tests/agent/test_pack_workers.py holds a worker to not running it."""

    _launching = threading.Lock()

    def _launch(self, process_obj: Any) -> None:
        prepare = spawn.get_preparation_data

        def without_main(name: str) -> dict:
            data = prepare(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        with self._launching:
            spawn.get_preparation_data = without_main
            try:
                super()._launch(process_obj)
            finally:
                spawn.get_preparation_data = prepare


class _Worker(multiprocessing.context.ForkServerProcess):
    @staticmethod
    def _Popen(process_obj: Any) -> _Popen:  # noqa: N802 - multiprocessing's name
        return _Popen(process_obj)


def _start(running: dict, parts: list[list[int]], location: str, key_text: str, sends: Sequence[BatchSend],
           max_size: int, version: int, memory: int, environment: dict[str, str]) -> None:
    global _unavailable
    context = _workers_context()
    for number, part in enumerate(parts, start=1):
        ours, theirs = context.Pipe(duplex=False)
        process = _Worker(target=_work, name=f"fieldsync-pack-{number}", daemon=True,
                                  args=(location, key_text, [sends[index] for index in part], max_size, version,
                                        memory, environment, theirs))
        try:
            process.start()
        except (OSError, RuntimeError, ValueError) as error:
            ours.close()
            theirs.close()
            if running:
                raise PackWorkerError(f"a packing worker could not be started: {error}") from None
            _unavailable = str(error)
            raise _NotStarted(error) from None
        theirs.close()
        running[ours] = (process, part)


class _AgentGone(BaseException):
    """The agent's end of a worker's pipe is closed."""


def _work(location: str, key_text: str, sends: list[BatchSend], max_size: int, version: int, memory: int,
          environment: dict[str, str], conn: Connection) -> None:
    """A worker: pack ``sends`` from the site at ``location``, each message
    sent back through ``conn``; then their errors (or the error raised).
    It runs with the agent's ``environment`` (the server it is forked from
    has the one the agent had when the server started)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(environment)

    def put(position: int, message: EncodedMessage) -> None:
        try:
            conn.send(("message", position, message))
        except OSError:
            raise _AgentGone from None  # not a send's error: the whole pass stops

    try:
        try:
            keys = SiteKeys.from_text(key_text)
            site = open_site(location)
        except (SiteError, *SEND_ERRORS) as error:
            conn.send(("unopened", str(error)))
            return
        try:
            with site:
                packed = pack_sends(site, keys, sends, put, max_size=max_size, version=version,
                                    packing_memory=memory)
        except Exception as error:  # noqa: BLE001 - raised in the agent, as pack_sends raises it there
            conn.send(("raised", _portable(error)))
            return
        conn.send(("done", [_portable(outcome.error) for outcome in packed]))
    except (_AgentGone, OSError):
        return  # the agent is gone: nothing to report to
    finally:
        conn.close()


def _portable(error: Exception | None) -> Exception | None:
    """``error`` as it can travel through a pipe: itself when it survives
    pickling, else its text in an error of the same family."""
    if error is None:
        return None
    try:
        pickle.loads(pickle.dumps(error))
        return error
    except Exception:  # noqa: BLE001 - whatever stops the trip
        family = SiteError if isinstance(error, SiteError) else PackWorkerError
        return family(f"{type(error).__name__}: {error}")
