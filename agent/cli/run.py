"""``agent run`` (dbremote): receive, apply, send what is due, confirm.

Exit status: 0 when the run went well; 1 when it reported transport
errors or stopped streams (each printed as one line on stderr).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import ipaddress
import logging
import os
import signal
import threading
from pathlib import Path
from typing import Any, Callable, ContextManager, Coroutine, TypeVar

import click
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskProgressColumn, TextColumn, TimeElapsedColumn

from codec.errors import BadFileName
from codec.names import MessageName
from codec.packing import DEFAULT_MAX_SIZE, MAX_MAX_SIZE, MIN_MAX_SIZE

from ..errors import AgentError
from ..metrics import SiteMetrics, rewriting, serving, write_metrics_file
from ..pack_workers import PACK_WORKERS_FROM
from ..queues import MessageQueues, QueueDepth, Settled
from ..spark.engine import DEFAULT_EXECUTOR_WAIT, DEFAULT_TIMEOUT, ENGINES, SparkOptions, work_folder
from ..transport_options import TransportOptions
from . import escape_controls
from ._common import (ADDRESS, DATABASE, TRANSPORT, ByteSize, Duration, TransportOption, Whole, check_transports,
                      console, format_seconds, logging_to, open_site, show_progress)
from ._spool import open_queues

log = logging.getLogger("fieldsync.cli")
_T = TypeVar("_T")


class _ProgressQueues(MessageQueues):
    """Wraps the agent's queues and reports to progress bars as a large
    backlog is packed (by log offset) and handed to the transport (by file).
    Every call goes to the wrapped queues unchanged."""

    def __init__(self, inner: MessageQueues, progress: Progress) -> None:
        self.inner = inner
        self.progress = progress
        self.log_end: Callable[[], int] | None = None
        self._preparing: dict[str, tuple[Any, int, int]] = {}  # peer -> (task, first prev, end)
        self._prepared: dict[str, int] = {}  # peer -> data messages queued
        self._sending: dict[str, list[Any]] = {}  # peer -> [task, files sent, files to send]

    # -- reported ------------------------------------------------------------------------

    def put_outbound(self, peer: str, name: str, data: bytes, resend_count: int | None) -> None:
        self.inner.put_outbound(peer, name, data, resend_count)
        if resend_count is None:  # a control message
            return
        try:
            header = MessageName.parse(name).header
        except BadFileName:
            return
        entry = self._preparing.get(peer)
        if entry is None:
            end = max(self.log_end() if self.log_end else header.last, header.last)
            task = self.progress.add_task(f"preparing messages for {peer}", total=max(1, end - header.prev),
                                          count="")
            entry = self._preparing[peer] = (task, header.prev, end)
        task, first, end = entry
        self._prepared[peer] = self._prepared.get(peer, 0) + 1
        self.progress.update(task, completed=min(max(0, header.last - first), end - first),
                             count=f"{self._prepared[peer]} messages")

    def read_outbound(self, peer: str, name: str) -> bytes:
        if peer not in self._sending:
            total = len(self.inner.outbound(peer))
            task = self.progress.add_task(f"sending to {peer}", total=total, count=f"0/{total} files")
            self._sending[peer] = [task, 0, total]
        return self.inner.read_outbound(peer, name)

    def delete_outbound(self, peer: str, name: str) -> None:
        self.inner.delete_outbound(peer, name)
        entry = self._sending.get(peer)
        if entry is not None:
            entry[1] += 1
            self.progress.update(entry[0], completed=entry[1], count=f"{entry[1]}/{entry[2]} files")

    # -- passed through ------------------------------------------------------------------

    def put_inbound(self, peer: str, name: str, data: bytes) -> None:
        self.inner.put_inbound(peer, name, data)

    def inbound(self, peer: str) -> list[str]:
        return self.inner.inbound(peer)

    def read_inbound(self, peer: str, name: str) -> bytes:
        return self.inner.read_inbound(peer, name)

    def delete_inbound(self, peer: str, names: tuple[str, ...] | list[str]) -> None:
        self.inner.delete_inbound(peer, names)

    def outbound(self, peer: str) -> list[str]:
        return self.inner.outbound(peer)

    def purge_outbound(self, peer: str, below_resend_count: int) -> int:
        return self.inner.purge_outbound(peer, below_resend_count)

    def depths(self) -> list[QueueDepth]:
        return self.inner.depths()

    def begin_dequeue(self, peer: str, names: tuple[str, ...] | list[str], log_received: int) -> Any:
        return self.inner.begin_dequeue(peer, names, log_received)

    def commit_dequeue(self, token: Any) -> None:
        self.inner.commit_dequeue(token)

    def abort_dequeue(self, token: Any) -> None:
        self.inner.abort_dequeue(token)

    def resolve_in_doubt(self, peer: str, log_received: int) -> Settled:
        return self.inner.resolve_in_doubt(peer, log_received)

    def group_commit(self) -> ContextManager[None]:
        return self.inner.group_commit()

    def at_rest(self) -> None:
        self.inner.at_rest()

    def close(self) -> None:
        self.inner.close()

    @property
    def path(self) -> Path:  # type: ignore[override]
        return self.inner.path

    @property
    def last_restart(self) -> Any:  # type: ignore[override]
        return self.inner.last_restart

    @property
    def restart_problems(self) -> tuple[str, ...]:  # type: ignore[override]
        return self.inner.restart_problems


async def _run_once_with_progress(database: Path, options: "RunOptions", out: Console,  # noqa: F821
                                  on_open: Callable[[Any], None] | None = None) -> "RunReport":  # noqa: F821
    from ..runner import Agent

    # Packing advances by log offset (its share of the backlog), sending by file.
    columns = (TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(),
               TextColumn("{task.fields[count]}", markup=False), TimeElapsedColumn())
    with Progress(*columns, console=out, transient=True) as progress:
        queues = _ProgressQueues(open_queues(database), progress)
        async with Agent(database, options, batch=True, queues=queues) as agent:
            queues.log_end = agent.db.log_end
            if on_open is not None:
                on_open(agent)
            return await agent.run_once()


def _opened(then: Callable[[Any], None] | None) -> Callable[[Any], None]:
    """What the run does once its agent is open: the state it loaded (a
    pair for each of thousands of peers) lives as long as the run, so it is
    moved out of the cyclic garbage collector's way (``gc.freeze``), which
    would otherwise walk it again and again as the run makes and drops its
    short-lived objects (measured: 40% of a run at 10,000 peers).  This
    process is the command's own, so its collector is the command's to
    set; the run ends with ``gc.unfreeze``."""
    def opened(agent: Any) -> None:
        gc.freeze()
        if then is not None:
            then(agent)
    return opened


def _run_stopping_spark_jobs(run: Coroutine[Any, Any, _T], stopping: threading.Event) -> _T:
    """``asyncio.run(run)``, where Ctrl-C or SIGTERM set ``stopping`` and
    cancel the run, which then ends as interrupted (exit code 1).

    ``stopping`` is the Spark options' cancel event: a Spark job runs in a
    worker thread that cancelling the task does not reach, and is stopped
    (its processes killed, its folder deleted) when the event is set, before
    ``asyncio.run`` waits for that thread.  A second signal gets the
    default action again.  Continuous mode installs its own handlers once
    the agent is open (they stop it after the current step, and stop a
    running Spark job through the same event).
    """
    # Signals someone else handles (an application embedding the CLI) keep their handler.
    signals = [signum for signum in (signal.SIGINT, signal.SIGTERM)
               if signal.getsignal(signum) in (signal.default_int_handler, signal.SIG_DFL)]
    received: list[int] = []

    async def main() -> _T:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()

        def restore_handlers() -> None:
            for signum in signals:
                with contextlib.suppress(NotImplementedError, RuntimeError):
                    loop.remove_signal_handler(signum)

        def interrupted(signum: int) -> None:
            received.append(signum)
            stopping.set()
            task.cancel()
            restore_handlers()

        for signum in signals:
            with contextlib.suppress(NotImplementedError, RuntimeError):  # not the main thread
                loop.add_signal_handler(signum, interrupted, signum)
        try:
            return await run
        finally:
            stopping.set()  # a job still running in a thread stops; no new one starts
            restore_handlers()

    try:
        return asyncio.run(main())
    except asyncio.CancelledError:
        if received:
            raise KeyboardInterrupt from None  # "agent: interrupted", exit 1
        raise


def _one_line(text: str) -> str:
    """A problem's text on one line: its lines joined, and what control
    characters are left (in a file name, say) written as escapes."""
    return escape_controls(" ".join(text.split()))


class SparkConf(click.ParamType):
    """``KEY=VALUE`` for ``spark-submit --conf`` (``spark.executor.memory=4g``)."""

    name = "KEY=VALUE"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, str]:
        if isinstance(value, tuple):
            return value  # type: ignore[return-value]
        key, equals, text = str(value).partition("=")
        if not equals or not key or key != key.strip() or any(character.isspace() for character in key):
            self.fail(f"{value!r}: write KEY=VALUE, e.g. spark.executor.memory=4g", param, ctx)
        return key, text


class SparkWork(click.ParamType):
    """``--spark-work``: a folder on this machine, never a URI."""

    name = "DIR"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> Path:
        if isinstance(value, Path):
            return value
        try:
            return work_folder(str(value))
        except AgentError as error:
            self.fail(str(error), param, ctx)


class QuarantineLimit(click.ParamType):
    """``NAME=VALUE`` for one of the quarantine's caps (agent.quarantine)."""

    name = "NAME=VALUE"
    NAMES = {"peer-files": "peer_files", "peer-bytes": "peer_bytes", "total-files": "total_files",
             "total-bytes": "total_bytes"}

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> tuple[str, int]:
        if isinstance(value, tuple):
            return value  # type: ignore[return-value]
        key, equals, text = str(value).partition("=")
        field = self.NAMES.get(key.strip())
        if not equals or field is None:
            self.fail(f"{value!r}: write NAME=VALUE with NAME one of {', '.join(self.NAMES)}, e.g. peer-files=500",
                      param, ctx)
        if field.endswith("_bytes"):
            return field, ByteSize(minimum=1).convert(text, param, ctx)
        return field, Whole(min=1).convert(text, param, ctx)


