"""The spool's errors (all are :class:`agent.queue_interface.QueueError`, so the runner's
handling of queue failures covers them)."""

from __future__ import annotations

from ..queue_interface import QueueError


class SpoolError(QueueError):
    """The spool cannot do what was asked; the text says why and what to do."""


class SpoolCorrupt(SpoolError):
    """A record the spool needs does not verify.  ``rba`` is where it starts."""

    def __init__(self, rba: int, segment: str, reason: str) -> None:
        self.rba = rba
        self.segment = segment
        self.reason = reason
        super().__init__(f"spool log corrupt at RBA {rba} ({segment}): {reason}; run `agent spool check` "
                         "for a report, and restore the spool from its peers (resend) if it cannot be read")


class SpoolLocked(SpoolError):
    """Another process has the spool open."""
