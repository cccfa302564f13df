"""Errors of the Spark batch path."""

from __future__ import annotations

from ..errors import AgentError


class SparkBatchError(AgentError):
    """A Spark batch could not be prepared, run or taken over; nothing of it
    reached the outbound queue."""


class SparkBatchCancelled(SparkBatchError):
    """The batch was stopped from outside (``SparkOptions.cancel``): the
    agent is stopping.  Nothing of it was kept; unlike other failures it
    is not a reason to pack the sends locally."""
