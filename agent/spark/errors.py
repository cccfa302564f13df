"""Errors of the Spark batch path."""

from __future__ import annotations

from ..errors import AgentError


class SparkBatchError(AgentError):
    """A Spark batch could not be prepared, run or taken over; nothing of it
    reached the outbound queue."""
