"""Subscription changes while the faults last (a seed that draws them):
the consolidated changes the values a remote subscribes to
(``Site.subscribe`` and ``unsubscribe``, what ``agent remote subscribe``
runs), so the rows that enter or leave its subset reach it through its
stream (docs/site-database.md, "Changing a remote's subscriptions") while
messages are lost, duplicated and reordered.

Rules of this file:
* Every draw comes from a stream of its own (``resubscribe:<seed>``), so
  a seed's other draws stay what they were without subscription changes.
* A remote keeps its own value (the customers and clients it writes);
  it gains another one (another remote's, or ``hq``, the rep no remote
  has: customers of that region and clients of that rep, with their
  orders and lines), or loses one it gained.  The change is made between
  the sites' runs, at a step of the fault phase.
* The checks (checks.py) hold each remote to the rows of the values it
  subscribes to when the seed ends.
"""

from __future__ import annotations

import random

from ..site import open_site
from .sites import Sites

# The chance that the consolidated changes a remote's subscriptions at a step.
CHANGE_RATE = 0.3
# The publication of chaos's world (world.py).
PUBLICATION = "field"
# The value no remote subscribes to at first (chain.UNSUBSCRIBED).
NOBODY = "hq"


class Resubscriptions:
    """The subscription changes of one seed."""

    def __init__(self, places: Sites, sites: list[str], seed: int) -> None:
        self.places = places
        self.remotes = sites[1:]
        self.rng = random.Random(f"resubscribe:{seed}")
        self.made = 0
        self.rows = 0  # rows that entered or left a remote's subset

    def change(self) -> str | None:
        """Maybe one change at the consolidated; ``subscribe`` or ``unsubscribe``."""
        rng = self.rng
        if rng.random() >= CHANGE_RATE:
            return None
        remote = rng.choice(self.remotes)
        with open_site(self.places.location("hq")) as hq:
            held = {item.value for item in hq.subscriptions(remote) if item.publication == PUBLICATION}
            gained = sorted(held - {remote})
            others = [value for value in (*self.remotes, NOBODY) if value not in held]
            if gained and (not others or rng.random() < 0.5):
                change = hq.unsubscribe(remote, PUBLICATION, rng.choice(gained))
            else:
                change = hq.subscribe(remote, PUBLICATION, rng.choice(others))
        self.made += 1
        self.rows += change.inserts + change.deletes
        return "subscribe" if change.subscribed else "unsubscribe"


def region_rows(places: Sites, table: str, values: list[str]) -> list[tuple]:
    """The consolidated's rows of ``table`` whose region is one of ``values``."""
    if not values:
        return []
    return places.rows("hq", table, where=f"region IN ({', '.join('?' * len(values))})", values=tuple(values))


def subscribed(places: Sites, remotes: list[str]) -> dict[str, list[str]]:
    """The values each remote subscribes to now, at the consolidated."""
    with open_site(places.location("hq")) as hq:
        return {remote: sorted(item.value for item in hq.subscriptions(remote) if item.publication == PUBLICATION)
                for remote in remotes}
