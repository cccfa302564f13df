"""What a run is asked to do (:class:`RunOptions`, dbremote's switches) and
what it did (:class:`RunReport`).

Rules of this file:
* Values only: no I/O.  Options are checked where they are made, so a
  run never starts with options it cannot honour.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from codec.errors import InvalidValue
from codec.message import DATA_VERSION, check_version
from codec.packing import DEFAULT_MAX_SIZE, check_max_size

from .errors import AgentError
from .pack_workers import PACK_WORKERS_FROM, default_workers
from .protocol import Settings
from .quarantine import QuarantineLimits
from .spark.engine import SparkOptions

# A log record a batch run's summary repeats as its own line (a transport
# error): the terminal shows it once, in the summary; a log file keeps it.
IN_SUMMARY = {"in_summary": True}

# Seconds of silence after which a stream with unconfirmed data is probed
# (rule 3), unless --confirm-timeout or the remote says otherwise.
DEFAULT_CONFIRM_TIMEOUT = 3600.0

@dataclass(frozen=True, slots=True)
class RunOptions:
    """How ``agent run`` behaves (dbremote's switches in brackets)."""

    transport: str | None = None  # default: the site's configured transport, else folder
    address: str | None = None  # this site's inbox address; default: the site's address
    max_message_size: int = DEFAULT_MAX_SIZE  # [-l]
    # The format version of the data messages written (docs/message-format.md):
    # 1 while some peer still runs a version that reads only version 1.
    message_format: int = DATA_VERSION
    group: int = 20  # [-g] accepted for compatibility: consecutive messages apply in one transaction (rule 2)
    receive: bool = True  # False: --send-only [-s]
    send: bool = True  # False: --receive-only [-r]
    patience: int = 1  # [-rp]
    resend_urgency: float | None = None  # [-ru]; default: half the send delay
    receive_delay: float = 60.0  # [-rd]
    send_delay: float = 60.0  # [-sd]
    heartbeat: float = 86400.0  # seconds: a control message to each peer at least this often (rule 3)
    # seconds: a stream with unconfirmed data is probed after this much
    # silence to the peer, doubling up to the heartbeat (rule 3); None:
    # DEFAULT_CONFIRM_TIMEOUT, or the heartbeat when that is shorter
    confirm_timeout: float | None = None
    seal: bool = True  # seal messages to the peer's X25519 key when it is known
    keep: bool = False  # [-p] received files stay in the message system (not acked)
    # -O NAME=VALUE, for the site's own transport (and others of its plugin)
    transport_options: dict[str, Any] = field(default_factory=dict)
    # -O PREFIX.NAME=VALUE, per transport or wrapper: {"sftp": {...}, "faults": {"seed": 7}}
    named_options: dict[str, dict[str, Any]] = field(default_factory=dict)
    spark: SparkOptions = field(default_factory=SparkOptions)  # large outbound batches (docs/spark.md)
    quarantine: QuarantineLimits = field(default_factory=QuarantineLimits)  # caps (docs/security.md)
    # Processes that pack a large send phase's sends (agent.pack_workers):
    # the cores this process may run on, at most 8, unless given; used from
    # a backlog of pack_workers_from log offsets over the due sends.
    pack_workers: int = field(default_factory=default_workers)
    pack_workers_from: int = PACK_WORKERS_FROM

    def __post_init__(self) -> None:
        check_max_size(self.max_message_size)
        try:
            check_version(self.message_format)
        except InvalidValue as error:
            raise AgentError(f"--message-format: {error}") from None
        if self.pack_workers < 1 or self.pack_workers_from < 0:
            raise AgentError("--pack-workers must be 1 or more")
        if not (self.receive or self.send):
            raise AgentError("--receive-only and --send-only exclude each other")
        if self.receive_delay <= 0 or self.send_delay <= 0:
            raise AgentError("receive and send delays must be positive")
        if not self.heartbeat > 0:
            raise AgentError("the heartbeat must be a positive duration")
        if self.confirm_timeout is None:
            return
        if not self.confirm_timeout > 0:
            raise AgentError("the confirm timeout must be a positive duration")
        if self.confirm_timeout > self.heartbeat:
            raise AgentError(f"the confirm timeout ({self.confirm_timeout:g} s) is above the heartbeat "
                             f"({self.heartbeat:g} s): lower --confirm-timeout or raise --heartbeat")

    @property
    def probe_after(self) -> float:
        """The confirm timeout in force (seconds)."""
        if self.confirm_timeout is not None:
            return self.confirm_timeout
        return min(DEFAULT_CONFIRM_TIMEOUT, self.heartbeat)

    def settings(self, batch: bool) -> Settings:
        urgency = self.resend_urgency
        if urgency is None:
            urgency = 0.0 if batch else self.send_delay / 2
        return Settings(patience=self.patience, resend_urgency=urgency)


class Problems(list[str]):
    """A run's problems of one kind, as one line each: every text once, in
    the order first met, with how often it came (a continuous run meets a
    peer that stays unreachable at every cycle, and must neither grow
    without bound nor repeat itself when it stops); past ``LIMIT`` texts,
    new ones are only counted.  Compares equal to the list of its texts."""

    LIMIT = 100

    def __init__(self) -> None:
        super().__init__()
        self.counts: dict[str, int] = {}
        self.not_kept = 0

    def append(self, text: str) -> None:
        if text in self.counts:
            self.counts[text] += 1
        elif len(self) >= self.LIMIT:
            self.not_kept += 1
        else:
            self.counts[text] = 1
            super().append(text)


@dataclass(slots=True)
class RunReport:
    """What one run did, per peer and in total."""

    received: int = 0
    applied_messages: int = 0
    quarantined: int = 0
    sent: int = 0
    resend_requests: int = 0
    spark_batches: int = 0  # Spark jobs whose files were queued
    quarantine_dropped: int = 0  # older quarantined files dropped for the quarantine's caps
    left_in_inbox: int = 0  # files at the inbox not read (not for this site, or refused), at the last receive
    # A transport failed: receiving, delivering, or a peer without an address.
    transport_errors: Problems = field(default_factory=Problems)
    # This site's side failed: applying, preparing messages, the Spark engine.
    local_errors: Problems = field(default_factory=Problems)
    stopped_streams: Problems = field(default_factory=Problems)

    @property
    def ok(self) -> bool:
        """No problem of any kind (a batch run's exit code 0)."""
        return not self.transport_errors and not self.local_errors and not self.stopped_streams
