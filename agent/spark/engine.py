"""Running one Spark batch for the agent: export, ``spark-submit``, take-over
(docs/spark.md, "When the agent uses it" and "The pipeline").

Rules of this file:
* Blocking throughout (files, a child process): the runner calls
  :func:`run_spark_batch` through ``asyncio.to_thread``.
* Each batch has its own job folder ``job-<site>.*`` under the work folder
  (a folder on this machine, never a URI), holding the export, the job's
  output and its log.  The
  folder is deleted when the batch fails and, after the files are queued,
  by :meth:`SparkBatch.close`: nothing of a job outlives it.  A folder left
  by a killed agent is deleted by the site's next batch.
* The site's secret key stays in its key file: the job's driver, a child
  of this process in client mode, reads it there (``--keys``).
* ``spark-submit`` is found, and given ``SPARK_HOME`` and this Python, the
  same way with or without an activated virtual environment.
* ``spark-submit`` starts in a session of its own, so that the JVM and the
  Python processes it starts can be stopped together; the wait on it polls,
  so that the timeout, the cancel event and an exception in the waiting
  thread all stop that whole process group before the folder is deleted.
* Every failure is one :class:`SparkBatchError` line: the job's own error
  line when it printed one, else the last line it printed, else the
  exception of the step that failed.
"""

from __future__ import annotations

import importlib.util
import logging
import math
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable

from codec.keys import SiteKeys
from codec.message import DATA_VERSION

from ..errors import UsageError, describe_error
from ..keyfiles import key_path
from ..site import Site
from .errors import SparkBatchCancelled, SparkBatchError
from ..outbound import BatchSend
from .export import export_batch
from .policy import ENGINES, uses_spark
from .take import Sender, TakenFile, take_output

log = logging.getLogger("fieldsync.agent.spark")

# docs/spark.md, "When the agent uses it": the threshold of --engine auto
# when none is given, from the figures benchmarks.spark_batches measured
# (50 subscribers, the export and the job on local[2]), each per backlog
# offset (one log offset sent to one subscriber).  Spark wins from the
# backlog where what it saves pays for its startup:
#     threshold = STARTUP_S / (AGENT - EXPORT - JOB_CORE / cores)
# and never when the parenthesis is not positive.
# Medians of two runs on a 2-core machine (docs/spark.md, "Figures"): the
# agent 14.3 µs, the export 3.6 µs, the job 15.8 µs x 2 cores per log
# offset sent to 50 subscribers; spark-submit 22.3 s beyond the job.
AGENT_US_PER_OFFSET = 0.287
EXPORT_US_PER_OFFSET = 0.073
JOB_CORE_US_PER_OFFSET = 0.632
STARTUP_S = 22.3
# The cores of a cluster job when its settings do not say (spark.cores.max,
# or spark.executor.instances x spark.executor.cores).
DEFAULT_CLUSTER_CORES = 8


def cluster_threshold(cores: int) -> int | None:
    """The backlog from which a job on ``cores`` cores beats the agent's own
    path, startup included (the formula above); None: never."""
    gain = AGENT_US_PER_OFFSET - EXPORT_US_PER_OFFSET - JOB_CORE_US_PER_OFFSET / max(1, cores)
    return None if gain <= 0 else math.ceil(STARTUP_S * 1e6 / gain)


