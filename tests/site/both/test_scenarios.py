"""Scenarios across a consolidated of either backend and two SQLite
remotes made by extraction: conflicts, rows moving between remotes, and
random offline work that must converge to the consolidated's state.
Rounds go by hand (tests/site/conftest.py's ``replicate``), in both forms
decoded transactions take."""

from __future__ import annotations

import random

import pytest

from agent.site import Article, SiteDatabase
from tests.site.sessions import App

from ..conftest import app_connection, replicate, table_rows

REGIONS = {"r1": "north", "r2": "south"}


class World:
    def __init__(self, backend, tmp_path) -> None:  # type: ignore[no-untyped-def]
        self.backend = backend
        self.hq = backend.site
        backend.app().execute("CREATE TABLE orders (id integer PRIMARY KEY, region text NOT NULL, qty integer,"
                              " note text)")
        self.hq.create_publication("orders", [Article("orders", subscribe_by="region")])
        backend.app().run(*[("INSERT INTO orders VALUES (%s, %s, 1, 'seed')",
                             (row_id, ["north", "south", "east"][row_id % 3])) for row_id in range(1, 41)])
        self.remotes: dict[str, SiteDatabase] = {}
        for name, region in REGIONS.items():
            self.hq.add_remote(name)
            self.hq.subscribe(name, "orders", region)
            self.hq.extract(name, tmp_path / f"{name}.db")
            self.remotes[name] = SiteDatabase.open(tmp_path / f"{name}.db")
        self.apps = {"hq": backend.app(), **{name: App(app_connection(remote), True)
                                             for name, remote in self.remotes.items()}}

    def rows(self, name: str, where: str = "") -> list[tuple]:
        if name == "hq":
            return self.backend.rows("orders", "*", where)
        return table_rows(self.remotes[name], "orders", where)

    def full_round(self) -> None:
        for remote in self.remotes.values():
            replicate(remote, self.hq)
        for remote in self.remotes.values():
            replicate(self.hq, remote)

    def assert_converged(self) -> None:
        for name, region in REGIONS.items():
            assert self.rows(name) == self.rows("hq", f"WHERE region = '{region}'"), name

    def close(self) -> None:
        for remote in self.remotes.values():
            remote.close()


@pytest.fixture
def world(backend, tmp_path):
    made = World(backend, tmp_path)
    yield made
    made.close()


def test_concurrent_updates_converge_on_the_incoming_change(world):
    """hq and r1 change the same column of the same row while apart.  The
    consolidated applies r1's change (default policy) and sends the result
    back, so r1 does not end up with hq's older value."""
    world.apps["hq"].execute("UPDATE orders SET qty = 50, note = 'hq' WHERE id = 3")
    world.apps["r1"].execute("UPDATE orders SET qty = 70 WHERE id = 3")
    world.full_round()
    assert len(world.hq.conflicts()) == 1
    assert world.rows("hq", "WHERE id = 3") == [(3, "north", 70, "hq")]
    world.assert_converged()
    world.full_round()  # quiet round: nothing moves any more
    world.assert_converged()
    assert world.hq.apply_errors() == () and all(r.apply_errors() == () for r in world.remotes.values())


def test_local_wins_converges_on_the_consolidated(world):
    world.hq.set_conflict_policy("orders", "local")
    world.apps["hq"].execute("UPDATE orders SET qty = 50 WHERE id = 3")
    world.apps["r1"].execute("UPDATE orders SET qty = 70 WHERE id = 3")
    world.full_round()
    assert world.rows("hq", "WHERE id = 3") == [(3, "north", 50, "seed")]
    world.assert_converged()


def test_a_row_handed_from_one_remote_to_another(world):
    world.apps["r1"].execute("UPDATE orders SET region = 'south', note = 'handed over' WHERE id = 3")
    world.full_round()
    assert world.rows("r2", "WHERE id = 3") == [(3, "south", 1, "handed over")]
    assert world.rows("r1", "WHERE id = 3") == []
    world.assert_converged()


