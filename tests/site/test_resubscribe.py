"""Subscription changes through the stream (agent/site/sqlite/resubscribe.py, and
the readers' plans by commit offset in agent/site/selection.py), on real
SQLite files: docs/site-database.md, "Changing a remote's subscriptions"."""

from __future__ import annotations

import contextlib
import sqlite3

import pytest

from agent.site import SiteDatabase
from agent.site.errors import InvalidSetting
from agent.site.selection import plan_from_rows
from agent.site.identity import Role
from agent.site.sqlite.schema import SCHEMA_VERSION
from codec.ops import OpKind

from .conftest import app_connection, orders_world


@pytest.fixture
def world(tmp_path):
    hq, remotes = orders_world(tmp_path, 30)  # ids 3, 6, ..., 30 north (r1); 1, 4, ..., 28 south (r2)
    yield hq, remotes
    for site in (hq, *remotes.values()):
        site.close()


def ops(transactions) -> list[tuple]:
    return [(transaction.commit, op.kind, op.key) for transaction in transactions for op in transaction.ops]


def test_a_read_before_the_change_is_the_same_after_it_and_one_across_it_ends_with_the_moves(world):
    hq, _ = world
    start = hq.remote("r1").log_sent
    app = app_connection(hq)
    app.execute("UPDATE orders SET region = 'east' WHERE id = 3")  # leaves r1's subset
    app.execute("UPDATE orders SET qty = 2 WHERE id = 6")
    end = hq.scan()
    before = ops(hq.read_log("r1", start, end))
    assert before == [(end, OpKind.DELETE, (3,)), (end, OpKind.UPDATE, (6,))]  # one cut: one transaction
    change = hq.unsubscribe("r1", "orders", "north")
    assert (change.deletes, change.inserts, change.streamed) == (9, 0, True)
    # A resend of what was sent before the change reads it as r1 saw it then.
    assert ops(hq.read_log("r1", start, end)) == before
    across = ops(hq.read_log("r1", start))
    assert across[:2] == before
    assert across[2:] == [(change.offset, OpKind.DELETE, (key,)) for key in range(6, 31, 3)]
    # Nobody else gets the DELETEs; r1 gets nothing after the change.
    assert ops(hq.read_log("r2", end)) == []
    app.execute("UPDATE orders SET qty = 3 WHERE id = 9")
    assert ops(hq.read_log("r1", change.offset)) == []


def test_a_subscription_added_then_ended_reads_each_span_with_its_own_subset(world):
    hq, _ = world
    start = hq.remote("r1").log_sent
    app = app_connection(hq)
    added = hq.subscribe("r1", "orders", "east")
    assert (added.inserts, added.deletes) == (10, 0)
    app.execute("UPDATE orders SET qty = 5 WHERE id = 2")  # east: r1 now gets it
    ended = hq.unsubscribe("r1", "orders", "east")
    assert (ended.inserts, ended.deletes) == (0, 10)
    app.execute("UPDATE orders SET qty = 6 WHERE id = 2")  # east again: no longer for r1
    app.execute("UPDATE orders SET qty = 6 WHERE id = 3")  # north
    last = hq.scan()
    read = ops(hq.read_log("r1", start))
    east = list(range(2, 31, 3))
    # The first UPDATE was cut by the unsubscribe, just before its ten DELETEs.
    assert read == ([(added.offset, OpKind.INSERT, (key,)) for key in east]
                    + [(ended.offset - 10, OpKind.UPDATE, (2,))]
                    + [(ended.offset, OpKind.DELETE, (key,)) for key in east]
                    + [(last, OpKind.UPDATE, (3,))])
    # One pass for several subscribers selects what each read alone does.
    reads = [("r1", start, None), ("r2", start, None)]
    fanned: dict[int, list] = {0: [], 1: []}
    for index, transaction in hq.read_logs(reads):
        fanned[index].append(transaction)
    assert ops(fanned[0]) == read
    assert ops(fanned[1]) == ops(hq.read_log("r2", start))


def test_the_plan_keeps_earlier_spans_and_drops_those_equal_to_now():
    articles = [("orders", "orders", None, "region")]
    subscriptions = [("orders", "north", 0, None), ("orders", "east", 10, 21), ("orders", "west", 30, None)]
    plan = plan_from_rows("r1", Role.CONSOLIDATED, articles, subscriptions)
    assert plan.articles == {"orders": (None, "region", frozenset({"north", "west"}))}
    assert plan.history == ((10, {"orders": (None, "region", frozenset({"north"}))}),
                            (21, {"orders": (None, "region", frozenset({"north", "east"}))}),
                            (30, {"orders": (None, "region", frozenset({"north"}))}))
    assert plan_from_rows("r1", Role.CONSOLIDATED, articles, [("orders", "north")]).history == ()


def test_unsubscribing_a_value_not_held_is_refused_and_subscribing_twice_changes_nothing(world):
    hq, _ = world
    end = hq.log_end()
    with pytest.raises(InvalidSetting, match=r"'r1' does not subscribe to 'orders' with 'east'; its subscriptions: "
                                             r"orders='north'"):
        hq.unsubscribe("r1", "orders", "east")
    assert not hq.subscribe("r1", "orders", "north").changed
    assert hq.log_end() == end


def test_truncation_forgets_ended_subscriptions_once_no_read_can_reach_them(world):
    hq, _ = world
    change = hq.unsubscribe("r1", "orders", "north")
    hq.subscribe("r1", "orders", "south")

    def spans():
        return hq.connection.execute("SELECT value, since, until FROM fieldsync_subscription WHERE remote = 'r1'"
                                     " ORDER BY rowid").fetchall()

    assert spans()[0] == ("north", 0, change.offset + 1)
    end = hq.log_end()
    for name in ("r1", "r2"):
        hq.update_remote(name, log_sent=end, log_send=end, confirm_sent=end)
    assert hq.truncate_log() == end
    assert spans() == [("south", 0, None)]


def test_a_site_of_layout_8_gains_the_spans_when_opened(tmp_path):
    path = tmp_path / "hq.db"
    with SiteDatabase.init(path, name="hq", role="consolidated") as site:
        site.connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, region TEXT)")
        site.create_publication("p", ["t"])
        site.add_remote("r1")
        site.subscribe("r1", "p")
    fresh = tmp_path / "fresh.db"
    SiteDatabase.init(fresh, name="hq", role="consolidated").close()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("ALTER TABLE fieldsync_subscription DROP COLUMN since")
        conn.execute("ALTER TABLE fieldsync_subscription DROP COLUMN until")
        conn.execute("UPDATE fieldsync_site SET schema_version = 8")
        conn.commit()
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        assert site.connection.execute("SELECT since, until FROM fieldsync_subscription").fetchall() == [(0, None)]
        assert [item.publication for item in site.subscriptions("r1")] == ["p"]
    with contextlib.closing(sqlite3.connect(path)) as upgraded, contextlib.closing(sqlite3.connect(fresh)) as new:
        assert (upgraded.execute("PRAGMA table_info(fieldsync_subscription)").fetchall()
                == new.execute("PRAGMA table_info(fieldsync_subscription)").fetchall())