_LOCAL_MASTERS = ("local", "local-cluster")
# docs/spark.md, "A job that hangs, and stopping the agent": far above any
# batch measured (the largest, 100,000,000 offsets, took under a minute),
# short enough that a hung job holds the site's sends (and receives) for
# an hour at most.
DEFAULT_TIMEOUT = 3600.0
# docs/spark.md, "On a cluster": how long a cluster has to give the job an
# executor.  A job that asks more memory or cores than any worker has waits
# for ever otherwise, holding the site's sends (and, in continuous mode, its
# receives); executors of a free cluster come within seconds.
DEFAULT_EXECUTOR_WAIT = 120.0
_POLL_SECONDS = 0.2  # how soon the wait sees the job end, or a cancel event it does not wait on
# SIGTERM first: the JVM's shutdown hooks stop the Spark context (on a
# cluster, its executors) and delete Spark's temporary folders.
_STOP_GRACE_SECONDS = 10.0
_GONE_WAIT_SECONDS = 2.0  # after SIGKILL, for the group's last processes to go
_PYTHON_CONF = "spark.pyspark.python"
_DRIVER_PYTHON_CONF = "spark.pyspark.driver.python"
_DEPLOY_MODE_CONF = "spark.submit.deployMode"
# What contrib/spark/job.py prints (to stderr, which spark-submit passes on
# to its stdout for a Python application) when it fails.
_FAILURE_MARK = "fieldsync batch job failed:"
_LOG_TAIL = 64 * 1024


@dataclass(frozen=True, slots=True)
class SparkOptions:
    """How ``agent run`` uses Spark for large outbound batches.

    ``threshold`` is the backlog from which ``auto`` uses Spark; None is the
    default for the master (:meth:`auto_threshold`).  ``work`` defaults to
    ``<db>.agent/spark``; ``conf`` pairs go to
    ``spark-submit --conf``; ``submit`` is the launcher (default:
    ``spark-submit`` next to this Python, else on ``PATH``); ``job_args``
    are added to the job's command line (tests: ``--fail-after-files N``).
    ``timeout`` is how many seconds the job (``spark-submit``) may run, None
    for no limit; ``executor_wait`` how many seconds a cluster has to give
    it an executor (None: no limit).  Setting ``cancel`` stops a running job and keeps a new
    one from starting: the agent's owner sets it when the agent stops.
    """

    engine: str = "auto"
    threshold: int | None = None
    master: str = "local[*]"
    work: Path | None = None
    conf: tuple[tuple[str, str], ...] = ()
    submit: str | None = None
    job_args: tuple[str, ...] = ()
    timeout: float | None = DEFAULT_TIMEOUT
    executor_wait: float | None = DEFAULT_EXECUTOR_WAIT
    cancel: threading.Event | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.engine not in ENGINES:
            raise UsageError(f"engine {self.engine!r} is not one of {', '.join(ENGINES)}")
        if self.threshold is not None and (type(self.threshold) is not int or self.threshold < 0):
            raise UsageError(f"the Spark threshold must be a whole number of log offsets >= 0, "
                             f"got {self.threshold!r}")
        if not self.master or self.master != self.master.strip():
            raise UsageError(f"Spark master {self.master!r}: give a URL such as local[*] or spark://host:7077")
        for pair in self.conf:
            if (len(pair) != 2 or not all(isinstance(part, str) for part in pair) or not pair[0]
                    or pair[0] != pair[0].strip() or "=" in pair[0]):
                raise UsageError(f"Spark setting {pair!r}: write KEY=VALUE, e.g. spark.executor.memory=4g")
        if self.timeout is not None and (isinstance(self.timeout, bool) or not isinstance(self.timeout, (int, float))
                                         or not 0 < self.timeout < math.inf):
            raise UsageError(f"the Spark timeout must be a number of seconds > 0, or none for no limit, "
                             f"got {self.timeout!r}")
        if self.executor_wait is not None and (isinstance(self.executor_wait, bool)
                                               or not isinstance(self.executor_wait, (int, float))
                                               or not 0 < self.executor_wait < math.inf):
            raise UsageError(f"the Spark executor wait must be a number of seconds > 0, or none for no limit, "
                             f"got {self.executor_wait!r}")
        if any(key == _DEPLOY_MODE_CONF and value.strip() != "client" for key, value in self.conf):
            raise UsageError(f"--spark-conf {_DEPLOY_MODE_CONF}: the job runs in client mode, its driver on this "
                             "machine with the site's key and the export; leave the setting out")
        if self.cancel is not None and not isinstance(self.cancel, threading.Event):
            raise UsageError(f"the Spark cancel event must be a threading.Event, got {self.cancel!r}")
        if self.work is not None:
            object.__setattr__(self, "work", work_folder(self.work))

    @property
    def local_master(self) -> bool:
        """Whether the job runs on this machine (``local``, ``local[N]``,
        ``local-cluster[...]``) rather than on a cluster."""
        return self.master.split("[", 1)[0] in _LOCAL_MASTERS

    def auto_threshold(self) -> int | None:
        """The backlog from which ``auto`` uses Spark: the one given, else
        :func:`cluster_threshold` of the job's cores with a cluster master,
        and None (never) with a local one: there the agent's own path runs
        on the same cores."""
        if self.threshold is not None:
            return self.threshold
        return None if self.local_master else cluster_threshold(self.cores)

    @property
    def cores(self) -> int:
        """The cores the job's settings give it on a cluster:
        ``spark.cores.max``, else ``spark.executor.instances`` x
        ``spark.executor.cores``, else :data:`DEFAULT_CLUSTER_CORES`."""
        conf = dict(self.conf)
        total = conf.get("spark.cores.max", "").strip()
        if total.isdigit() and int(total) > 0:
            return int(total)
        instances = conf.get("spark.executor.instances", "").strip()
        each = conf.get("spark.executor.cores", "1").strip()
        if instances.isdigit() and each.isdigit() and int(instances) * int(each) > 0:
            return int(instances) * int(each)
        return DEFAULT_CLUSTER_CORES

    def uses_spark(self, backlog: int) -> bool:
        """Whether a send phase with this backlog (log offsets) goes to Spark
        (agent.spark.policy); ``auto`` stays local when PySpark is not installed."""
        return uses_spark(self.engine, backlog, self.auto_threshold(), spark_installed)


