"""A site agent's metrics in Prometheus' text format (docs/metrics.md).

Rules of this file:
* Collecting only reads: the site database, the spool and the quarantine
  are never changed.
* The agent's own database connection is never used (it belongs to the
  agent's worker threads): every collection opens the site read-only on a
  connection of its own (a SQLite file, or a PostgreSQL database named by
  a URI: agent/site/postgres/metrics_rows.py) and reads every peer with
  one query per table, whatever the number of peers.
* From the live agent only what is safe to read from another thread is
  read: plain counters of its report, its peers' frozen protocol states
  (from a copy of its peer table), and the spool's depths, which the spool
  counts under its own lock.
* I/O at the edge: :meth:`SiteMetrics.snapshot` gathers a
  :class:`Snapshot`; :func:`families` turns one into metric families and
  reads nothing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import sqlite3
import threading
import time
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, Literal

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector, CollectorRegistry

from .errors import AgentError
from .keyfiles import agent_directory
from .quarantine import REASON_SUFFIX
from .queues import QueueDepth, QueueError
from .site import SiteError, is_uri
from .site.sqlite.log import HORIZON_SQL, log_end
from .site.sqlite.schema import SCHEMA_ROWS
from .site.remote_rules import schema_current
from .site.sqlite.remotes import IN_ERROR_SQL

if TYPE_CHECKING:
    from .runner import Agent, RunReport

log = logging.getLogger("fieldsync.agent")
Mode = Literal["batch", "continuous"]


class MetricsError(AgentError):
    """The metrics cannot be served or written as asked."""


# -- what one collection saw ------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class PeerSample:
    """One peer as a collection saw it.  Offsets named ``*_received`` are in
    the peer's log, the others in this site's; times are Unix seconds."""

    name: str
    log_sent: int
    confirm_sent: int
    log_received: int
    horizon: int                     # docs/protocol.md rule 8: the log the peer may still need starts after it
    created_at: float
    last_received_at: float | None   # a data message from the peer last applied
    heard_at: float | None           # a message of the peer (data or control) last arrived
    last_sent_at: float | None       # data messages to the peer last queued
    peer_log_sent: int | None        # the most the peer said it sent (known to a live agent only)
    state_log_received: int | None   # log_received in the same protocol state as peer_log_sent
    inbound: int                     # messages queued in the spool
    outbound: int
    quarantined: int
    conflicts: int
    apply_errors: int
    in_error: bool = False           # an error in force now (agent status --errors selects the peer)
    schema_version: int | None = None  # the largest the peer reported (docs/protocol.md, "Schema versions")
    schema_current: bool | None = None  # it runs the consolidated's schema of now (remote_rules.schema_current)


@dataclass(frozen=True, slots=True)
class RunSample:
    """The agent's run: a batch run, or a continuous agent since it started."""

    mode: Mode
    started_at: float
    ended_at: float | None   # a batch run that has finished
    received: int
    applied_messages: int
    sent: int
    quarantined: int
    resend_requests: int
    transport_errors: int
    local_errors: int
    stopped_streams: int
    ok: bool


@dataclass(frozen=True, slots=True)
class Snapshot:
    site: str
    log_end: int
    peers: tuple[PeerSample, ...]
    quarantine_files: int
    conflicts: int
    apply_errors: int
    run: RunSample | None   # None before the agent opened
    schema_version: int | None = None  # this site's (docs/protocol.md, "Schema versions"); None: none


# -- reading -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _SiteRows:
    site: str
    log_end: int
    remotes: list[tuple]
    conflicts: dict[str, int]
    apply_errors: dict[str, int]
    schema_version: int | None = None  # the site's (docs/protocol.md, "Schema versions"); None: none
    consolidated: bool = True  # the site's role (a PostgreSQL site is always the consolidated)


