"""Conflicts at the consolidated (agent.site.apply.conflicts): policies,
hooks, and the row that goes back to the origin."""

from __future__ import annotations

import pytest

from agent.site import ConflictHookFailed, Resolution

from .applying import hq, ins, txn, upd  # noqa: F401  (hq: a fixture)
from .conftest import app_connection, table_rows


def conflict_setup(hq):
    """Row 1 is 'base' at r1, but the consolidated changed it meanwhile."""
    app = app_connection(hq)
    app.execute("INSERT INTO customer (id, name, region, balance) VALUES (1, 'base', 'north', 10.0)")
    app.execute("UPDATE customer SET name = 'hq edit', balance = 11.0 WHERE id = 1")
    return hq.scan()


def test_conflict_incoming_wins_by_default_and_goes_back_to_the_origin(hq):
    start = conflict_setup(hq)
    result = hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert result.conflicts == 1 and result.errors == 0
    assert table_rows(hq, "customer")[0][:4] == (1, "r1 edit", "north", 11.0)
    (conflict,) = hq.conflicts()
    assert (conflict.peer, conflict.peer_commit, conflict.table, conflict.key) == ("r1", 5, "customer", (1,))
    assert conflict.local_row["name"] == "hq edit"
    assert conflict.incoming_before == {"name": "base"} and conflict.incoming_after == {"name": "r1 edit"}
    assert conflict.resolution == "incoming" and conflict.result_row["name"] == "r1 edit"
    hq.scan()
    # The origin gets the columns of the conflict back as they ended up, to
    # apply after hq's own (older) change, which reaches it first.
    (back,) = [op for t in hq.read_log("r1", start) for op in t.ops]
    assert back == upd(1, {"name": "r1 edit"}, {"name": "r1 edit"})
    # Everyone else gets the change once, as an ordinary update.
    (forwarded,) = [op for t in hq.read_log("r2", start) for op in t.ops]
    assert forwarded == upd(1, {"name": "hq edit"}, {"name": "r1 edit"})


def test_conflict_policy_local_keeps_the_row_and_sends_it_back(hq):
    start = conflict_setup(hq)
    hq.set_conflict_policy("customer", "local")
    result = hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert result.conflicts == 1
    assert table_rows(hq, "customer")[0][1] == "hq edit"
    assert hq.conflicts()[0].resolution == "local"
    hq.scan()
    (back,) = [op for t in hq.read_log("r1", start) for op in t.ops]
    assert back.after["name"] == "hq edit" and back.before["name"] == "r1 edit"
    assert list(hq.read_log("r2", start)) == []  # nothing changed here
    hq.set_conflict_policy("customer", None)
    hq.apply("r1", [txn(6, upd(1, {"name": "r1 edit"}, {"name": "again"}))], log_received=6)
    assert table_rows(hq, "customer")[0][1] == "again"


def test_conflict_hook_can_merge(hq):
    conflict_setup(hq)
    seen = []

    def merge(conflict):
        seen.append(conflict)
        return {"name": f"{conflict.local_row['name']} + {conflict.incoming.after['name']}"}

    hq.set_conflict_hook("customer", merge)
    hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert table_rows(hq, "customer")[0][1] == "hq edit + r1 edit"
    assert seen[0].peer == "r1" and seen[0].key == (1,)
    assert hq.conflicts()[0].resolution == "merged"


def test_conflict_hook_choosing_local(hq):
    conflict_setup(hq)
    hq.set_conflict_hook(None, lambda conflict: Resolution.LOCAL)
    hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert table_rows(hq, "customer")[0][1] == "hq edit"


def test_a_failing_hook_rolls_the_batch_back(hq):
    conflict_setup(hq)

    def broken(conflict):
        raise KeyError("oops")

    hq.set_conflict_hook("customer", broken)
    with pytest.raises(ConflictHookFailed, match="KeyError"):
        hq.apply("r1", [txn(5, ins(2), upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)
    assert [row[0] for row in table_rows(hq, "customer")] == [1]
    assert hq.remote("r1").log_received == 0 and hq.conflicts() == ()
    hq.set_conflict_hook("customer", lambda conflict: "whatever")
    with pytest.raises(ConflictHookFailed, match="not a Resolution"):
        hq.apply("r1", [txn(5, upd(1, {"name": "base"}, {"name": "r1 edit"}))], log_received=5)


def test_duplicate_insert_at_the_consolidated_sends_its_row_back(hq):
    app_connection(hq).execute("INSERT INTO customer (id, name, region) VALUES (1, 'hq row', 'north')")
    start = hq.scan()
    result = hq.apply("r1", [txn(5, ins(1, name="r1 row", region="north"))], log_received=5)
    assert result.errors == 1
    hq.scan()
    (back,) = [op for t in hq.read_log("r1", start) for op in t.ops]
    assert back.kind == 2 and back.after["name"] == "hq row"
