"""The crash-safe message spool (DESIGN §5, EP 0 280 773): message queues in
a recovery log with selective-relogging checkpoints.  The format is in
``docs/spool-format.md``."""

from ._check import SpoolCheck, check_spool
from ._errors import SpoolCorrupt, SpoolError, SpoolLocked
from ._format import RelogMode
from ._recovery import RestartStats
from ._spool import SpoolQueues
from ._summary import SpoolSummary, SummaryStale, SummaryUnreadable, read_summary
from ._values import CheckpointStats, DequeueToken, InDoubtDequeue, Resolution, SpoolCounters, SpoolStatus

__all__ = [
    "CheckpointStats", "DequeueToken", "InDoubtDequeue", "RelogMode", "Resolution", "RestartStats", "SpoolCheck",
    "SpoolCorrupt", "SpoolCounters", "SpoolError", "SpoolLocked", "SpoolQueues", "SpoolStatus", "SpoolSummary",
    "SummaryStale", "SummaryUnreadable", "check_spool", "read_summary",
]
