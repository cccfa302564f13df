"""Reading (never changing) what the agent keeps beside a site database:
its message queues and its quarantine, for ``status`` and ``inbox``."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from ..queues import DirectoryQueues, MessageQueues, QueueDepth
from ..runner import agent_directory

_REASON_SUFFIX = ".reason.json"


@dataclass(frozen=True, slots=True)
class QuarantinedFile:
    file: str           # the file in the quarantine folder
    name: str           # the name it arrived under
    peer: str | None    # the peer it came from, when known
    reason: str
    at: datetime | None
    size: int


def open_queues(database: Path) -> MessageQueues:
    """The queues the agent of ``database`` uses (the one place that knows
    which implementation that is: the runner's default)."""
    return DirectoryQueues(agent_directory(database) / "queues")


def queue_depths(database: Path) -> list[QueueDepth]:
    if not (agent_directory(database) / "queues").is_dir():
        return []
    spool = open_queues(database)
    try:
        return spool.depths()
    finally:
        spool.close()


def quarantine_folder(database: Path) -> Path:
    return agent_directory(database) / "quarantine"


def quarantined(database: Path) -> list[QuarantinedFile]:
    """The quarantined files, oldest first, each with the reason recorded for it."""
    folder = quarantine_folder(database)
    if not folder.is_dir():
        return []
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith(".") or path.name.endswith(_REASON_SUFFIX) or not path.is_file():
            continue
        record: dict = {}
        try:
            loaded = json.loads(path.with_name(path.name + _REASON_SUFFIX).read_text(encoding="utf-8"))
            if isinstance(loaded, dict):
                record = loaded
        except (OSError, ValueError):
            pass
        at = record.get("at")
        found.append(QuarantinedFile(
            file=path.name, name=str(record.get("name") or path.name),
            peer=record.get("peer") if isinstance(record.get("peer"), str) else None,
            reason=str(record.get("reason") or "no reason recorded"),
            at=datetime.fromtimestamp(at, timezone.utc) if isinstance(at, (int, float)) else None,
            size=path.stat().st_size))
    return found
