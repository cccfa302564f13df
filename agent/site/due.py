"""Which pairs have something due at a batch run, found from the
remote-user rows by the database (``Site.pairs_due``), so that a run at a
consolidated of a hundred thousand remotes loads and steps only those.

The agent's core (agent.controls, agent.protocol) still decides what each
pair it loads owes; this is a filter in front of it and says only which
pairs may owe something:

* a control message (rule 3): a confirmation when ``log_received`` moved
  since the last one or one is owed; a heartbeat when no control message
  went for the shortest share of the heartbeat a peer's period can be
  (agent.controls.heartbeat_period: ``1 - HEARTBEAT_SPREAD`` of it, or
  more); a probe when the stream is unconfirmed and nothing went for the
  least probe wait (the confirm timeout doubled per probe, capped at that
  share of the heartbeat);
* a read (rule 5): the log end is past ``max(log_read, log_sent)``, or
  ``log_send`` is (a send that did not finish); given by group of pairs
  at the same read positions, so that what is decided for a range is
  decided once for all the pairs it is the same for.

Rules of this file:
* Pure: no database, no clock (``now`` is the agent's).  Each backend
  writes :func:`control_might_be_due` as SQL (agent.site.sqlite.due,
  agent.site.postgres.remotes); tests/site/both/test_pairs_due.py holds
  both to it, and it to the core's ``control_due``.
* A superset, never a subset: a pair the core would send a control
  message is always named (the bounds are the lowest the core can use,
  less a margin for rounding).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable

# Times compared in SQL and in Python round differently: the bounds are
# lowered by this share, so that a pair the core finds due is never missed.
MARGIN = 0.999


@dataclass(frozen=True, slots=True)
class DueQuery:
    """What a batch run asks the site: the agent's ``now``, the log end the
    send phase reads to, the run's heartbeat and confirm timeout (a row's
    own, when set, win: agent.controls.control_timers), the least share of
    its heartbeat a peer's period is, and how often the probe wait doubles
    at most."""

    now: float
    log_end: int
    heartbeat: float
    confirm_timeout: float
    heartbeat_share: float
    max_doublings: int

    def __post_init__(self) -> None:
        if not (self.heartbeat > 0 and self.confirm_timeout > 0 and 0 < self.heartbeat_share <= 1):
            raise ValueError(f"bad query {self!r}")


@dataclass(frozen=True, slots=True)
class ReadDue:
    """The pairs the log holds a range for that was not read for them yet,
    grouped by their read positions (at a fleet, most pairs share them)
    and by whether they follow the common read position (``follows``:
    docs/protocol.md, "The common read position")."""

    log_send: int
    log_sent: int
    log_read: int
    follows: bool
    names: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class PairsDue:
    """The pairs that may owe a control message, and those with a read due."""

    controls: frozenset[str]
    reads: tuple[ReadDue, ...]

    def read_names(self) -> set[str]:
        """Every pair with a read due."""
        return {name for read in self.reads for name in read.names}


def find_pairs_due(execute: Callable[..., Iterable[tuple]], controls_sql: Any, reads_sql: Any,
                   query: DueQuery) -> PairsDue:
    """Both backends' ``pairs_due``: ``controls_sql`` (the names of the
    pairs :func:`control_might_be_due` selects) and ``reads_sql`` (the rows
    of :class:`ReadDue`) run by ``execute`` with the query's parameters."""
    parameters = {"now": query.now, "heartbeat": query.heartbeat, "share": query.heartbeat_share, "margin": MARGIN,
                  "timeout": query.confirm_timeout, "doublings": query.max_doublings}
    controls = frozenset(name for (name,) in execute(controls_sql, parameters))
    groups: dict[tuple, list[str]] = {}
    for row in execute(reads_sql, {"end": query.log_end}):  # (name, log_send, log_sent, log_read, follows)
        positions = (*row[1:4], bool(row[4]))
        names = groups.get(positions)
        if names is None:
            names = groups[positions] = []
        names.append(row[0])
    return PairsDue(controls, tuple(ReadDue(*positions, tuple(names)) for positions, names in groups.items()))


def control_might_be_due(row: Any, query: DueQuery) -> bool:
    """The rule each backend's SQL writes, over a remote-user row."""
    if row.confirm_received != row.log_received or row.confirm_owed or row.control_sent_at is None:
        return True
    beat = row.heartbeat or query.heartbeat
    shortest = beat * query.heartbeat_share * MARGIN
    if row.control_sent_at <= query.now - shortest:
        return True
    if row.confirm_sent >= row.log_sent:
        return False
    last = max(row.control_sent_at, row.data_sent_at if row.data_sent_at is not None else row.control_sent_at)
    timeout = min(row.confirm_timeout or query.confirm_timeout, beat)
    wait = min(timeout * (1 << min(row.probes, query.max_doublings)), beat * query.heartbeat_share) * MARGIN
    return last <= query.now - wait


def read_might_be_due(row: Any, log_end: int) -> bool:
    """Rule 5 over a row: a range was logged past what was read for the peer."""
    through = max(row.log_read, row.log_sent)
    return row.log_send > through or log_end > through
