"""Rule 3 (docs/protocol.md): which control message a send phase owes a peer.

Rules of this file:
* Pure: no I/O, no clock; ``now`` and the timers come from the caller.
* No message without news: a control message goes only when it says
  something the peer needs, and never silent while something is
  outstanding (a confirmation owed, a stream unconfirmed past its
  confirm timeout).  The heartbeat only tells that a quiet peer is alive.
"""

from __future__ import annotations

import zlib

from .pair_values import PairState

# A fleet confirmed at one moment (just added, or after an outage) would have
# every heartbeat fall due in the same run: each peer's period is shorter by
# a fixed share of up to HEARTBEAT_SPREAD, from a hash of its name, so the
# heartbeats spread out and stay apart.
HEARTBEAT_SPREAD = 0.1
# The probe backoff doubles at most this many times (2**20 confirm timeouts
# is beyond any heartbeat, which caps the wait anyway).
MAX_PROBE_DOUBLINGS = 20


def heartbeat_period(peer: str, heartbeat: float) -> float:
    """The seconds after which ``peer`` is due a heartbeat: ``heartbeat``
    less its share (between 0 and HEARTBEAT_SPREAD) of it."""
    return heartbeat * (1 - HEARTBEAT_SPREAD * zlib.crc32(peer.encode()) / 2**32)


def control_timers(heartbeat: float | None, confirm_timeout: float | None, *, run_heartbeat: float,
                   run_confirm_timeout: float) -> tuple[float, float]:
    """The heartbeat and confirm timeout in force for a peer: its own (set
    on its remote-user row; None: none of its own), else the run's
    (``--heartbeat``, ``--confirm-timeout``).  A confirm timeout above the
    heartbeat in force is capped at it."""
    beat = heartbeat or run_heartbeat
    return beat, min(confirm_timeout or run_confirm_timeout, beat)


def probe_wait(confirm_timeout: float, probes: int, heartbeat: float | None) -> float:
    """The seconds of silence to the peer after which a stream still
    unconfirmed is probed, when ``probes`` were sent since it last changed:
    the confirm timeout, doubled per probe, never above the heartbeat."""
    wait = confirm_timeout * 2 ** min(probes, MAX_PROBE_DOUBLINGS)
    return wait if heartbeat is None else min(wait, heartbeat)


def control_due(peer: str, state: PairState, now: float, *, heartbeat: float | None,
                confirm_timeout: float | None, force: bool) -> str | None:
    """The reason of the control message the peer is owed now, or None:
    ``confirmation`` when ``log_received`` moved since the last one or one
    is owed (data went to a peer not known to hold it, a probe or a
    duplicate arrived); ``probe`` when the stream to the peer is unconfirmed
    and nothing went to it for :func:`probe_wait` seconds (``confirm_timeout``
    None: never); ``heartbeat`` when no control message went to it for
    :func:`heartbeat_period` seconds (``heartbeat`` None: never).
    ``force``: a confirmation anyway (an operator's explicit request; tests)."""
    if force or state.confirm_received != state.log_received or state.confirm_owed:
        return "confirmation"
    period = None if heartbeat is None else heartbeat_period(peer, heartbeat)
    if state.unconfirmed and confirm_timeout is not None:
        sent = [moment for moment in (state.control_sent_at, state.data_sent_at) if moment is not None]
        if not sent or now - max(sent) >= probe_wait(confirm_timeout, state.probes, period):
            return "probe"
    if period is not None and (state.control_sent_at is None or now - state.control_sent_at >= period):
        return "heartbeat"
    return None
