"""Named places where a test can make the agent die.

Rules of this file:
* ``crash_point(name)`` does nothing unless that point was armed, so the
  calls cost one dict lookup in production.
* Armed in-process (``arm``), a point raises :class:`Crash`, a
  BaseException no handler in the agent catches, so the run stops right
  there as if the process had died; the simulation then drops the agent
  and starts a new one on the same files.
* Armed through the environment (``FIELDSYNC_CRASH=name[:skip]``), the
  process kills itself with SIGKILL at that point, for multi-process tests.
* The site layer says where it is (agent.site.points.reached); this file
  installs :func:`crash_point` there, so those points arm alike.
"""

from __future__ import annotations

import os
import signal

from .site import points as site_points

POINTS = (
    "receive.after-queue",  # a file is durably queued, not yet acknowledged to the transport
    "apply.after-commit",  # the database committed an apply, the inbound queue not yet cleaned
    "send.after-queue",  # outbound messages are queued, log_sent not yet recorded
    "flush.after-send",  # a file went out through the transport, not yet removed from the queue
    "restart.pending",  # while re-reading queued inbound messages at start
)
# Points the fault suite draws apart, from the stream of the seeds that make
# schema changes (agent/chaos/schema_changes.py), so the other seeds' draws
# stay what they were.
SCHEMA_POINTS = (
    "apply.in-change",  # a remote ran a schema change or passthrough SQL, inside the apply, not committed
)

# Points of the tools beside the agent, for their own tests (the fault suite
# draws none of them).
TOOL_POINTS = (
    "extract.copy-made",  # a remote's copy is made under its temporary name, the consolidated not yet switched over
    "resubscribe.before-cut",  # a PostgreSQL subscription change committed its rows, no cut has taken them yet
)


class Crash(BaseException):
    """The agent 'died' at a crash point (in-process simulation)."""


_armed: dict[str, int] = {}
_kill = False


def arm(name: str, skip: int = 0, *, kill: bool = False) -> None:
    """Make the ``skip + 1``-th pass through ``name`` crash."""
    global _kill
    known = POINTS + SCHEMA_POINTS + TOOL_POINTS
    if name not in known:
        raise ValueError(f"unknown crash point {name!r}; known: {', '.join(known)}")
    _armed[name] = skip
    _kill = kill


def disarm() -> None:
    _armed.clear()


def crash_point(name: str) -> None:
    if not _armed:
        return
    remaining = _armed.get(name)
    if remaining is None:
        return
    if remaining > 0:
        _armed[name] = remaining - 1
        return
    del _armed[name]
    if _kill:
        os.kill(os.getpid(), signal.SIGKILL)
    raise Crash(name)


def _from_environment() -> None:
    spec = os.environ.get("FIELDSYNC_CRASH")
    if spec:
        name, _, skip = spec.partition(":")
        arm(name, int(skip or 0), kill=True)


site_points.set_hook(crash_point)  # the points inside the site's transactions (agent.site.points)
_from_environment()