def read_site(database: Path | str) -> _SiteRows:
    """The site's name, log end, remote-user rows and per-peer conflict and
    apply-error counts, in one read transaction on a read-only connection."""
    if is_uri(database):
        from .site.postgres.metrics_rows import read_metrics_rows

        try:
            return _SiteRows(*read_metrics_rows(str(database)))
        except SiteError as error:
            raise MetricsError(str(error)) from None
    uri = Path(os.path.abspath(database)).as_uri() + "?mode=ro"
    try:
        conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=5.0)
    except sqlite3.Error as error:
        raise MetricsError(f"{database}: cannot open for reading metrics ({error})") from None
    try:
        conn.execute("BEGIN")
        site, role = conn.execute("SELECT name, role FROM fieldsync_site WHERE id = 1").fetchone()
        remotes = conn.execute("SELECT name, log_sent, confirm_sent, log_received, created_at, last_received_at,"
                               f" last_sent_at, {HORIZON_SQL}, heard_at, {IN_ERROR_SQL}, peer_schema_version"
                               " FROM fieldsync_remote").fetchall()
        conflicts = dict(conn.execute("SELECT peer, count(*) FROM fieldsync_conflict GROUP BY peer").fetchall())
        errors = dict(conn.execute("SELECT peer, count(*) FROM fieldsync_apply_error GROUP BY peer").fetchall())
        end = log_end(conn)
        version = conn.execute(f"SELECT max(commit_offset) FROM fieldsync_schema_change WHERE {SCHEMA_ROWS}"
                               ).fetchone()[0]
        conn.execute("COMMIT")
    except sqlite3.Error as error:
        raise MetricsError(f"{database}: cannot read metrics ({error})") from None
    finally:
        conn.close()
    return _SiteRows(site, end, remotes, conflicts, errors, version, role == "consolidated")


def _seconds(text: str | None) -> float | None:
    return None if text is None else datetime.fromisoformat(text).timestamp()


class QuarantineCounts:
    """Quarantined files per peer, from the folder's listing.  A stored
    name is never reused, so the peer of each is read from its record once
    and remembered: a collection costs one listing and the new records."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._peers: dict[str, str | None] = {}  # stored name -> peer (None: not a peer, or no record)

    def count(self) -> tuple[int, dict[str, int]]:
        """(files in all, files per peer), as ``agent inbox`` lists them."""
        try:
            names = {entry.name for entry in os.scandir(self.folder) if not entry.name.startswith(".")}
        except (FileNotFoundError, NotADirectoryError):
            names = set()
        entries = {}
        for name in names:
            if name.endswith(REASON_SUFFIX):
                stored = name[: -len(REASON_SUFFIX)]
                if stored in names:
                    continue  # counted with its data file
                entries[stored] = True   # a record alone: counted when its content was dropped (see below)
            else:
                entries[name] = False
        per_peer: dict[str, int] = {}
        total = 0
        for stored, record_only in entries.items():
            if stored not in self._peers:
                record = self._record(stored)
                if record_only and not record.get("content_dropped"):
                    continue  # a record whose file was removed by hand: not an entry (read again next time)
                peer = record.get("peer")
                self._peers[stored] = peer if isinstance(peer, str) else None
            total += 1
            peer = self._peers[stored]
            if peer is not None:
                per_peer[peer] = per_peer.get(peer, 0) + 1
        for stored in set(self._peers) - set(entries):
            del self._peers[stored]  # dropped from the quarantine
        return total, per_peer

    def _record(self, stored: str) -> dict:
        try:
            record = json.loads((self.folder / (stored + REASON_SUFFIX)).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return {}
        return record if isinstance(record, dict) else {}


def spool_depths(database: Path) -> list[QueueDepth]:
    """The queue depths of a spool no agent holds, read without taking it:
    from its summary when the log shows it current (as ``agent status``
    reads them; docs/spool-format.md, "summary"), else from the log."""
    from .spool import SummaryStale, SummaryUnreadable, check_spool, read_summary

    spool = agent_directory(database) / "spool"
    if not spool.is_dir():
        return []
    counts: dict[str, list[int]] = {}
    try:
        queues = [(queue.peer, queue.direction, queue.messages) for queue in read_summary(spool).queues]
    except (SummaryStale, SummaryUnreadable):
        queues = [(queue.peer, queue.direction, len(queue.names)) for queue in check_spool(spool).queues]
    for peer, direction, messages in queues:
        counts.setdefault(peer, [0, 0])[direction == "out"] += messages
    return [QueueDepth(peer, inbound, outbound) for peer, (inbound, outbound) in counts.items()]


class SiteMetrics(Collector):
    """The metrics of the site in ``database`` and of its agent's run.

    Register it in a :class:`CollectorRegistry`; give :meth:`attach` to
    ``run_agent(on_open=...)`` and call :meth:`finish` when a batch run has
    ended.  Collections may come from any thread, one at a time."""

    def __init__(self, database: Path | str, mode: Mode, *, clock: Callable[[], float] = time.time) -> None:
        self.database = database if is_uri(database) else Path(database)
        self.mode = mode
        self.clock = clock
        self.started_at = clock()
        self.ended_at: float | None = None
        self._agent: Agent | None = None
        self._report: RunReport | None = None
        self._quarantine = QuarantineCounts(agent_directory(self.database) / "quarantine")
        self._lock = threading.Lock()

    def attach(self, agent: "Agent") -> None:
        """The agent is open (``on_open``): its run is counted from now on."""
        self._agent = agent
        self._report = agent.report

    def finish(self, report: "RunReport") -> None:
        """The batch run ended with ``report``; its spool is closed."""
        self._report = report
        self.ended_at = self.clock()

    def registry(self) -> CollectorRegistry:
        registry = CollectorRegistry(auto_describe=False)
        registry.register(self)
        return registry

    def collect(self) -> Iterator[Metric]:
        with self._lock:
            snapshot = self.snapshot()
        return iter(families(snapshot))

    def snapshot(self) -> Snapshot:
        rows = read_site(self.database)
        depths = {depth.peer: depth for depth in self._depths()}
        quarantine_files, quarantined = self._quarantine.count()
        agent = self._agent
        states = {name: peer.protocol.state for name, peer in dict(agent.peers).items()} if agent else {}
        peers = []
        for (name, log_sent, confirm_sent, log_received, created_at, last_received_at, last_sent_at,
             horizon, heard_at, in_error, schema_version) in rows.remotes:
            state = states.get(name)
            depth = depths.get(name)
            peers.append(PeerSample(
                name=name, log_sent=log_sent, confirm_sent=confirm_sent, log_received=log_received, horizon=horizon,
                created_at=_seconds(created_at) or 0.0, last_received_at=_seconds(last_received_at),
                heard_at=heard_at,
                last_sent_at=_seconds(last_sent_at),
                peer_log_sent=state.peer_log_sent if state is not None else None,
                state_log_received=state.log_received if state is not None else None,
                inbound=depth.inbound if depth else 0, outbound=depth.outbound if depth else 0,
                quarantined=quarantined.get(name, 0), conflicts=rows.conflicts.get(name, 0),
                apply_errors=rows.apply_errors.get(name, 0), in_error=bool(in_error),
                schema_version=schema_version, schema_current=schema_current(rows.schema_version, horizon,
                                                                             schema_version)
                if rows.consolidated else None))
        return Snapshot(site=rows.site, log_end=rows.log_end, peers=tuple(peers),
                        quarantine_files=quarantine_files, conflicts=sum(rows.conflicts.values()),
                        apply_errors=sum(rows.apply_errors.values()), run=self._run(),
                        schema_version=rows.schema_version)

    def _depths(self) -> list[QueueDepth]:
        agent = self._agent
        if agent is not None and self.ended_at is None:
            try:
                return agent.queues.depths()  # under the spool's lock
            except QueueError:
                pass  # closed as the agent stops: read it from the files
        return spool_depths(self.database)

    def _run(self) -> RunSample | None:
        report = self._report
        if report is None:
            return None
        return RunSample(
            mode=self.mode, started_at=self.started_at, ended_at=self.ended_at, received=report.received,
            applied_messages=report.applied_messages, sent=report.sent, quarantined=report.quarantined,
            resend_requests=report.resend_requests, transport_errors=_occurrences(report.transport_errors),
            local_errors=_occurrences(report.local_errors), stopped_streams=_occurrences(report.stopped_streams),
            ok=report.ok)


def _occurrences(problems: "Iterable[str]") -> int:
    """How many problems a run's :class:`~agent.run_options.Problems` met, repeats included."""
    counts = getattr(problems, "counts", {})
    return sum(counts.values()) + getattr(problems, "not_kept", 0)


