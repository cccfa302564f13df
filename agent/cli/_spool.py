"""Reading (never changing) what the agent keeps beside a site database:
its message queues and its quarantine, for ``status`` and ``inbox``."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from ..quarantine import QuarantinedFile, read_quarantine
from ..queues import MessageQueues, QueueDepth
from ..runner import agent_directory
from ..runner import open_queues as runner_open_queues
from ..spool import SpoolSummary, SummaryStale, SummaryUnreadable, check_spool, read_summary
from ..spool._check import QueueReport, SpoolCheck

__all__ = ["QuarantinedFile", "SpoolFigures", "open_queues", "quarantined", "queue_depths", "queue_reports",
           "spool_check", "spool_figures", "spool_summary"]


def open_queues(database: Path) -> MessageQueues:
    """The queues the agent of ``database`` uses, opened for the agent's own
    run (the spool allows one holder at a time)."""
    return runner_open_queues(database)


def spool_check(database: Path) -> SpoolCheck | None:
    """The spool read without taking it (the agent may be running); None
    before the agent first ran.  Read once for everything a command shows."""
    spool = agent_directory(database) / "spool"
    if not spool.is_dir():
        return None
    return check_spool(spool)


def queue_reports(database: Path, check: SpoolCheck | None = None) -> list[QueueReport]:
    """What the spool holds: one report per queue, with the message names
    in order (``check``: the spool as :func:`spool_check` read it)."""
    check = check or spool_check(database)
    return [] if check is None else list(check.queues)


def spool_summary(database: Path, check: SpoolCheck | None = None) -> dict | None:
    """The spool's state for ``agent status``: messages, the oldest one's age,
    the restart span and the space used (None before the agent first ran)."""
    report = check or spool_check(database)
    if report is None:
        return None
    oldest = [q.oldest_enqueued_at for q in report.queues if q.oldest_enqueued_at is not None and q.names]
    return {
        "ok": report.ok,
        "messages": report.messages,
        "oldest_message_age_s": round(time.time() - min(oldest), 1) if oldest else None,
        "restart_span_bytes": report.restart_span_bytes,
        "log_bytes": report.end_rba - report.log_start_rba,
        "segments": len(report.segments),
        "in_doubt": len(report.in_doubt),
        "problems": list(report.problems),
    }


def queue_depths(database: Path, check: SpoolCheck | None = None) -> list[QueueDepth]:
    counts: dict[str, dict[str, int]] = {}
    for report in queue_reports(database, check):
        counts.setdefault(report.peer, {"in": 0, "out": 0})[report.direction] += len(report.names)
    return [QueueDepth(peer, value["in"], value["out"]) for peer, value in sorted(counts.items())]


@dataclass(frozen=True, slots=True)
class SpoolFigures:
    """What ``agent status`` shows of the spool: from the summary the spool
    keeps (``source`` "summary"), or, when that is stale or unreadable,
    from reading the span with its checks (``source`` "check", ``reason``
    saying why; ``unreadable``: the summary file is damaged, not just behind)."""

    source: str
    reason: str | None
    unreadable: bool
    depths: tuple[QueueDepth, ...]
    summary: dict


def spool_figures(database: Path) -> SpoolFigures | None:
    """The spool's figures for ``agent status`` (None before the agent first
    ran): its summary when the log shows it is current, else a full read."""
    spool = agent_directory(database) / "spool"
    if not spool.is_dir():
        return None
    try:
        summary = read_summary(spool)
    except (SummaryStale, SummaryUnreadable) as error:
        check = check_spool(spool)
        unreadable = isinstance(error, SummaryUnreadable) and (spool / "summary").exists()
        reason = str(error)
        return SpoolFigures("check", reason, unreadable, tuple(queue_depths(database, check)),
                            _figures(spool_summary(database, check), "check", reason))
    return SpoolFigures("summary", None, False, _summary_depths(summary),
                        _figures(_summary_figures(summary), "summary", None))


def _figures(figures: dict | None, source: str, reason: str | None) -> dict:
    assert figures is not None
    return {**figures, "source": source, "summary_problem": reason}


def _summary_figures(summary: SpoolSummary) -> dict:
    oldest = [queue.oldest_enqueued_at for queue in summary.queues if queue.oldest_enqueued_at is not None]
    return {
        "ok": summary.ok,
        "messages": summary.messages,
        "oldest_message_age_s": round(time.time() - min(oldest), 1) if oldest else None,
        "restart_span_bytes": summary.restart_span_bytes,
        "log_bytes": summary.log_bytes,
        "segments": summary.segments,
        "in_doubt": summary.in_doubt,
        "problems": list(summary.problems),
    }


def _summary_depths(summary: SpoolSummary) -> tuple[QueueDepth, ...]:
    counts: dict[str, list[int]] = {}
    for queue in summary.queues:
        counts.setdefault(queue.peer, [0, 0])[queue.direction == "out"] += queue.messages
    return tuple(QueueDepth(peer, inbound, outbound) for peer, (inbound, outbound) in sorted(counts.items()))


def quarantine_folder(database: Path) -> Path:
    return agent_directory(database) / "quarantine"


def quarantined(database: Path) -> list[QuarantinedFile]:
    """The quarantined files, oldest first, each with the reason recorded for it."""
    return read_quarantine(quarantine_folder(database))
