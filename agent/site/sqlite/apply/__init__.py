"""Applying a peer's transactions into a SQLite site (docs/site-database.md):
one module per rule (statements, keymoves, conflicts, unconfirmed, pending,
followers, reshape, schema), each an object the driver (:class:`Applier`)
holds and calls in turn, doing SQLite's SQL around the shared rules and
values of agent/site/apply; this package exports what the SQLite site uses.
"""

from .conflicts import list_conflicts, set_policy_locked
from .driver import Applier
from .statements import list_apply_errors

__all__ = ["Applier", "list_apply_errors", "list_conflicts", "set_policy_locked"]