def test_random_offline_work_converges(world):
    rng = random.Random(77)
    next_id = {"hq": 10_000, "r1": 20_000, "r2": 30_000}
    for _round in range(8):
        for name in ("hq", *REGIONS):
            ids = [row[0] for row in world.rows(name)]
            statements: list[tuple[str, tuple]] = []
            for _ in range(rng.randint(1, 8)):
                roll = rng.random()
                if roll < 0.3 or not ids:
                    next_id[name] += 1
                    region = REGIONS.get(name) if rng.random() < 0.8 else rng.choice(["north", "south", "east"])
                    statements.append(("INSERT INTO orders VALUES (%s, %s, %s, %s)",
                                       (next_id[name], region or rng.choice(["north", "south", "east"]), 1, name)))
                    ids.append(next_id[name])
                elif roll < 0.75:
                    statements.append(("UPDATE orders SET qty = %s, note = %s WHERE id = %s",
                                       (rng.randint(1, 99), f"{name} {_round}", rng.choice(ids))))
                elif roll < 0.9:
                    statements.append(("UPDATE orders SET region = %s WHERE id = %s",
                                       (rng.choice(["north", "south", "east"]), rng.choice(ids))))
                else:
                    victim = rng.choice(ids)
                    ids.remove(victim)
                    statements.append(("DELETE FROM orders WHERE id = %s", (victim,)))
            world.apps[name].run(*statements)
        world.full_round()
    world.full_round()
    world.assert_converged()
    # The streams are settled: everything sent was confirmed, nothing is due.
    for name in REGIONS:
        row = world.hq.remote(name)
        assert row.confirm_sent == row.log_sent == world.hq.log_end()


def test_two_changes_to_a_conflicting_row_in_one_batch(world):
    """The result sent back after a conflict is the row after the whole
    batch, so r1's second change is not undone at r1."""
    world.apps["hq"].execute("UPDATE orders SET qty = 83 WHERE id = 3")
    world.apps["r1"].execute("UPDATE orders SET qty = 18 WHERE id = 3")
    world.apps["r1"].execute("UPDATE orders SET qty = 80 WHERE id = 3")
    world.full_round()
    assert world.rows("hq", "WHERE id = 3") == [(3, "north", 80, "seed")]
    world.assert_converged()


def test_a_remote_moving_its_row_out_and_back(world):
    world.apps["r2"].run("INSERT INTO orders VALUES (30001, 'east', 1, 'new')",
                         "UPDATE orders SET region = 'south' WHERE id = 30001",
                         "UPDATE orders SET qty = 39 WHERE id = 30001",
                         "UPDATE orders SET region = 'east' WHERE id = 1",
                         "UPDATE orders SET region = 'south', qty = 2 WHERE id = 1")
    world.full_round()
    assert world.rows("r2", "WHERE id IN (1, 30001)") == [(1, "south", 2, "seed"), (30001, "south", 39, "new")]
    world.assert_converged()


def test_consolidated_recreating_a_row_while_a_remote_changes_it(world):
    """hq deletes and re-creates a row (or moves it away and back) in one
    transaction while r1 changes it: r1 gets an UPDATE of what differs, not
    a full row that would undo its own change."""
    world.apps["hq"].run("UPDATE orders SET region = 'south' WHERE id = 3",
                         "UPDATE orders SET region = 'north' WHERE id = 3",
                         "DELETE FROM orders WHERE id = 6",
                         "INSERT INTO orders VALUES (6, 'north', 1, 're-created')")
    world.apps["r1"].execute("UPDATE orders SET qty = 53 WHERE id IN (3, 6)")
    world.full_round()
    assert world.rows("hq", "WHERE id IN (3, 6)") == [(3, "north", 53, "seed"), (6, "north", 53, "re-created")]
    world.assert_converged()


def test_a_second_change_made_while_a_conflict_result_is_on_its_way(world):
    """r1 changes a row hq changed too, sends it, and changes the row again
    before hearing back.  hq applies both (the first as a conflict); r1 keeps
    its second change when hq's older operations reach it."""
    r1 = world.remotes["r1"]
    world.apps["hq"].execute("UPDATE orders SET qty = 83, note = 'hq' WHERE id = 3")
    world.apps["r1"].execute("UPDATE orders SET qty = 18 WHERE id = 3")
    replicate(r1, world.hq)
    world.apps["r1"].execute("UPDATE orders SET qty = 80 WHERE id = 3")
    replicate(r1, world.hq)
    assert len(world.hq.conflicts()) == 1
    assert world.rows("hq", "WHERE id = 3") == [(3, "north", 80, "hq")]
    replicate(world.hq, r1)
    world.assert_converged()
    world.full_round()
    world.assert_converged()
