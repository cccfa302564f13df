"""Which pairs a batch run loads: those with work, not every pair (a
consolidated may serve a hundred thousand remotes).

A pair is built into a :class:`~agent.protocol.PairProtocol` and stepped
only when something may be due for it; the core then decides what is:

* at the start (:func:`load_at_start`): a pair with messages in its
  inbound queue (or a dequeue in doubt) or its outbound queue, and one
  whose receive poll may do something though nothing is queued (a
  ``PEER.poll`` file, agent.pair_files: a gap waited out, rule 4);
* while receiving: a pair a file arrives from (agent.receiving asks the
  runner's loader for its sender);
* at the send phase (:func:`load_for_sends`): a pair that may owe a
  control message (a confirmation, a probe, a heartbeat, rule 3) and one
  whose new log range may hold something for it (rule 5), both found by
  the database (``Site.pairs_due``, agent.site.due; ``concerned_reads``).
  The pairs a new range holds nothing for are not built: their
  ``log_send`` and ``log_read`` move as each pair's empty send would move
  them, by one write of the site's common read position for those that
  follow it, and by one statement for the others, which then follow it
  (``Site.move_reads``; docs/protocol.md, "The common read position"):
  a run's writes grow with the pairs it has work for, not with the fleet.

A pair built stays built for the agent's life.  Continuous runs build
every pair (agent.pairs.PairStore.load).

Rules of this file:
* Blocking: the runner calls these functions in a worker thread.
* What the database names is a superset of the pairs with work; a pair
  left out is one the core would have found nothing for (a read the
  range holds nothing for is the one thing decided here, with the rule
  of ``PairProtocol.send_due``, ``_start_send`` and ``send_done``).
"""

from __future__ import annotations

from .controls import HEARTBEAT_SPREAD, MAX_PROBE_DOUBLINGS
from .pairs import PairStore, Peer
from .protocol import Settings
from .queue_interface import MessageQueues
from .run_options import RunOptions
from .site.due import DueQuery, ReadDue


def load_at_start(store: PairStore, peers: dict[str, Peer], settings: Settings, queues: MessageQueues) -> None:
    """Build the pairs with queued messages or a poll that may do something."""
    store.polling = store.files.polling()
    queued = {depth.peer for depth in queues.depths() if depth.inbound or depth.outbound}
    store.load_named(peers, sorted(queued | store.polling), settings)


def load_for_sends(store: PairStore, peers: dict[str, Peer], settings: Settings, options: RunOptions, *,
                   now: float, everyone: bool = False) -> None:
    """Before a send phase: build the pairs that may owe a control message or
    whose new range may hold something for them; move the read positions of
    those it holds nothing for (the pairs that follow the common read
    position and are built leave it first: their sends move their own).
    ``everyone``: build every pair (each is sent a confirmation)."""
    db = store.db
    if everyone:
        store.load_named(peers, [remote.name for remote in db.remotes()], settings)
        return
    log_end, log_start = db.scan(), db.log_start()
    due = db.pairs_due(DueQuery(now=now, log_end=log_end, heartbeat=options.heartbeat,
                                confirm_timeout=options.probe_after, heartbeat_share=1 - HEARTBEAT_SPREAD,
                                max_doublings=MAX_PROBE_DOUBLINGS))
    # Each group of pairs at the same read positions reads the same range.
    reads = [(read, *read_range(read, log_end, log_start), [name for name in read.names if name not in peers])
             for read in due.reads]
    asked = [(name, start, end) for _, start, end, names in reads if end > start for name in names]
    concerned = {asked[index][0] for index in db.concerned_reads(asked)} if asked else set()
    store.load_named(peers, sorted(due.controls | concerned), settings)
    if not due.reads:
        return
    # Every pair due reads up to the log end (read_range), and so does the
    # common position: the pairs not built move there, the built followers
    # keep where they are (their sends move them).
    leave = [name for read in due.reads if read.follows for name in read.names if name in peers]
    join = [name for read in due.reads if not read.follows for name in read.names if name not in peers]
    db.move_reads(log_end, leave=leave, join=join)


def read_range(read: ReadDue, log_end: int, log_start: int) -> tuple[int, int]:
    """Where the pair's send would read from and to (rule 5 and 8: the
    protocol's ``send_due`` and ``_start_send``): ``log_send`` moves to the
    log end; what the log truncated held nothing for the peer."""
    end = max(read.log_send, log_end)
    return max(read.log_read, read.log_sent, min(log_start, end)), end
