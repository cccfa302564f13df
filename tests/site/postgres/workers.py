"""Child-process bodies for the PostgreSQL apply tests (imported by the
``spawn`` start method, so they live in a module, not in a test)."""

from __future__ import annotations


def apply_batch(uri: str, peer: str, batch_start: int, rows: int, per_transaction: int, backend, ready) -> None:
    """Apply one large batch from ``peer`` (tests/site/workers.crash_batch)
    into the PostgreSQL site at ``uri``, having told the parent the
    session's server process (``backend``); the parent kills this process
    at a random moment."""
    from agent.site.postgres.site import PostgresSite
    from tests.site.workers import crash_batch

    site = PostgresSite.open(uri)
    transactions, log_received = crash_batch(batch_start, rows, per_transaction)
    backend.value = site.connection.info.backend_pid
    ready.set()
    site.apply(peer, transactions, log_received=log_received)
    site.close()
