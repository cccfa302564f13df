"""Scenarios across a consolidated and two remotes made by extraction:
conflicts, rows moving between remotes, and random offline work that must
converge to the consolidated's state."""

from __future__ import annotations

import random

import pytest


from .conftest import REGIONS, app_connection, orders_world, replicate, table_rows



@pytest.fixture
def sites(tmp_path):
    hq, remotes = orders_world(tmp_path, 40)
    yield hq, remotes
    for site in (hq, *remotes.values()):
        site.close()


def full_round(hq, remotes):
    for remote in remotes.values():
        replicate(remote, hq)
    for remote in remotes.values():
        replicate(hq, remote)


def assert_converged(hq, remotes):
    for name, remote in remotes.items():
        assert table_rows(remote, "orders") == table_rows(hq, "orders", f"WHERE region = '{REGIONS[name]}'"), name


def test_concurrent_updates_converge_on_the_incoming_change(sites):
    """hq and r1 change the same column of the same row while apart.  The
    consolidated applies r1's change (default policy) and sends the result
    back, so r1 does not end up with hq's older value."""
    hq, remotes = sites
    app_connection(hq).execute("UPDATE orders SET qty = 50, note = 'hq' WHERE id = 3")
    app_connection(remotes["r1"]).execute("UPDATE orders SET qty = 70 WHERE id = 3")
    full_round(hq, remotes)
    assert len(hq.conflicts()) == 1
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 70, "hq")]
    assert_converged(hq, remotes)
    full_round(hq, remotes)  # quiet round: nothing moves any more
    assert_converged(hq, remotes)
    assert hq.apply_errors() == () and all(r.apply_errors() == () for r in remotes.values())


def test_local_wins_converges_on_the_consolidated(sites):
    hq, remotes = sites
    hq.set_conflict_policy("orders", "local")
    app_connection(hq).execute("UPDATE orders SET qty = 50 WHERE id = 3")
    app_connection(remotes["r1"]).execute("UPDATE orders SET qty = 70 WHERE id = 3")
    full_round(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 50, "seed")]
    assert_converged(hq, remotes)


def test_a_row_handed_from_one_remote_to_another(sites):
    hq, remotes = sites
    app_connection(remotes["r1"]).execute("UPDATE orders SET region = 'south', note = 'handed over' WHERE id = 3")
    full_round(hq, remotes)
    assert table_rows(remotes["r2"], "orders", "WHERE id = 3") == [(3, "south", 1, "handed over")]
    assert table_rows(remotes["r1"], "orders", "WHERE id = 3") == []
    assert_converged(hq, remotes)


def test_random_offline_work_converges(sites):
    hq, remotes = sites
    rng = random.Random(77)
    next_id = {"hq": 10_000, "r1": 20_000, "r2": 30_000}
    everyone = {"hq": hq, **remotes}
    for _round in range(8):
        for name, site in everyone.items():
            app = app_connection(site)
            ids = [row[0] for row in table_rows(site, "orders")]
            app.execute("BEGIN")
            for _ in range(rng.randint(1, 8)):
                roll = rng.random()
                if roll < 0.3 or not ids:
                    next_id[name] += 1
                    region = REGIONS.get(name) if rng.random() < 0.8 else rng.choice(["north", "south", "east"])
                    app.execute("INSERT INTO orders VALUES (?, ?, ?, ?)",
                                (next_id[name], region or rng.choice(["north", "south", "east"]), 1, name))
                    ids.append(next_id[name])
                elif roll < 0.75:
                    app.execute("UPDATE orders SET qty = ?, note = ? WHERE id = ?",
                                (rng.randint(1, 99), f"{name} {_round}", rng.choice(ids)))
                elif roll < 0.9:
                    app.execute("UPDATE orders SET region = ? WHERE id = ?",
                                (rng.choice(["north", "south", "east"]), rng.choice(ids)))
                else:
                    victim = rng.choice(ids)
                    ids.remove(victim)
                    app.execute("DELETE FROM orders WHERE id = ?", (victim,))
            app.execute("COMMIT")
        full_round(hq, remotes)
    full_round(hq, remotes)
    assert_converged(hq, remotes)
    # The streams are settled: everything sent was confirmed, nothing is due.
    for name in remotes:
        row = hq.remote(name)
        assert row.confirm_sent == row.log_sent == hq.log_end()


def test_two_changes_to_a_conflicting_row_in_one_batch(sites):
    """The result sent back after a conflict is the row after the whole
    batch, so r1's second change is not undone at r1."""
    hq, remotes = sites
    app_connection(hq).execute("UPDATE orders SET qty = 83 WHERE id = 3")
    r1 = app_connection(remotes["r1"])
    r1.execute("UPDATE orders SET qty = 18 WHERE id = 3")
    r1.execute("UPDATE orders SET qty = 80 WHERE id = 3")
    full_round(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 80, "seed")]
    assert_converged(hq, remotes)


def test_a_remote_moving_its_row_out_and_back(sites):
    hq, remotes = sites
    r2 = app_connection(remotes["r2"])
    r2.execute("BEGIN")
    r2.execute("INSERT INTO orders VALUES (30001, 'east', 1, 'new')")
    r2.execute("UPDATE orders SET region = 'south' WHERE id = 30001")
    r2.execute("UPDATE orders SET qty = 39 WHERE id = 30001")
    r2.execute("UPDATE orders SET region = 'east' WHERE id = 1")
    r2.execute("UPDATE orders SET region = 'south', qty = 2 WHERE id = 1")
    r2.execute("COMMIT")
    full_round(hq, remotes)
    assert table_rows(remotes["r2"], "orders", "WHERE id IN (1, 30001)") == [
        (1, "south", 2, "seed"), (30001, "south", 39, "new")]
    assert_converged(hq, remotes)


def test_consolidated_recreating_a_row_while_a_remote_changes_it(sites):
    """hq deletes and re-creates a row (or moves it away and back) in one
    transaction while r1 changes it: r1 gets an UPDATE of what differs, not
    a full row that would undo its own change."""
    hq, remotes = sites
    app = app_connection(hq)
    app.execute("BEGIN")
    app.execute("UPDATE orders SET region = 'south' WHERE id = 3")
    app.execute("UPDATE orders SET region = 'north' WHERE id = 3")
    app.execute("DELETE FROM orders WHERE id = 6")
    app.execute("INSERT INTO orders VALUES (6, 'north', 1, 're-created')")
    app.execute("COMMIT")
    r1 = app_connection(remotes["r1"])
    r1.execute("UPDATE orders SET qty = 53 WHERE id IN (3, 6)")
    full_round(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id IN (3, 6)") == [(3, "north", 53, "seed"), (6, "north", 53, "re-created")]
    assert_converged(hq, remotes)


def test_a_second_change_made_while_a_conflict_result_is_on_its_way(sites):
    """r1 changes a row hq changed too, sends it, and changes the row again
    before hearing back.  hq applies both (the first as a conflict); r1 keeps
    its second change when hq's older operations reach it."""
    hq, remotes = sites
    r1 = remotes["r1"]
    app_connection(hq).execute("UPDATE orders SET qty = 83, note = 'hq' WHERE id = 3")
    app_connection(r1).execute("UPDATE orders SET qty = 18 WHERE id = 3")
    replicate(r1, hq)
    app_connection(r1).execute("UPDATE orders SET qty = 80 WHERE id = 3")
    replicate(r1, hq)
    assert len(hq.conflicts()) == 1
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 80, "hq")]
    replicate(hq, r1)
    assert_converged(hq, remotes)
    full_round(hq, remotes)
    assert_converged(hq, remotes)