# -- the families ------------------------------------------------------------------------------
#
# Each HELP text is the metric's meaning, said once: docs/metrics.md's
# tables begin each metric's meaning with it, word for word, and may only
# add sentences after it (tests/cli/test_metrics.py holds them together).
# So a HELP text says what the code that moves the figure does, is one or
# more whole sentences, and has no "|" (a table cell) and no backquote.

IN_ERROR_HELP = ("1 while the peer is in error (agent status --errors lists it): a transport error not yet followed "
                 "by a successful send or receive, a stopped stream, or apply errors not acknowledged; else 0.")

# (name, help, value of a PeerSample or None to leave the peer out)
_PEER_GAUGES: tuple[tuple[str, str, Callable[[PeerSample, int], float | None]], ...] = (
    ("fieldsync_peer_log_sent_offset",
     "Offset in this site's log of the last commit covered by a data message to the peer handed to the "
     "outbound queue (log_sent).",
     lambda peer, end: peer.log_sent),
    ("fieldsync_peer_confirm_sent_offset",
     "Offset in this site's log of the last commit the peer confirmed applying (confirm_sent).",
     lambda peer, end: peer.confirm_sent),
    ("fieldsync_peer_log_received_offset",
     "Offset in the peer's log of the last commit applied here (log_received).",
     lambda peer, end: peer.log_received),
    ("fieldsync_peer_send_lag_offsets",
     "This site's log end minus the peer's horizon (docs/protocol.md rule 8: confirm_sent, or all the log read "
     "for the peer once it confirmed all it was sent): how far the peer holds the log back.",
     lambda peer, end: max(0, end - peer.horizon)),
    ("fieldsync_peer_receive_lag_offsets",
     "The most the peer said it sent minus log_received: what is on its way or missing. Only the agent knows "
     "what the peer said: absent until the agent has opened.",
     lambda peer, end: None if peer.peer_log_sent is None or peer.state_log_received is None
     else max(0, peer.peer_log_sent - peer.state_log_received)),
    ("fieldsync_peer_last_received_timestamp_seconds",
     "When a data message from the peer was last applied (Unix time); absent before the first, and again "
     "once the peer is extracted again.",
     lambda peer, end: peer.last_received_at),
    ("fieldsync_peer_last_heard_timestamp_seconds",
     "When a message of the peer, data or control (a confirmation, a heartbeat), last arrived (Unix time); "
     "absent before the first, and again once the peer is extracted again.",
     lambda peer, end: peer.heard_at),
    ("fieldsync_peer_last_sent_timestamp_seconds",
     "When a message file to the peer, data or control, was last sent: data queued, or any file a transport "
     "accepted (Unix time); absent before the first, and again once the peer is extracted again.",
     lambda peer, end: peer.last_sent_at),
    ("fieldsync_peer_created_timestamp_seconds",
     "When the peer's remote-user row was made (Unix time); extracting the peer again does not move it.",
     lambda peer, end: peer.created_at),
    ("fieldsync_peer_inbound_queue_messages",
     "Data messages from the peer queued in the spool, not yet applied.",
     lambda peer, end: peer.inbound),
    ("fieldsync_peer_outbound_queue_messages",
     "Message files to the peer, data and control, queued in the spool, not yet accepted by a transport.",
     lambda peer, end: peer.outbound),
    ("fieldsync_peer_quarantined_files", "Files from the peer in the quarantine.",
     lambda peer, end: peer.quarantined),
    ("fieldsync_peer_conflicts", "Conflicts recorded applying the peer's messages (rows of fieldsync_conflict).",
     lambda peer, end: peer.conflicts),
    ("fieldsync_peer_apply_errors",
     "Apply errors recorded for the peer's messages (rows of fieldsync_apply_error), acknowledged ones included.",
     lambda peer, end: peer.apply_errors),
    ("fieldsync_peer_in_error", IN_ERROR_HELP, lambda peer, end: int(peer.in_error)),
    ("fieldsync_peer_schema_version",
     "The schema version the peer reported in its control messages: the offset in the consolidated's log of the "
     "last schema change applied there; absent until the peer reports one.",
     lambda peer, end: peer.schema_version),
    ("fieldsync_peer_schema_current",
     "1 when the peer (a remote) runs the consolidated's schema of now: it reported the consolidated's schema "
     "version, or confirmed all it was sent of the log through it (a change that does not reach it leaves its "
     "own version behind); 0 when not; absent at a remote, and while the consolidated has made no schema change.",
     lambda peer, end: None if peer.schema_current is None else int(peer.schema_current)),
)