class MetricsAddress(click.ParamType):
    """An IP address to serve the metrics on (``127.0.0.1``, ``::1``, ``0.0.0.0``)."""

    name = "ADDRESS"

    def convert(self, value: object, param: click.Parameter | None, ctx: click.Context | None) -> str:
        try:
            return str(ipaddress.ip_address(str(value)))
        except ValueError:
            self.fail(f"{value!r} is not an IP address; the default 127.0.0.1 serves this host only", param, ctx)


def _check_metrics_options(once: bool, metrics_file: Path | None, metrics_port: int | None,
                           metrics_address: str | None) -> None:
    """Usage errors (exit 2) of the metrics options, before anything runs;
    a folder this user cannot write to is an error (exit 1)."""
    if metrics_address is not None and metrics_port is None:
        raise click.UsageError("--metrics-address is where --metrics-port listens; give a port too, "
                               "e.g. --metrics-port 9817")
    if once and metrics_port is not None:
        raise click.UsageError("--metrics-port serves a continuous agent; a batch run (--once) writes its "
                               "metrics with --metrics-file PATH.prom")
    if metrics_file is None:
        return
    if metrics_file.suffix != ".prom":
        raise click.UsageError(f"--metrics-file {escape_controls(str(metrics_file))}: the name must end in "
                               ".prom, the files node_exporter's textfile collector reads")
    folder = metrics_file.parent
    if not folder.is_dir():
        raise click.UsageError(f"--metrics-file {escape_controls(str(metrics_file))}: there is no folder "
                               f"{escape_controls(str(folder))}; create it first (node_exporter's "
                               "--collector.textfile.directory)")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise AgentError(f"--metrics-file {metrics_file}: the folder {folder} is not writable by this user; "
                         "the file is written there by a rename")


