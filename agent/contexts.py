"""What each hop of a message is given: its narrow, named context.

The runner (agent.runner) opens the site, its queues, keys and transports,
and hands each hop only what that hop uses; a hop hands back what happened
(the protocol's actions, outcomes) and the runner carries it out.

Rules of this file:
* Values only: frozen dataclasses of the resources a hop may use, built
  once by the runner when it opens.  The resources themselves (a
  database, a queue, a report) are shared with the runner, not copied.
* No hop holds the agent, nor a bound method of it: nothing here refers
  to agent.runner.
* ``clock`` is the agent's one clock (seconds since the epoch): every time
  a hop records (in the database, a state file, a message) is read from it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from codec.keys import Keyring, SiteKeys

from .left_files import LeftFiles
from .pairs import Peer
from .protocol import Action
from .quarantine import SetAside
from .queues import MessageQueues
from .run_options import RunOptions, RunReport
from .site import Site
from .transport_pool import TransportPool


#: What a hop hands back, step by step, for the runner to carry out: a pair and its protocol's actions.
Step = tuple[Peer, list[Action]]


def stamp(now: float) -> datetime:
    """A reading of the clock as the time the site database records."""
    return datetime.fromtimestamp(now, timezone.utc)


@dataclass(frozen=True, slots=True)
class Inbox:
    """The receive path's (agent.receiving): this site (``site``, its
    ``keys``), its peers' public keys, the pairs, the inbound queues, the
    files left unread, the quarantine (through its block of files set
    aside), the run's report and the clock; ``keep``: ``agent run --keep``."""

    site: str
    keys: SiteKeys
    keyring: Keyring
    peers: Mapping[str, Peer]
    queues: MessageQueues
    left: LeftFiles
    aside: SetAside
    report: RunReport
    clock: Callable[[], float]
    keep: bool = False
    # Blocking: build the pair of a peer not built yet (a batch run builds
    # only the pairs with work, agent.working_set); None: no such peer.
    load_peer: Callable[[str], Peer | None] = lambda name: None


@dataclass(frozen=True, slots=True)
class Applier:
    """The apply path's (agent.applying): this site (``site``, its ``keys``
    to open sealed messages), its peers' public keys, the inbound queues,
    the site database, the run's report and the clock."""

    site: str
    keys: SiteKeys
    keyring: Keyring
    queues: MessageQueues
    db: Site
    report: RunReport
    clock: Callable[[], float]


@dataclass(frozen=True, slots=True)
class Outbox:
    """The send path's (agent.sending, agent.preparing): the site database
    and this site's keys, the pairs, the outbound queues, the transports,
    the run's options and report, the agent's folder (a Spark job's work)
    and the clock; ``batch``: a batch run (every peer's send is due)."""

    db: Site
    keys: SiteKeys
    peers: Mapping[str, Peer]
    queues: MessageQueues
    transports: TransportPool
    options: RunOptions
    report: RunReport
    directory: Path
    clock: Callable[[], float]
    batch: bool