def work_folder(value: str | os.PathLike[str]) -> Path:
    """``--spark-work``: a folder on this machine.  A URI (``s3a://``,
    ``hdfs://``, ``file://``) is refused: the job needs no storage shared
    with the cluster, and a path would silently make a local folder of it."""
    text = os.fspath(value)
    scheme, separator, _ = text.partition("://")
    if separator and scheme and all(character.isalnum() or character in "+-." for character in scheme):
        raise UsageError(f"{text}: the Spark work folder is a folder on this machine (the export "
                         "reaches the executors through Spark and the files come back to the driver here); "
                         "give a local path")
    return Path(text)


def spark_installed() -> bool:
    """PySpark and pyarrow can be imported by this Python (the job's driver
    and workers run on it, and the export writes Parquet with pyarrow)."""
    return all(importlib.util.find_spec(name) is not None for name in ("pyspark", "pyarrow"))


class SparkBatch:
    """The checked files of a finished job, per subscriber in queue order.
    ``close()`` (or leaving the ``with`` block) deletes the job folder."""

    def __init__(self, directory: Path, files: dict[str, list[TakenFile]]) -> None:
        self.directory = directory
        self.files = files

    def close(self) -> None:
        _remove(self.directory)

    def __enter__(self) -> "SparkBatch":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def run_spark_batch(db: Site, keys: SiteKeys, sends: Iterable[BatchSend], *, max_size: int,
                    version: int = DATA_VERSION,
                    options: SparkOptions, work: Path, stop: threading.Event | None = None,
                    key_file: Path | None = None) -> SparkBatch:
    """Export ``sends``, run the job on ``options.master`` and check its
    output; raise :class:`SparkBatchError` (with the job folder deleted)
    when anything fails, :class:`SparkBatchCancelled` when
    ``options.cancel`` or ``stop`` was set.  ``stop`` is this batch's own:
    setting it stops this batch and leaves ``options.cancel`` as it is, for
    the batches that follow.  The job's driver reads the site's key from
    ``key_file`` (default: ``<db>.agent/keys/site.key``, where ``keys``
    came from); nothing of it is written anywhere."""
    sends = list(sends)
    # The wait on the job blocks on the last: the owner's, which stops the agent.
    cancels = tuple(event for event in (stop, options.cancel) if event is not None)
    _check_cancel(cancels)
    if not spark_installed():
        raise SparkBatchError("PySpark is not installed in this Python; install the Spark extra "
                              "(pip install 'fieldsync[spark]') or run with --engine local")
    command = _submit_command(options, Path(os.path.abspath(key_file or key_path(db.path))))
    work = Path(os.path.abspath(work))  # the job runs in its own folder: relative paths would miss
    prefix = f"job-{db.identity.name}."  # site names hold no dot
    try:
        work.mkdir(parents=True, exist_ok=True)
        _remove_stale(work, prefix)
        directory = Path(tempfile.mkdtemp(prefix=prefix + time.strftime("%Y%m%dT%H%M%S-"), dir=work))
    except OSError as error:
        raise SparkBatchError(f"cannot make a job folder in {work}: {describe_error(error)}") from None
    try:
        started = time.monotonic()
        export = directory / "export"
        output = directory / "output"
        summary = export_batch(db, sends, export, max_size=max_size, version=version,
                               check_stop=lambda: _check_cancel(cancels))
        log.info("Spark batch %s: %d sends, log offsets (%d, %d], %d capture rows exported; running the job on %s",
                 directory.name, len(sends), *summary.range, summary.rows, options.master)
        _check_cancel(cancels)
        _run_job(command + [os.fspath(export), os.fspath(output), *options.job_args], directory, options, cancels)
        identity = db.identity
        files = take_output(output, sends, Sender(identity.name, keys.public, identity.incarnation))
        _check_cancel(cancels)  # a caller that has stopped waiting would never close the batch
        log.info("Spark batch %s: %d message files checked in %.1f s", directory.name,
                 sum(len(found) for found in files.values()), time.monotonic() - started)
        return SparkBatch(directory, files)
    except BaseException as error:
        _remove(directory)
        if isinstance(error, SparkBatchError) or not isinstance(error, Exception):
            raise
        # The Spark path is an optional acceleration: whatever broke in it
        # is reported as its failure (with --engine auto the agent then packs
        # the sends itself) instead of stopping the agent.
        log.debug("Spark batch failed", exc_info=True)
        raise SparkBatchError(describe_error(error)) from error