@click.command()
@click.argument("database", type=DATABASE)
@click.option("--once", "-b", is_flag=True,
              help="Batch mode: receive, apply, send what is due, confirm, then exit (dbremote -b).")
@click.option("--transport", type=TRANSPORT, metavar="NAME", help="Transport plugin, e.g. folder, sftp, email, faults+folder "
              "(default: the site's own).")
@click.option("--address", type=ADDRESS, metavar="ADDRESS", help="This site's inbox address (default: the site's own).")
@click.option("--transport-option", "-O", "transport_options", multiple=True, type=TransportOption(),
              help="A setting NAME=VALUE of the site's own transport, or TRANSPORT.NAME=VALUE of one "
                   "transport or wrapper (sftp.key_file=..., faults.seed=7). Repeatable.")
@click.option("-l", "--max-message-size", type=ByteSize(MIN_MAX_SIZE, MAX_MAX_SIZE), default=DEFAULT_MAX_SIZE,
              show_default=True, metavar="BYTES", help=f"Largest message file ({MIN_MAX_SIZE} to {MAX_MAX_SIZE}; 48k works).")
@click.option("--message-format", type=click.Choice(["1", "2"]), default="2", show_default=True,
              help="Format version of the data messages written (docs/message-format.md): 1 while a peer "
                   "still runs a version of fieldsync that reads only version 1.")
