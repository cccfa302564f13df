"""A remote's pending rows (agent.site.sqlite.apply.pending): its own changes the
consolidated has not confirmed."""

from __future__ import annotations

from .applying import remote, ins, txn, upd  # noqa: F401  (remote: a fixture)
from .conftest import app_connection, table_rows


def test_a_remote_keeps_its_own_change_the_consolidated_has_not_seen(remote):
    """hq's UPDATE was written before hq applied the remote's change to the
    same column: the remote keeps its value (hq applies the remote's change
    after its own and sends the outcome back); other columns are taken."""
    remote.apply("hq", [txn(5, ins(1, name="one", balance=1.0), origin="hq")], log_received=5)
    app_connection(remote).execute("UPDATE customer SET name = 'local edit' WHERE id = 1")
    remote.apply("hq", [txn(6, upd(1, {"name": "one", "balance": 1.0}, {"name": "hq edit", "balance": 2.0}),
                        origin="hq")], log_received=6)
    assert table_rows(remote, "customer")[0][:4] == (1, "local edit", None, 2.0)
    assert remote.apply_errors() == () and remote.conflicts() == ()