def _check_cancel(cancels: tuple[threading.Event, ...]) -> None:
    if any(event.is_set() for event in cancels):
        raise SparkBatchCancelled("the Spark batch was cancelled because the agent is stopping; "
                                  "nothing of it was kept")


def _submit_command(options: SparkOptions, key_file: Path) -> list[str]:
    if options.submit is None:
        submit = _default_submit()
        if submit is None:
            raise SparkBatchError("spark-submit was found neither in the PySpark of this Python, nor next to "
                                  "this Python, nor on PATH; give its path with --spark-submit")
    else:
        submit = _given_submit(options.submit)
    # The job runs in its own folder, where a relative launcher path would
    # name nothing (Popen looks for it relative to ``cwd``).
    submit = os.path.abspath(submit)
    job = importlib.util.find_spec("contrib.spark.job")
    if job is None or job.origin is None:
        raise SparkBatchError("the Spark job (contrib/spark/job.py) is not installed with this agent")
    conf = dict(options.conf)
    # The driver runs here, on this Python (it imports fieldsync and reads
    # the key); the executors' Python is the one given, else this one too.
    conf.setdefault(_PYTHON_CONF, sys.executable)
    conf.setdefault(_DRIVER_PYTHON_CONF, sys.executable)
    command = [submit, "--master", options.master, "--deploy-mode", "client"]
    for key, value in conf.items():
        command += ["--conf", f"{key}={value}"]
    command += [job.origin, "--keys", os.fspath(key_file)]
    if options.executor_wait is not None:
        command += ["--executor-wait", _seconds(options.executor_wait)]
    return command


def spark_home() -> str | None:
    """The Spark of this Python's PySpark (a pip-installed PySpark carries
    its own ``bin/`` and jars), None when it has none."""
    spec = importlib.util.find_spec("pyspark")
    if spec is None or spec.origin is None:
        return None
    home = Path(spec.origin).parent
    return os.fspath(home) if (home / "bin" / "spark-submit").is_file() else None


