"""Exponential backoff: how long to wait after failures in a row.

Rules of this file:
* Pure values: every delay is computed here; the sleeping (or the deadline
  kept against a clock) is the caller's.  No clock, no randomness.
* One rule for every retry in fieldsync: the transports' reconnects
  (sftp, email) and the agent's wait on its inbox (agent.schedule).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from .errors import BadTransportOptions

MAX_RETRY_DELAY = 30.0
MAX_RETRIES = 100
# 2**64 times any first delay is beyond every cap: the exponent stops there
# (a float overflows near 2**1024, after a few days of 5-minute retries).
_MAX_DOUBLINGS = 64


@dataclass(frozen=True, slots=True)
class Backoff:
    """How patiently a failing call is tried again: ``first_delay`` after the
    first failure, twice as long after each next one, at most ``max_delay``
    seconds; ``retries`` more tries after the first (None: no end, the
    caller tries until it works)."""

    retries: int | None
    first_delay: float
    max_delay: float = MAX_RETRY_DELAY

    def __post_init__(self) -> None:
        if self.retries is not None and (type(self.retries) is not int or not 0 <= self.retries <= MAX_RETRIES):
            raise BadTransportOptions(f"retries must be a whole number 0..{MAX_RETRIES}, got {self.retries!r}")
        if isinstance(self.first_delay, bool) or not isinstance(self.first_delay, (int, float)) \
                or not 0 <= self.first_delay <= self.max_delay:
            raise BadTransportOptions(f"retry_delay must be 0..{self.max_delay:.0f} seconds, got {self.first_delay!r}")

    def delay(self, failures: int) -> float:
        """The wait after ``failures`` failures in a row (1: the first)."""
        return min(self.max_delay, self.first_delay * 2.0 ** min(max(failures - 1, 0), _MAX_DOUBLINGS))

    def delays(self) -> Iterator[float]:
        """The waits before the second, third, ... attempt (``retries`` of them)."""
        assert self.retries is not None, "an endless backoff has no list of delays"
        for failures in range(1, self.retries + 1):
            yield self.delay(failures)