# (suffix, field of a RunSample, help with {when}: "in the last batch run" or "since the agent started")
_RUN_COUNTS: tuple[tuple[str, str, str], ...] = (
    ("received_files", "received",
     "Message files of peers, data and control, received {when} (not those set aside in the quarantine)."),
    ("applied_messages", "applied_messages", "Data messages from peers applied {when}."),
    ("sent_files", "sent", "Message files, data and control, a transport accepted {when}."),
    ("quarantined_files", "quarantined",
     "Files set aside in the quarantine {when}: refused on receipt, or queued messages that can never be applied."),
    ("resend_requests", "resend_requests", "Resend requests to peers queued {when}."),
    ("transport_errors", "transport_errors",
     "Transport errors met {when}, repeats included: a transport failed receiving or sending, or a peer had no "
     "address."),
    ("local_errors", "local_errors",
     "Local errors met {when}, repeats included: applying messages, preparing messages or a Spark batch failed "
     "on this site's side."),
    ("stopped_streams", "stopped_streams",
     "Stopped streams met {when}, repeats included: a peer's incarnation changed, or this site was restored "
     "from an older copy."),
)


def families(snapshot: Snapshot) -> list[Metric]:
    """The metric families of ``snapshot``; every sample has the label ``site``."""
    site = [snapshot.site]
    out: list[Metric] = []

    def gauge(name: str, documentation: str, value: float | None) -> None:
        family = GaugeMetricFamily(name, documentation, labels=["site"])
        if value is not None:  # None: the family without a sample (its HELP still says what it means)
            family.add_metric(site, value)
        out.append(family)

    gauge("fieldsync_log_end_offset", "Offset of the last commit in this site's log.", snapshot.log_end)
    gauge("fieldsync_peers", "Remote users (peers) of this site.", len(snapshot.peers))
    gauge("fieldsync_quarantine_files",
          "Files in the quarantine, as agent inbox lists them: from peers and from senders that are no peer.",
          snapshot.quarantine_files)
    gauge("fieldsync_conflicts", "Conflicts recorded (rows of fieldsync_conflict).", snapshot.conflicts)
    gauge("fieldsync_apply_errors", "Apply errors recorded (rows of fieldsync_apply_error), acknowledged ones "
          "included.", snapshot.apply_errors)
    gauge("fieldsync_schema_version", "This site's schema version: the offset of the last schema change made "
          "here (the consolidated) or applied here (a remote, in the consolidated's log); absent while there is "
          "none.", snapshot.schema_version)
    for name, documentation, value_of in _PEER_GAUGES:
        family = GaugeMetricFamily(name, documentation, labels=["site", "peer"])
        for peer in snapshot.peers:
            value = value_of(peer, snapshot.log_end)
            if value is not None:
                family.add_metric([snapshot.site, peer.name], value)
        out.append(family)
    run = snapshot.run
    if run is None:
        return out
    if run.mode == "batch":
        gauge("fieldsync_last_run_start_timestamp_seconds", "When the last batch run started (Unix time).",
              run.started_at)
        if run.ended_at is not None:
            gauge("fieldsync_last_run_end_timestamp_seconds", "When the last batch run ended (Unix time).",
                  run.ended_at)
            gauge("fieldsync_last_run_duration_seconds", "How long the last batch run took, in seconds.",
                  run.ended_at - run.started_at)
        gauge("fieldsync_last_run_success",
              "1 when the last batch run met no transport error, no local error and no stopped stream (exit code "
              "0), else 0.",
              1 if run.ok else 0)
        for suffix, field, documentation in _RUN_COUNTS:
            gauge(f"fieldsync_last_run_{suffix}", documentation.format(when="in the last batch run"),
                  getattr(run, field))
    else:
        gauge("fieldsync_agent_start_timestamp_seconds", "When the continuous agent started (Unix time).",
              run.started_at)
        for suffix, field, documentation in _RUN_COUNTS:
            family = CounterMetricFamily(f"fieldsync_{suffix}", documentation.format(when="since the agent started"),
                                         labels=["site"])
            family.add_metric(site, getattr(run, field))
            out.append(family)
    return out