@click.option("-g", "--group", type=Whole(min=1), default=20, show_default=True, metavar="N",
              help="Accepted for dbremote compatibility; no effect: consecutive messages apply in one transaction.")
@click.option("--receive-only", "-r", is_flag=True, help="Only receive and apply (dbremote -r).")
@click.option("--send-only", "-s", is_flag=True, help="Only scan the log, send and confirm (dbremote -s).")
@click.option("--keep", "-p", is_flag=True,
              help="Leave received files in the message system instead of deleting them (dbremote -p); "
                   "they are read again, and skipped, at every poll.")
@click.option("--patience", "-rp", type=Whole(min=1), default=1, show_default=True, metavar="POLLS",
              help="Polls a gap may last before a resend is requested (dbremote -rp).")
@click.option("--resend-urgency", "-ru", type=Duration(positive=False), metavar="DURATION",
              help="How long a resend request waits before it is acted on (dbremote -ru; "
                   "default: 0 with --once, else half the send delay).")
@click.option("--receive-delay", "-rd", type=Duration(), default="1m", show_default=True, metavar="DURATION",
              help="Continuous mode: poll the inbox this often (dbremote -rd).")
@click.option("--send-delay", "-sd", type=Duration(), default="1m", show_default=True, metavar="DURATION",
              help="Continuous mode: scan the log and send this often (dbremote -sd).")
@click.option("--heartbeat", type=Duration(), default="24h", show_default=True, metavar="DURATION",
              help="Send each peer a control message at least this often, even with no news, so a silent peer "
                   "is known to be alive (`remote set --heartbeat` sets it per remote).")
@click.option("--confirm-timeout", type=Duration(), metavar="DURATION",
              help="Probe a peer whose confirmation of sent data is still missing after this much silence to it, "
                   "doubling while nothing changes, up to the heartbeat: a lost confirmation or lost last message "
                   "is repaired within it (default: 1h, or the heartbeat when shorter; never above the "
                   "heartbeat; `remote set --confirm-timeout` sets it per remote).")
@click.option("--engine", type=click.Choice(ENGINES), default="auto", show_default=True,
              help="Who packs outbound batches: the agent (local), Spark (spark), or Spark from "
                   "--spark-threshold on (auto; local when PySpark is not installed).")
@click.option("--spark-threshold", type=Whole(min=0), metavar="N",
              help="Backlog (log offsets over the due sends) from which --engine auto uses Spark "
                   "(default with a cluster master: computed from the job's cores, docs/spark.md; with a local "
                   "one, none: auto packs locally).")
@click.option("--spark-master", default="local[*]", show_default=True, metavar="URL",
              help="Where the Spark job runs: local[2], spark://host:7077, ...")
@click.option("--spark-work", type=SparkWork(), metavar="DIR",
              help="Folder on this machine for the Spark job's export and output (default: <db>.agent/spark); "
                   "the cluster needs no access to it.")
@click.option("--spark-conf", "spark_conf", multiple=True, type=SparkConf(),
              help="A setting for spark-submit --conf, KEY=VALUE. Repeatable.")
@click.option("--spark-submit", metavar="PATH",
              help="The spark-submit to use (default: the one of this Python's PySpark, else the one next to "
                   "this Python, else on PATH).")
