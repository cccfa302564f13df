"""The checks after a seed: at rest (quiescence), and the invariants.

Rules of this file:
* At rest: every stream is confirmed to what was sent and read to the end
  of its log, each side's log_received matches the other's log_sent, and
  no data message waits in a folder inbox (other transports are asked by
  the simulation).
* Then the invariants: every remote holds exactly the consolidated's
  rows of the values it subscribes to when the seed ends (I5); every
  ledger entry made anywhere is everywhere exactly once (no loss, no double apply: a second apply of a ledger
  INSERT is an error row); I1 holds on every remote-user row.  Apply
  errors on customers and the chain come from concurrent changes and are
  only counted.
* The follow chain (a seed that draws it): every remote holds exactly the
  consolidated's clients, orders and lines that route to it, found by
  following each row's foreign keys up to its client's rep in the
  consolidated's final state (a rep it subscribes to), and no row whose
  foreign key names no row.
* Order (I2): entry numbers grow in commit order at their origin, so at
  every site each origin's entries must have arrived in increasing order.
* A check only reads the sites' files and adds what it finds to the
  seed's :class:`ChaosResult`; it never stops at the first problem but I2's.
"""

from __future__ import annotations

from functools import partial
from pathlib import Path

from ..site import open_site
from . import chain
from .report import ChaosResult
from .resubscribe import region_rows, subscribed
from .sites import Sites


def quiescent(places: Sites, sites: list[str], folder_inboxes: list[Path] | None) -> bool:
    """Whether the system is at rest; ``folder_inboxes``: the inboxes to
    look into for data messages, when they are folders."""
    found = places.remote_rows(sites)
    for site, (peers, end) in found.items():
        for peer, row in peers.items():
            # I5: all that was sent is confirmed, and the log was read to its end.
            if not row.confirm_sent == row.log_sent or not row.horizon == row.read_through == end:
                return False
            if row.log_received != found[peer][0][site].log_sent:
                return False
    for inbox in folder_inboxes or ():
        if any(".d." in path.name for path in inbox.iterdir()):
            return False
    return True


def describe(places: Sites, sites: list[str]) -> str:
    """Every stream's state, for the report of a stuck seed."""
    parts = []
    for site, (peers, end) in places.remote_rows(sites).items():
        for peer, row in peers.items():
            parts.append(f"{site}->{peer} end={end} read={row.read_through} sent={row.log_sent} "
                         f"confirmed={row.confirm_sent} "
                         f"received={row.log_received} epochs={row.resend_count}/{row.rereceive_count} "
                         f"probes={row.probes}{' owed' if row.confirm_owed else ''}")
    return ", ".join(parts)


def check(places: Sites, sites: list[str], ledger: set[str], result: ChaosResult) -> None:
    """The invariants, each problem added to ``result``.  Rows are compared
    as they travel (a PostgreSQL consolidated's through the types table)."""
    for site, (peers, end) in places.remote_rows(sites).items():
        for row in peers.values():
            if not row.confirm_sent <= row.log_sent <= end:
                result.divergences.append(f"I1 broken at {site} for {row.name}")
        with open_site(places.location(site)) as db:
            for error in db.apply_errors():
                # The ledger only ever gets new entries: an error there
                # is a second apply.  Customers change at several sites
                # at once: an UPDATE of a row another site deleted fails
                # by design (and I5 shows the sites converge).
                if error.table == "ledger":
                    key = ", ".join(map(str, error.key or ()))
                    result.double_applies.append(
                        f"{site}: ledger entry {key} from {error.peer} (its commit {error.peer_commit}) applied "
                        f"again: {error.problem}")
                else:
                    result.apply_errors += 1
    hq_ledger = places.rows("hq", "ledger", ("entry", "site", "amount"))
    hq_products = places.rows("hq", "product")
    values = subscribed(places, sites[1:])
    for site in sites:
        entries = [row[0] for row in places.rows(site, "ledger", ("entry",))]
        missing = ledger - set(entries)
        if missing:
            result.losses.append(f"{site} lacks ledger entries {sorted(missing)[:5]}")
        if len(entries) != len(set(entries)):
            result.double_applies.append(f"{site} holds a ledger entry twice")
        check_arrival_order(places, site, result)
        if site != "hq":
            if places.rows(site, "ledger", ("entry", "site", "amount")) != hq_ledger:
                result.divergences.append(f"{site}: ledger differs from hq")
            if places.rows(site, "customer") != region_rows(places, "customer", values[site]):
                result.divergences.append(f"{site}: customers differ from hq's subset")
            if places.rows(site, "product") != hq_products:
                result.divergences.append(f"{site}: products differ from hq")


def check_chain(places: Sites, sites: list[str], result: ChaosResult) -> None:
    """Every remote's chain is the consolidated's rows that route to it
    (the consolidated's read as they travel, whatever its backend)."""
    by_rep, rootless = chain.routed(partial(places.rows, sites[0]))
    for site, reps in subscribed(places, sites[1:]).items():
        wanted = {table: sorted(row for rep in reps for row in by_rep.get(rep, {}).get(table, ()))
                  for table in chain.TABLES}
        result.divergences += chain.differences(wanted, Path(places.location(site)), site)
    result.chain_rootless = rootless


def check_arrival_order(places: Sites, site: str, result: ChaosResult) -> None:
    """I2: at ``site`` each origin's entries arrived in their commit order."""
    last: dict[str, int] = {}
    for entry in places.arrivals(site):
        origin, _, number = entry.rpartition("-")
        if int(number) <= last.get(origin, 0):
            result.out_of_order.append(
                f"I2: {site} applied {entry} after {origin}-{last[origin]}, against {origin}'s commit order")
            return
        last[origin] = int(number)
