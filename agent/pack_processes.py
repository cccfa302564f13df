"""The packing worker processes of :mod:`agent.pack_workers`: starting
them, a worker's loop, and what comes back through their pipes (the rules
of that module hold here; this one holds the how).

Rules of this file:
* Workers are forked from a server process started for the purpose
  (multiprocessing's ``forkserver``): the agent has threads, so it never
  forks itself.  The server starts at the first use (about half a second:
  a fresh interpreter importing the packing modules) and serves every
  later batch of the agent's life.  A worker runs this module's code
  alone: it is not handed the agent's main module to run again (what
  multiprocessing does by default, which would import the whole command
  line in every worker).
* Workers ignore Ctrl-C and SIGTERM: the agent decides when they stop (it
  kills those still running when it leaves early), and a worker whose
  agent is gone stops at its next message.
* A worker logs through its pipe, with the agent's levels: the agent hands
  each record to its own handlers, so a worker's lines go where the
  agent's go (``--log-file``), not to a terminal of the worker's own.
* A worker that cannot open the site (a PostgreSQL server at its
  connection limit) leaves its share to the agent's process, once the
  others are done (logged each time); when no worker can be started at
  all, :class:`NotStarted` says so and the caller packs.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import pickle
import signal
import threading
from dataclasses import dataclass
from multiprocessing import popen_forkserver, spawn
from multiprocessing.connection import Connection, wait
from typing import Any, Callable, Sequence

from codec.keys import SiteKeys
from codec.message import EncodedMessage

from . import outbound
from .errors import AgentError
from .outbound import SEND_ERRORS, BatchSend, Packed, pack_sends
from .site import Site
from .site.errors import SiteError
from .site.locate import is_uri, open_site

log = logging.getLogger("fieldsync.agent")

_context: Any = None


class PackWorkerError(AgentError):
    """A packing worker could not pack a send: it stopped before it
    finished, or met an error that cannot be carried back as it is."""


def pack_in_workers(db: Site, keys: SiteKeys, sends: Sequence[BatchSend],
                    put: Callable[[int, EncodedMessage], None], *, max_size: int, version: int,
                    workers: int) -> list[Packed]:
    """``pack_sends`` of ``sends`` by ``workers`` worker processes (the
    rules of :mod:`agent.pack_workers` and of this file); raises
    :class:`NotStarted` when no worker could be started."""
    parts = [list(range(start, len(sends), workers)) for start in range(min(workers, len(sends)))]
    location = db.path if is_uri(db.path) else os.path.abspath(db.path)
    counts = [0] * len(sends)
    errors: dict[int, Exception] = {}
    reported: set[int] = set()  # sends a worker reported on
    running: dict[Any, tuple[Any, list[int]]] = {}
    here: list[int] = []  # the sends of workers that could not open the site
    try:
        _start(running, parts, sends, _Job(location, keys.to_text(), max_size, version,
                                           outbound.PACKING_MEMORY // len(parts), dict(os.environ), _levels()))
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
                elif what[0] == "log":
                    record = logging.makeLogRecord(what[1])
                    logging.getLogger(record.name).handle(record)
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


class NotStarted(Exception):
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


@dataclass(frozen=True)
class _Job:
    """What every worker of a batch is given, beside its share of sends."""

    location: str  # the site: an absolute path, or a PostgreSQL URI
    key_text: str
    max_size: int
    version: int
    memory: int  # its packers' share of PACKING_MEMORY
    environment: dict[str, str]  # the agent's, of the moment
    levels: dict[str, int]  # the agent's logging levels: logger name ("" for the root) to level


def _levels() -> dict[str, int]:
    return {name: logging.getLogger(name).getEffectiveLevel() for name in ("", "fieldsync")}


def _start(running: dict, parts: list[list[int]], sends: Sequence[BatchSend], job: _Job) -> None:
    context = _workers_context()
    for number, part in enumerate(parts, start=1):
        ours, theirs = context.Pipe(duplex=False)
        process = _Worker(target=_work, name=f"fieldsync-pack-{number}", daemon=True,
                          args=(job, [sends[index] for index in part], theirs))
        try:
            process.start()
        except (OSError, RuntimeError, ValueError) as error:
            ours.close()
            theirs.close()
            if running:
                raise PackWorkerError(f"a packing worker could not be started: {error}") from None
            raise NotStarted(error) from None
        theirs.close()
        running[ours] = (process, part)


class _AgentGone(BaseException):
    """The agent's end of a worker's pipe is closed."""


class _PipeHandler(logging.Handler):
    """A worker's log records, sent to the agent, which hands them to its
    own handlers (its terminal, ``--log-file``) as if logged there."""

    def __init__(self, conn: Connection) -> None:
        super().__init__()
        self.conn = conn

    def emit(self, record: logging.LogRecord) -> None:
        fields = {name: value for name, value in vars(record).items()
                  if isinstance(value, (str, int, float, bool, type(None)))}  # what travels as it is
        fields.update(msg=record.getMessage(), args=None, exc_info=None, exc_text=record.exc_text or (
            logging.Formatter().formatException(record.exc_info) if record.exc_info else None))
        try:
            self.conn.send(("log", fields))
        except OSError:
            pass  # the agent is gone: the worker stops at its next message


def _work(job: _Job, sends: list[BatchSend], conn: Connection) -> None:
    """A worker: pack ``sends`` from the site of ``job``, each message (and
    log record) sent back through ``conn``; then their errors (or the error
    raised).  It runs with the agent's environment and logging levels (the
    server it is forked from has the environment the agent had when the
    server started, and no logging set up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.environ.clear()
    os.environ.update(job.environment)
    root = logging.getLogger()
    root.handlers[:] = [_PipeHandler(conn)]
    for name, level in job.levels.items():
        logging.getLogger(name).setLevel(level)

    def put(position: int, message: EncodedMessage) -> None:
        try:
            conn.send(("message", position, message))
        except OSError:
            raise _AgentGone from None  # not a send's error: the whole pass stops

    try:
        try:
            keys = SiteKeys.from_text(job.key_text)
            site = open_site(job.location)
        except (SiteError, *SEND_ERRORS) as error:
            conn.send(("unopened", str(error)))
            return
        try:
            with site:
                packed = pack_sends(site, keys, sends, put, max_size=job.max_size, version=job.version,
                                    packing_memory=job.memory)
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