@click.option("--spark-timeout", type=Duration(positive=False), default=DEFAULT_TIMEOUT, metavar="DURATION",
              help="Stop a Spark job that runs longer, in seconds or 90s, 5m, 1h (default: 1h; 0: no limit); "
                   "its batch fails as a failed job does.")
@click.option("--spark-executor-wait", type=Duration(positive=False), default=DEFAULT_EXECUTOR_WAIT,
              metavar="DURATION",
              help="How long a cluster has to give the Spark job an executor (default: 2m; 0: no limit); "
                   "its batch fails as a failed job does.")
@click.option("--pack-workers", type=Whole(min=1), metavar="N",
              help="Processes that pack the sends of a send phase whose backlog reaches --pack-workers-from, "
                   "each a share of the peers (default: the cores this process may use, at most 8; 1: always in "
                   "the agent's process).")
@click.option("--pack-workers-from", type=Whole(min=0), default=PACK_WORKERS_FROM, show_default=True, metavar="N",
              help="Backlog (log offsets over the due sends) from which --pack-workers packs on workers.")
@click.option("--quarantine-limit", "quarantine_limits", multiple=True, type=QuarantineLimit(),
              help="A cap of the quarantine: peer-files, peer-bytes, total-files or total-bytes=VALUE "
                   "(defaults 1000, 64m, 10000, 512m); the oldest files go first. Repeatable.")
@click.option("--metrics-file", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH.prom",
              help="Write the metrics in Prometheus' text format to PATH.prom, atomically, at the end of a "
                   "batch run; a continuous agent rewrites it every poll (docs/metrics.md).")
@click.option("--metrics-port", type=Whole(min=1, max=65535), metavar="PORT",
              help="Continuous mode: serve the metrics over HTTP on this port (/metrics).")
@click.option("--metrics-address", type=MetricsAddress(), metavar="ADDRESS",
              help="The IP address --metrics-port listens on (default: 127.0.0.1, this host only).")
@click.option("-v", "--verbose", is_flag=True, help="Log debugging detail.")
@click.option("--log-file", "-o", type=click.Path(dir_okay=False, path_type=Path), metavar="PATH",
              help="Append the log to PATH as well as to stderr (dbremote -o).")