def _given_submit(submit: str) -> str:
    """``--spark-submit``: a path (with a folder in it) is taken as it is, a
    bare name is looked for on ``PATH``, as a shell does."""
    found = shutil.which(submit)
    if found is not None:
        return found
    if os.path.dirname(submit) == "":
        raise SparkBatchError(f"the Spark launcher {submit} was not found on PATH; "
                              "give its path with --spark-submit")
    if not os.path.exists(submit):
        raise SparkBatchError(f"the Spark launcher {submit} does not exist; check --spark-submit")
    raise SparkBatchError(f"the Spark launcher {submit} cannot be run (it is not an executable file); "
                          "check --spark-submit")


def _default_submit() -> str | None:
    """The launcher of this Python's PySpark, else the one next to this
    Python, else the one on ``PATH``: found the same way whether a virtual
    environment is activated or not (a systemd unit runs the agent by its
    full path)."""
    home = spark_home()
    for candidate in ([Path(home) / "bin" / "spark-submit"] if home else []) + [Path(sys.executable).parent / "spark-submit"]:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return os.fspath(candidate)
    return shutil.which("spark-submit")


def _job_environment() -> dict[str, str]:
    """``spark-submit``'s environment: ``SPARK_HOME`` of this Python's
    PySpark (pip's launcher otherwise looks for it with whatever ``python3``
    is on ``PATH``, and fails with ``/bin/spark-class: No such file``
    outside the virtual environment) unless one is set, and this Python for
    the driver."""
    env = dict(os.environ)
    home = spark_home()
    if home is not None and not env.get("SPARK_HOME"):
        env["SPARK_HOME"] = home
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    return env


def _run_job(command: list[str], directory: Path, options: SparkOptions, cancels: tuple[threading.Event, ...]) -> None:
    """Run the job with its output (stdout and stderr) in ``directory/job.log``,
    within ``options.timeout``; stop it when one of ``cancels`` is set or the
    wait is interrupted (KeyboardInterrupt in the main thread)."""
    env = _job_environment()
    log_path = directory / "job.log"
    with open(log_path, "wb") as job_log:
        try:
            # The job's folder is its working folder: whatever Spark leaves
            # there (a warehouse folder, say) goes with it.  A session of its
            # own: a Ctrl-C at the agent's terminal reaches the agent only,
            # which then stops the whole job itself.
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=job_log, stderr=subprocess.STDOUT,
                                       cwd=directory, env=env, start_new_session=True)
        except OSError as error:
            reason = error.strerror or str(error)
            if isinstance(error, FileNotFoundError) and os.path.exists(command[0]):
                reason = "the interpreter its first line (#!) names does not exist"
            raise SparkBatchError(f"cannot start the Spark launcher {command[0]}: {reason}; "
                                  "check --spark-submit") from None
        log.debug("Spark batch %s: spark-submit started, process group %d", directory.name, process.pid)
        try:
            returncode = _wait_job(process, options, cancels)
        except BaseException:  # cancelled, or interrupted in this thread
            _stop_job(process)
            raise
        if returncode is None:
            _stop_job(process)
    if returncode is None:
        lines = _log_tail(log_path)
        for line in lines[-20:]:
            log.debug("job: %s", line)
        last = f" (its last line: {lines[-1]})" if lines else ""
        raise SparkBatchError(f"the Spark job ran over its {_seconds(options.timeout or 0)} s timeout and was "
                              f"stopped{last}; give it longer with --spark-timeout (0: no limit)")
    if returncode != 0:
        lines = _log_tail(log_path)
        for line in lines[-20:]:
            log.debug("job: %s", line)
        raise SparkBatchError(_failure_line(lines, returncode))


