"""Applying a peer's transactions into a PostgreSQL consolidated
(docs/postgres.md, "Apply"): the rules are the SQLite consolidated's
(agent/site/apply), through the same functions; these modules do their
SQL.  ``tables`` (what the apply knows of a published table, its
statements and values), ``records`` (apply errors, conflicts, policies),
``lookups`` (a key's captured changes, for key moves and the unconfirmed
rule), ``returns`` (what goes back to the origin), ``driver`` (the batch,
its fast path and retries).
"""

from .driver import PgApplier

__all__ = ["PgApplier"]