def run(database: Path, once: bool, transport: str | None, address: str | None, transport_options: tuple,
        max_message_size: int, message_format: str, group: int, receive_only: bool, send_only: bool, keep: bool, patience: int,
        resend_urgency: float | None, receive_delay: float, send_delay: float, heartbeat: float,
        confirm_timeout: float | None, engine: str, spark_threshold: int | None,
        spark_master: str, spark_work: Path | None, spark_conf: tuple, spark_submit: str | None,
        spark_timeout: float, spark_executor_wait: float, pack_workers: int | None, pack_workers_from: int,
        quarantine_limits: tuple, metrics_file: Path | None, metrics_port: int | None,
        metrics_address: str | None, verbose: bool, log_file: Path | None) -> int:
    """Run the message agent of the site in DATABASE.

    Without --once it runs until interrupted (Ctrl-C or SIGTERM stop it
    cleanly), polling the inbox every --receive-delay and scanning the log
    every --send-delay.  Durations are written 90, 90s, 5m or 1h.  With
    --once, Ctrl-C or SIGTERM interrupt the run (exit code 1), stopping a
    running Spark job.
    """
    from ..quarantine import QuarantineLimits
    from ..runner import RunOptions, run_agent

    if receive_only and send_only:
        raise click.UsageError("--receive-only and --send-only exclude each other; leave both out to do both")
    _check_metrics_options(once, metrics_file, metrics_port, metrics_address)
    stopping = threading.Event()
    spark = SparkOptions(engine=engine, threshold=spark_threshold, master=spark_master, work=spark_work,
                         conf=tuple(spark_conf), submit=spark_submit, timeout=spark_timeout or None,
                         executor_wait=spark_executor_wait or None,
                         cancel=stopping)
    link = TransportOptions.from_items(transport_options)
    try:
        limits = QuarantineLimits(**dict(quarantine_limits))
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    gc.freeze()  # what the imports made lives as long as the command (see _opened)
    with open_site(database) as site:
        own = transport or site.identity.transport or "folder"
        # The transports the run will use: its own, and each peer's (--transport: one for all).
        specs = [own, *(transport or named or "folder" for named in site.remote_transports())]
        stored = TransportOptions.from_stored(site.transport_options())
    check_transports(specs, link.over(stored), own=own)
    options = RunOptions(transport=transport, address=address, max_message_size=max_message_size,
                         message_format=int(message_format), group=group,
                         receive=not send_only, send=not receive_only, keep=keep, patience=patience,
                         resend_urgency=resend_urgency, receive_delay=receive_delay, send_delay=send_delay,
                         heartbeat=heartbeat, confirm_timeout=confirm_timeout,
                         transport_options=dict(link.plain), named_options={name: dict(values) for name, values in link.named.items()},
                         spark=spark, quarantine=limits, pack_workers_from=pack_workers_from,
                         **({} if pack_workers is None else {"pack_workers": pack_workers}))
    out = console()
    metrics = None
    if metrics_file is not None or metrics_port is not None:
        metrics = SiteMetrics(database, "batch" if once else "continuous")
    on_open = _opened(metrics.attach if metrics is not None else None)
    try:
        with logging_to(verbose=verbose, log_file=log_file, summarized=once):
            if once:
                log.debug("batch run of %s", database)
                if show_progress(out):
                    report = _run_stopping_spark_jobs(_run_once_with_progress(database, options, out, on_open),
                                                      stopping)
                else:
                    report = _run_stopping_spark_jobs(run_agent(database, options, once=True, on_open=on_open),
                                                      stopping)
            else:
                with contextlib.ExitStack() as metrics_edges:
                    if metrics is not None and metrics_file is not None:
                        # Every poll: the smaller delay is how often a step runs.
                        metrics_edges.enter_context(rewriting(metrics, metrics_file, min(receive_delay, send_delay)))

                    def started(agent: Any) -> None:
                        # Once the agent is open (its state loaded, a service
                        # manager's SIGTERM handled): serve the metrics, and say so.
                        on_open(agent)
                        if metrics is not None and metrics_port is not None:
                            url = metrics_edges.enter_context(
                                serving(metrics, metrics_address or "127.0.0.1", metrics_port))
                            log.info("metrics of %s at %s", database, url)
                        log.info("agent for %s running: receiving every %s, sending every %s; Ctrl-C stops it",
                                 database, format_seconds(receive_delay), format_seconds(send_delay))

                    report = _run_stopping_spark_jobs(run_agent(database, options, once=False, on_open=started),
                                                      stopping)
                log.info("agent for %s stopped", database)
    finally:
        gc.unfreeze()  # frozen when the agent opened (_opened)
    out.print(f"{database}: received {report.received} messages, applied {report.applied_messages}, "
              f"quarantined {report.quarantined}, sent {report.sent}, resend requests {report.resend_requests}",
              soft_wrap=True)
    for kind, plural, problems in (("transport error", "transport errors", report.transport_errors),
                                   ("local error", "local errors", report.local_errors),
                                   ("stream stopped", "stopped streams", report.stopped_streams)):
        for problem in problems:
            times = problems.counts[problem]
            click.echo(f"agent: {kind}: {_one_line(problem)}" + (f" ({times} times)" if times > 1 else ""), err=True)
        if problems.not_kept:
            click.echo(f"agent: {problems.not_kept} more {plural}, each in the log", err=True)
    if report.quarantined > 0:
        out.print(f"{report.quarantined} file(s) quarantined: see `agent inbox {database}`.", soft_wrap=True)
    if report.quarantine_dropped > 0:
        out.print(f"{report.quarantine_dropped} older quarantined file(s) were dropped to keep the quarantine "
                  "within its caps (docs/security.md).", soft_wrap=True)
    if report.left_in_inbox > 0:
        out.print(f"{report.left_in_inbox} file(s) in the inbox were left there unread (not for this site, or "
                  f"refused by the transport): see `agent inbox {database}`.", soft_wrap=True)
    if once and metrics is not None and metrics_file is not None:
        metrics.finish(report)
        write_metrics_file(metrics, metrics_file)  # after the summary: a failed write still shows what the run did
    # A continuous agent stopped by a signal stopped as asked: what went
    # wrong on the way is in the log as it happened, and listed above.
    return 0 if report.ok or not once else 1