def _wait_job(process: subprocess.Popen, options: SparkOptions, cancels: tuple[threading.Event, ...]) -> int | None:
    """The job's exit code, or None when it runs over ``options.timeout``;
    :class:`SparkBatchCancelled` when one of ``cancels`` is set (the last
    one is seen at once, the others within a poll).  The job is left
    running: the caller stops it."""
    deadline = None if options.timeout is None else time.monotonic() + options.timeout
    while True:
        returncode = process.poll()
        if returncode is not None:
            return returncode
        _check_cancel(cancels)
        pause = _POLL_SECONDS
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            pause = min(pause, left)
        if cancels:
            cancels[-1].wait(pause)
        else:
            time.sleep(pause)


def _stop_job(process: subprocess.Popen) -> None:
    """Stop ``spark-submit`` and every process of its group (the JVM is the
    launcher's own process; the job's Python driver is its child): SIGTERM,
    SIGKILL after a grace period, then a short wait for the group to go."""
    group = process.pid  # the leader of its own session and group
    if process.poll() is None:
        if not _signal_group(group, signal.SIGTERM):
            process.terminate()
        try:
            process.wait(_STOP_GRACE_SECONDS)
        except subprocess.TimeoutExpired:
            pass
    # Whatever is left of the group (a Python driver that outlived the
    # JVM, a child that ignores SIGTERM) goes now.
    _signal_group(group, signal.SIGKILL)
    if process.poll() is None:
        process.kill()
    process.wait()
    deadline = time.monotonic() + _GONE_WAIT_SECONDS
    while _signal_group(group, 0) and time.monotonic() < deadline:
        time.sleep(0.02)
    log.info("stopped the Spark job (process group %d)", group)


def _signal_group(group: int, signum: int) -> bool:
    """Send ``signum`` to the process group; False when it has no process left."""
    try:
        os.killpg(group, signum)
    except ProcessLookupError:
        return False
    except PermissionError:  # a process of the group changed its user: nothing more to do
        return False
    return True


def _seconds(value: float) -> str:
    """``3600``, ``1000000``, ``2.5``: as a user would write it."""
    return str(int(value)) if value == int(value) else str(value)


def _log_tail(path: Path) -> list[str]:
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - _LOG_TAIL))
        text = handle.read().decode("utf-8", "replace")
    return [line.rstrip() for line in text.splitlines() if line.strip()]


def _failure_line(lines: list[str], returncode: int) -> str:
    """The job's own error line, else its last line.  For an error raised in
    a Python worker the job's line ends at ``...from the Python worker:``;
    the worker's exception line, printed before it, is added then."""
    marked = [index for index, line in enumerate(lines) if line.startswith(_FAILURE_MARK)]
    if not marked:
        return f"the Spark job failed (exit code {returncode}): {lines[-1] if lines else 'it printed nothing'}"
    index = marked[-1]
    line = lines[index]
    if line.startswith(f"{_FAILURE_MARK} NoExecutors: "):
        return (f"{line}: no worker has the cores and memory the job asks (spark.executor.cores, "
                "spark.executor.memory) or none is free; check the cluster, or give it longer with "
                "--spark-executor-wait (0: no limit)")
    if line.endswith(":"):
        cause = next((earlier.strip() for earlier in reversed(lines[:index])
                      if _is_exception_line(earlier.strip())), None)
        if cause is not None:
            line = f"{line} {cause}"
    return line


def _is_exception_line(line: str) -> bool:
    name, colon, _ = line.partition(": ")
    return bool(colon) and name.isidentifier() and name.endswith(("Error", "Exception"))


def _remove_stale(work: Path, prefix: str) -> None:
    """Delete this site's job folders left by an agent that was killed
    between a job and the take-over (they hold the site's secret key).  Only
    one agent runs per site (the spool is locked), so none is in use; other
    sites sharing the work folder have other prefixes."""
    for stale in work.glob(prefix + "*"):
        if stale.is_dir():
            log.warning("deleting the Spark job folder %s left by an earlier run", stale)
            _remove(stale)


def _remove(directory: Path) -> None:
    try:
        shutil.rmtree(directory)
    except FileNotFoundError:
        pass
    except OSError as error:
        log.warning("could not delete the Spark job folder %s: %s", directory, describe_error(error))