# -- the edges: a file and an endpoint ---------------------------------------------------------


def write_metrics_file(metrics: SiteMetrics, path: Path) -> None:
    """Write the metrics to ``path`` for node_exporter's textfile collector:
    a temporary file in the same folder, fsynced, then renamed over
    ``path``, so the collector never reads half a file (0644: the exporter
    runs as another user)."""
    from prometheus_client import generate_latest

    from codec.atomic import write_file_atomically

    write_file_atomically(path, generate_latest(metrics.registry()), mode=0o644)


@contextlib.contextmanager
def rewriting(metrics: SiteMetrics, path: Path, every: float) -> Iterator[None]:
    """Rewrite the metrics file every ``every`` seconds in a thread of its
    own while the block runs, and once more when it ends without an error.
    A write that fails is logged and tried again at the next turn."""
    stop = threading.Event()

    def write() -> None:
        try:
            write_metrics_file(metrics, path)
        except (OSError, MetricsError) as error:
            log.warning("metrics file %s not written: %s", path, error)

    def turns() -> None:
        while not stop.wait(every):
            write()

    thread = threading.Thread(target=turns, name="fieldsync-metrics-file", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()
    write()


@contextlib.contextmanager
def serving(metrics: SiteMetrics, address: str, port: int) -> Iterator[str]:
    """Serve the metrics over HTTP at ``address:port`` (prometheus_client's
    server, in its own thread) while the block runs; yields the URL."""
    from prometheus_client import start_http_server

    try:
        server, thread = start_http_server(port, address, registry=metrics.registry())
    except OSError as error:
        raise MetricsError(f"cannot serve metrics on {address} port {port}: {error.strerror or error}; "
                           "is another agent or program listening there? choose another --metrics-port") from None
    host = f"[{address}]" if ":" in address else address
    try:
        yield f"http://{host}:{server.server_port}/metrics"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
