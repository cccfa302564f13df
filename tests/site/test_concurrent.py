"""Concurrent changes to one row at the consolidated and a remote, with the
messages and confirmations of each direction arriving in the orders that
matter (docs/site-database.md, "Concurrent changes"): the unconfirmed rule
at the consolidated, a remote's pending changes, and a randomized model of
sites running like ``agent run --once``."""

from __future__ import annotations

import os
import random
import sqlite3

import pytest

from agent.site import Article, SiteDatabase

from .conftest import ORDERS, REGIONS, app_connection, decoded, make_site, orders_world, table_rows



@pytest.fixture
def sites(tmp_path):
    """hq and two remotes made by extraction; ids 3, 6, 9, 12 are north
    (r1), 1, 4, 7, 10 south (r2), the rest east."""
    hq, remotes = orders_world(tmp_path, 12)
    yield hq, remotes
    for site in (hq, *remotes.values()):
        site.close()


def write(site: SiteDatabase, *statements: str) -> None:
    app = app_connection(site)
    app.execute("BEGIN")
    for statement in statements:
        app.execute(statement)
    app.execute("COMMIT")
    app.close()


def send(publisher: SiteDatabase, subscriber: SiteDatabase):
    """The publisher reads what is due for the subscriber: a message on its way."""
    name = subscriber.identity.name
    end = publisher.scan()
    start = publisher.remote(name).log_sent
    publisher.record_send(name, log_sent=end)
    return [decoded(transaction) for transaction in publisher.read_log(name, start, end)], end


def deliver(subscriber: SiteDatabase, publisher: SiteDatabase, message) -> None:
    transactions, end = message
    subscriber.apply(publisher.identity.name, transactions, log_received=end)


def confirm(publisher: SiteDatabase, subscriber: SiteDatabase) -> None:
    """The subscriber's confirmation of what it applied reaches the publisher."""
    name = subscriber.identity.name
    value = subscriber.remote(publisher.identity.name).log_received
    row = publisher.remote(name)
    if min(value, row.log_sent) > row.confirm_sent:
        publisher.update_remote(name, confirm_sent=min(value, row.log_sent))


def settle(hq: SiteDatabase, remotes: dict[str, SiteDatabase], rounds: int = 3) -> None:
    for _ in range(rounds):
        for remote in remotes.values():
            deliver(hq, remote, send(remote, hq))
            confirm(remote, hq)
        for remote in remotes.values():
            deliver(remote, hq, send(hq, remote))
            confirm(hq, remote)


def assert_converged(hq, remotes):
    for name, remote in remotes.items():
        assert table_rows(remote, "orders") == table_rows(hq, "orders", f"WHERE region = '{REGIONS[name]}'"), name


def returned_rows(site: SiteDatabase) -> int:
    return site.connection.execute("SELECT count(*) FROM fieldsync_capture WHERE flags & 1").fetchone()[0]


# --- the consolidated's operation is still on its way when the remote changes the row


def test_an_older_update_of_another_column_on_its_way(sites):
    """hq changed qty, r1 changed note before receiving it: no conflict at hq,
    but hq's UPDATE reaches r1 after r1's change, so the row goes back."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET note = 'r1' WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    assert hq.conflicts() == () and returned_rows(hq) == 1
    deliver(r1, hq, on_its_way)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 50, "r1")]
    assert_converged(hq, remotes)


def test_an_older_update_of_the_same_column_undone_at_the_consolidated(sites):
    """hq changed qty and changed it back before r1's change arrived: r1's
    change applies without a conflict, yet hq's two UPDATEs reach r1 after
    its change and would leave it with the old value."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    hq.scan()
    write(hq, "UPDATE orders SET qty = 1 WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 7 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    assert hq.conflicts() == () and returned_rows(hq) == 1
    deliver(r1, hq, on_its_way)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(hq, "orders", "WHERE id = 3") == table_rows(r1, "orders", "WHERE id = 3") == [
        (3, "north", 7, "seed")]
    assert_converged(hq, remotes)


def test_two_changes_the_first_conflicting(sites):
    """r1's first change conflicts at hq (its result goes back), its second
    applies cleanly; the result of the first is itself on its way to r1,
    so the second goes back too and r1 ends with its second change."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET qty = 50, note = 'hq' WHERE id = 3")
    hq_update = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 18 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    assert len(hq.conflicts()) == 1
    first_result = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 80 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    assert len(hq.conflicts()) == 1  # the second matched what hq had
    assert returned_rows(hq) == 2
    for message in (hq_update, first_result, send(hq, r1)):
        deliver(r1, hq, message)
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 80, "hq")]
    assert_converged(hq, remotes)


def test_a_row_sent_back_carries_the_remote_s_later_change_of_the_batch(sites):
    """r1 applies hq's change while its own two are pending (it keeps them)
    and confirms it; at hq r1's first change conflicts, its second (in the
    same batch) applies, and nothing is unconfirmed.  r1 then writes the
    first value again.  The row going back carries r1's second value as its
    before-image, so r1 keeps its third change (pending) instead of taking
    it for one the row was written with."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    hq_update = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 7 WHERE id = 3")
    write(r1, "UPDATE orders SET qty = 8 WHERE id = 3")
    deliver(r1, hq, hq_update)
    confirm(hq, r1)
    deliver(hq, r1, send(r1, hq))
    assert len(hq.conflicts()) == 1
    write(r1, "UPDATE orders SET qty = 7 WHERE id = 3")
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 7, "seed")]
    settle(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 7, "seed")]
    assert_converged(hq, remotes)


def test_a_remote_writes_a_column_back_to_the_value_the_update_on_its_way_shows(sites):
    """r1 set qty 6 (settled), hq then changed the row, r1 changed it twice
    meanwhile, back to qty 6 the second time.  hq's UPDATE shows qty 6 in
    its before-image, as if written after r1's last change, but its note
    shows it was written before that change: r1 keeps every column of that
    change, qty included, and ends with its last change, as hq does."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(r1, "UPDATE orders SET qty = 6, note = 'a' WHERE id = 3")
    settle(hq, remotes)
    write(hq, "UPDATE orders SET qty = 2, note = 'hq' WHERE id = 3")
    hq_update = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 5, note = 'b' WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    write(r1, "UPDATE orders SET qty = 6, note = 'c' WHERE id = 3")
    deliver(r1, hq, hq_update)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 6, "c")]
    deliver(hq, r1, send(r1, hq))
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 6, "c")]
    settle(hq, remotes)
    assert_converged(hq, remotes)


def test_a_remote_writes_a_column_back_to_the_value_a_delete_on_its_way_shows(sites):
    """hq deleted and re-created row 3 while r1 changed it twice, back to
    qty 1 the second time.  The DELETE's before-image shows qty 1, as if
    written after r1's last change, but its note shows otherwise: the
    re-created row gets every column of r1's change, qty included."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write_steps(hq, "DELETE FROM orders WHERE id = 3 / INSERT INTO orders VALUES (3, 'north', 2, 'again')")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 8, note = 'a' WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    write(r1, "UPDATE orders SET qty = 1, note = 'b' WHERE id = 3")
    deliver(r1, hq, on_its_way)
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 1, "b")]
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 1, "b")]
    deliver(hq, r1, send(r1, hq))
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 1, "b")]
    settle(hq, remotes)
    assert_converged(hq, remotes)


@pytest.mark.parametrize("again", [False, True], ids=["a new value", "a value written before"])
def test_an_update_of_one_column_written_on_a_value_the_remote_writes_again(sites, again):
    """hq changed the note of a row while r1's change of it was on its way,
    and r1 then wrote the note again: an UPDATE of that one column, its
    before-image the note r1 wrote at first.  With a new value r1 keeps
    it (the UPDATE was written without it) and the sites converge.  Written
    a second time, the value is the one the UPDATE was written on, and no
    other column shows otherwise: r1 takes the UPDATE, then the conflict's
    result (r1's earlier change), and hq applies r1's last change on that:
    the value coincidence docs/site-database.md leaves ("What is left",
    under "Concurrent changes"), which is why every value the fault suite
    writes is new."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(r1, "UPDATE orders SET note = 'a' WHERE id = 3")
    settle(hq, remotes)
    write(r1, "UPDATE orders SET note = 'b' WHERE id = 3")
    r1_change = send(r1, hq)
    write(hq, "UPDATE orders SET note = 'hq' WHERE id = 3")
    hq_update = send(hq, r1)
    deliver(hq, r1, r1_change)
    assert len(hq.conflicts()) == 1  # incoming wins: hq holds 'b', and sends it back
    last = "a" if again else "c"
    write(r1, f"UPDATE orders SET note = '{last}' WHERE id = 3")
    deliver(r1, hq, hq_update)
    deliver(r1, hq, send(hq, r1))
    confirm(hq, r1)
    deliver(hq, r1, send(r1, hq))
    settle(hq, remotes)
    if again:
        assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 1, "b")]
        assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 1, "a")]
    else:
        assert table_rows(r1, "orders", "WHERE id = 3") == table_rows(hq, "orders", "WHERE id = 3") == [
            (3, "north", 1, "c")]
        assert_converged(hq, remotes)


@pytest.mark.parametrize("how", ["re-created", "moved out and back"])
def test_the_consolidated_recreates_the_row_while_a_remote_change_is_on_its_way(sites, how):
    """hq deletes and re-creates the row (or moves it out of r1's subset and
    back) in two log transactions; r1 changes it before receiving them.
    r1's change applies to the new row at hq; the DELETE and full-row
    INSERT reach r1 after its change, and the row goes back after them."""
    hq, remotes = sites
    r1 = remotes["r1"]
    if how == "re-created":
        write(hq, "DELETE FROM orders WHERE id = 3")
        hq.scan()
        write(hq, "INSERT INTO orders VALUES (3, 'north', 1, 'new')")
    else:
        write(hq, "UPDATE orders SET region = 'east' WHERE id = 3")
        hq.scan()
        write(hq, "UPDATE orders SET region = 'north', note = 'back' WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 7 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    deliver(r1, hq, on_its_way)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(hq, "orders", "WHERE id = 3")[0][2] == 7
    assert_converged(hq, remotes)
    assert all(site.apply_errors() == () for site in (hq, r1))


# --- the remote applied the consolidated's operations after its change, and its
# --- confirmation reached the consolidated before the change did


@pytest.mark.parametrize("how", ["re-created", "moved out and back", "changed and changed back"])
def test_the_confirmation_overtakes_the_remote_change(sites, how):
    """The usual order of one run of r1's agent: its change is cut, then
    hq's operations are applied, then r1 sends the change and a
    confirmation, and hq reads the confirmation first.  hq cannot tell
    that r1 applied its operations after the change, so r1 keeps its own
    value against operations written without it."""
    hq, remotes = sites
    r1 = remotes["r1"]
    if how == "re-created":
        write(hq, "DELETE FROM orders WHERE id = 3")
        hq.scan()
        write(hq, "INSERT INTO orders VALUES (3, 'north', 1, 'new')")
    elif how == "moved out and back":
        write(hq, "UPDATE orders SET region = 'east' WHERE id = 3")
        hq.scan()
        write(hq, "UPDATE orders SET region = 'north', note = 'back' WHERE id = 3")
    else:
        write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
        hq.scan()
        write(hq, "UPDATE orders SET qty = 1 WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 7 WHERE id = 3")
    deliver(r1, hq, on_its_way)
    assert table_rows(r1, "orders", "WHERE id = 3")[0][2] == 7
    confirm(hq, r1)
    deliver(hq, r1, send(r1, hq))
    assert returned_rows(hq) == 0  # nothing unconfirmed: no row goes back
    settle(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id = 3")[0][2] == 7
    assert_converged(hq, remotes)
    assert all(site.apply_errors() == () for site in (hq, r1))


def test_a_remote_keeps_a_row_it_deleted_against_a_concurrent_insert(sites):
    """r1 deletes a row while hq re-creates it; r1 applies the re-creation
    after its DELETE and confirms before its DELETE reaches hq, which then
    deletes the new row: r1 must not keep it."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "DELETE FROM orders WHERE id = 3")
    hq.scan()
    write(hq, "INSERT INTO orders VALUES (3, 'north', 1, 'new')")
    on_its_way = send(hq, r1)
    write(r1, "DELETE FROM orders WHERE id = 3")
    deliver(r1, hq, on_its_way)
    assert table_rows(r1, "orders", "WHERE id = 3") == []
    confirm(hq, r1)
    settle(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id = 3") == []
    assert_converged(hq, remotes)


def test_a_remote_moving_its_row_out_and_back_while_the_delete_is_on_its_way(sites):
    """r1 moves its row to another region (hq sends it a DELETE, since r1
    still holds a row outside its subset) and back before that DELETE
    arrives: the row is whole again at r1 once everything has arrived."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(r1, "UPDATE orders SET region = 'east' WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    delete_on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET region = 'north', qty = 4 WHERE id = 3")
    deliver(r1, hq, delete_on_its_way)
    confirm(hq, r1)
    deliver(hq, r1, send(r1, hq))
    settle(hq, remotes)
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 4, "seed")]
    assert_converged(hq, remotes)
    assert r1.apply_errors() == ()


def test_the_remote_truncated_its_own_change_before_the_older_operation_arrived(sites):
    """hq's UPDATE is delayed; r1's change reaches hq (a conflict), is
    confirmed, and r1 truncates its log past it; then hq's UPDATE and the
    conflict's result arrive, in that order."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    delayed = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 5 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    write(r1, "UPDATE orders SET qty = 6 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    write(r1, "UPDATE orders SET note = 'later' WHERE id = 6")
    deliver(hq, r1, send(r1, hq))
    confirm(r1, hq)
    assert r1.truncate_log() > 0
    deliver(r1, hq, delayed)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(hq, "orders", "WHERE id = 3") == table_rows(r1, "orders", "WHERE id = 3") == [
        (3, "north", 6, "seed")]
    assert_converged(hq, remotes)


def test_a_row_back_whole_after_the_consolidated_applied_the_change_whose_confirmation_comes_late(sites):
    """hq moves row 3 out of r1's subset (r1 gets a DELETE) while r1 changes
    its note and writes a row for another region; hq applies the change
    (the other region's row goes back to r1 as a DELETE, written with r1's
    change applied), then changes the note itself and moves row 3 back (r1
    gets it whole).  r1 gets all of it before the confirmation of its
    change: the row written back says that hq had applied it, so r1 takes
    row 3 as hq holds it instead of putting its own note, which the DELETE
    was written without, back into it (docs/protocol.md, "What a data
    message says of the recipient's own changes")."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET region = 'east' WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET note = 'r1' WHERE id = 3", "INSERT INTO orders VALUES (100, 'east', 1, 'r1')")
    change = send(r1, hq)
    deliver(r1, hq, on_its_way)  # a DELETE written without r1's note: r1 marks it
    deliver(hq, r1, change)
    applied = r1.remote("hq").log_sent
    written_back = [t for t in hq.read_log("r1", hq.remote("r1").log_sent) if t.origin == "r1"]
    assert [(t.applied, [(op.kind, op.key) for op in t.ops]) for t in written_back] == [(applied, [(3, (100,))])]
    write(hq, "UPDATE orders SET note = 'hq', region = 'north' WHERE id = 3")
    deliver(r1, hq, send(hq, r1))  # before the confirmation of r1's change
    assert table_rows(r1, "orders", "WHERE id = 3") == [(3, "north", 1, "hq")]
    confirm(hq, r1)
    settle(hq, remotes)
    assert table_rows(hq, "orders", "WHERE id = 3") == [(3, "north", 1, "hq")]
    assert_converged(hq, remotes)


def test_no_row_goes_back_when_the_remote_has_confirmed_everything(sites):
    """The rule costs nothing in the common case: a remote that has
    confirmed the consolidated's log gets none of its own changes back."""
    hq, remotes = sites
    r1 = remotes["r1"]
    settle(hq, remotes)
    write(r1, "UPDATE orders SET qty = 2 WHERE id = 3", "INSERT INTO orders VALUES (100, 'north', 1, 'r1')")
    write(hq, "UPDATE orders SET qty = 9 WHERE id = 6")  # another row
    deliver(hq, r1, send(r1, hq))
    assert returned_rows(hq) == 0
    assert [op for t in hq.read_log("r1", hq.remote("r1").log_sent) for op in t.ops if op.key != (6,)] == []


# --- a randomized model of agents running -----------------------------------------------


def run_model(root, seed: int, steps: int = 250, key_changes: bool = False) -> list[str]:
    """hq, r1 and r2 write at random (updates, moves between subsets,
    deletes, inserts; hq also deletes and re-creates rows and moves them out
    and back across scans) and run like ``agent run --once``: receive a
    peer's pending controls, then its data in order; send data, then a
    control; truncate.  Links go down for a while at random (messages pile
    up and arrive together).  With ``key_changes``, every site also gives
    rows new keys.  Returns the differences left once all is delivered."""
    rng = random.Random(seed)
    root.mkdir()
    hq = make_site(root, "hq", "consolidated", ORDERS)
    hq.create_publication("orders", [Article("orders", subscribe_by="region")])
    write(hq, *[f"INSERT INTO orders VALUES ({i}, '{['north', 'south', 'east'][i % 3]}', 1, 'seed')"
                for i in range(1, 13)])
    sites = {"hq": hq}
    for name, region in REGIONS.items():
        hq.add_remote(name)
        hq.subscribe(name, "orders", region)
        hq.extract(name, root / f"{name}.db")
        sites[name] = SiteDatabase.open(root / f"{name}.db")
    peers = {"hq": list(REGIONS), "r1": ["hq"], "r2": ["hq"]}
    inbox: dict[tuple[str, str], list] = {(sender, to): [] for sender in sites for to in peers[sender]}
    down = dict.fromkeys(inbox, 0)
    next_id = {"hq": 1000, "r1": 2000, "r2": 3000}

    def run_site(name: str, everything: bool = False) -> None:
        site = sites[name]
        for peer in peers[name]:
            if down[(peer, name)] and not everything:
                continue
            messages, inbox[(peer, name)] = inbox[(peer, name)], []
            for kind, payload in messages:
                if kind == "control":
                    row = site.remote(peer)
                    if min(payload, row.log_sent) > row.confirm_sent:
                        site.update_remote(peer, confirm_sent=min(payload, row.log_sent))
            for kind, payload in messages:
                if kind == "data":
                    site.apply(peer, [decoded(t) for t in payload[0]], log_received=payload[1])
        end = site.scan()
        for peer in peers[name]:
            start = site.remote(peer).log_sent
            if end > start:
                inbox[(name, peer)].append(("data", (list(site.read_log(peer, start, end)), end)))
                site.record_send(peer, log_sent=end)
            inbox[(name, peer)].append(("control", site.remote(peer).log_received))
        site.truncate_log()

    def local_write(name: str) -> None:
        site = sites[name]
        app = sqlite3.connect(site.path, isolation_level=None)
        ids = [row[0] for row in app.execute("SELECT id FROM orders")]
        roll = rng.random()
        next_id[name] += 1
        if roll < 0.15 or not ids:
            region = REGIONS.get(name) or rng.choice(["north", "south", "east"])
            app.execute("INSERT INTO orders VALUES (?, ?, ?, ?)", (next_id[name], region, rng.randint(1, 9), name))
        elif roll < 0.6:
            app.execute("UPDATE orders SET qty = ?, note = ? WHERE id = ?",
                        (rng.randint(1, 9), f"{name}{next_id[name]}", rng.choice(ids)))
        elif roll < 0.72:
            app.execute("UPDATE orders SET region = ? WHERE id = ?",
                        (rng.choice(["north", "south", "east"]), rng.choice(ids)))
        elif roll < 0.8:
            app.execute("DELETE FROM orders WHERE id = ?", (rng.choice(ids),))
        elif key_changes and roll < 0.9:
            app.execute("UPDATE orders SET id = ? WHERE id = ?", (next_id[name], rng.choice(ids)))
        elif name == "hq":
            victim = rng.choice(ids)
            region = app.execute("SELECT region FROM orders WHERE id = ?", (victim,)).fetchone()[0]
            if rng.random() < 0.5:
                app.execute("DELETE FROM orders WHERE id = ?", (victim,))
                hq.scan()
                app.execute("INSERT INTO orders VALUES (?, ?, ?, 're-created')", (victim, region, rng.randint(1, 9)))
            else:
                app.execute("UPDATE orders SET region = 'east' WHERE id = ?", (victim,))
                hq.scan()
                app.execute("UPDATE orders SET region = ? WHERE id = ?", (region, victim))
        app.close()

    try:
        for _ in range(steps):
            roll = rng.random()
            if roll < 0.5:
                local_write(rng.choice(list(sites)))
            elif roll < 0.92:
                run_site(rng.choice(list(sites)))
            else:
                down[rng.choice(list(inbox))] = rng.randint(1, 15)
            for link in down:
                down[link] = max(0, down[link] - 1)
        for _ in range(4):
            for name in sites:
                run_site(name, everything=True)
        differences = []
        for name, region in REGIONS.items():
            held = set(table_rows(sites[name], "orders"))
            wanted = set(table_rows(hq, "orders", f"WHERE region = '{region}'"))
            if held != wanted:
                differences.append(f"seed {seed}, {name}: extra {sorted(held - wanted)}, "
                                   f"missing {sorted(wanted - held)}")
        return differences
    finally:
        for site in sites.values():
            site.close()


# How many seeds each randomized model runs (FIELDSYNC_MODEL_SEEDS, see docs/testing.md).
MODEL_SEEDS = int(os.environ.get("FIELDSYNC_MODEL_SEEDS", "12"))


def test_random_concurrent_work_of_running_agents_converges(tmp_path):
    differences = []
    for seed in range(MODEL_SEEDS):
        differences += run_model(tmp_path / f"seed{seed}", seed)
    assert differences == []


# hq's change, r1's change made before it arrives, and the rows 3, 30, 40, 41 both end with.
KEY_CASES = [
    # r1 moved the row; hq's change of it misses r1's row, and hq's state goes back.
    ("DELETE FROM orders WHERE id = 3", "UPDATE orders SET id = 30 WHERE id = 3", []),
    ("UPDATE orders SET qty = 50 WHERE id = 3", "UPDATE orders SET id = 30 WHERE id = 3; "
     "UPDATE orders SET note = 'r1' WHERE id = 30", [(30, "north", 50, "r1")]),
    # hq moved the row: r1's change applies to it under its new key (both
    # moving it is a conflict, which the incoming change wins by default).
    ("UPDATE orders SET id = 40 WHERE id = 3", "UPDATE orders SET id = 30 WHERE id = 3",
     [(30, "north", 1, "seed")]),
    ("UPDATE orders SET id = 40 WHERE id = 3; UPDATE orders SET qty = 9 WHERE id = 40",
     "UPDATE orders SET id = 30 WHERE id = 3", [(30, "north", 9, "seed")]),
    ("UPDATE orders SET id = 40 WHERE id = 3", "DELETE FROM orders WHERE id = 3", []),
    ("UPDATE orders SET id = 40 WHERE id = 3", "UPDATE orders SET note = 'r1' WHERE id = 3",
     [(40, "north", 1, "r1")]),
    ("UPDATE orders SET id = 40 WHERE id = 3; UPDATE orders SET id = 41 WHERE id = 40",
     "UPDATE orders SET qty = 7 WHERE id = 3", [(41, "north", 7, "seed")]),
    # hq moved the row onto a key r1 inserted meanwhile: hq keeps its row
    # there (r1's INSERT of an existing key), r1 drops its own for it.
    ("UPDATE orders SET id = 40 WHERE id = 3", "INSERT INTO orders VALUES (40, 'north', 7, 'r1')",
     [(40, "north", 1, "seed")]),
    # hq re-created the row r1 moved (" / ": separate log transactions): the move
    # applies to the new row, whose values r1 takes under its new key.
    ("DELETE FROM orders WHERE id = 3 / INSERT INTO orders VALUES (3, 'north', 5, 'again')",
     "UPDATE orders SET id = 30 WHERE id = 3", [(30, "north", 5, "again")]),
]


def write_steps(site: SiteDatabase, steps: str) -> None:
    """Write ``steps``: log transactions separated by " / " (the site scans
    after each), statements by "; "."""
    for transaction in steps.split(" / "):
        write(site, *transaction.split("; "))
        site.scan()


def test_a_remote_changes_the_key_while_an_update_of_the_row_is_on_its_way(sites):
    """hq changed qty of row 3, r1 gave row 3 the key 30 before receiving it:
    no conflict at hq (r1's before-image holds), but hq's UPDATE of row 3
    finds no row 3 at r1, so row 30 goes back whole."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET qty = 50 WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET id = 30 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    assert hq.conflicts() == ()
    assert table_rows(hq, "orders", "WHERE id IN (3, 30)") == [(30, "north", 50, "seed")]
    deliver(r1, hq, on_its_way)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id IN (3, 30)") == [(30, "north", 50, "seed")]
    assert_converged(hq, remotes)


@pytest.mark.parametrize("at_hq, at_r1, expected", KEY_CASES)
@pytest.mark.parametrize("confirmed", [False, True], ids=["pending", "confirmed"])
def test_concurrent_key_changes_converge(sites, at_hq, at_r1, expected, confirmed):
    """hq's change is on its way to r1 when r1 changes the row; either of
    them changes its key.  r1's change applies to the row under the key hq
    gave it (or fails, when hq deleted it: an apply error), and r1 ends
    with hq's rows, whether or not the confirmation of its change has
    reached it when hq's data does."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write_steps(hq, at_hq)
    on_its_way = send(hq, r1)
    write_steps(r1, at_r1)
    deliver(hq, r1, send(r1, hq))
    assert table_rows(hq, "orders", "WHERE id IN (3, 30, 40, 41)") == expected
    if confirmed:
        confirm(r1, hq)
    deliver(r1, hq, on_its_way)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id IN (3, 30, 40, 41)") == expected
    assert_converged(hq, remotes)
    settle(hq, remotes)
    assert_converged(hq, remotes)


def test_random_concurrent_work_with_key_changes_converges(tmp_path):
    differences = []
    for seed in range(MODEL_SEEDS):
        differences += run_model(tmp_path / f"seed{seed}", seed, key_changes=True)
    assert differences == []


@pytest.mark.parametrize("at_hq, at_r1, expected", KEY_CASES)
def test_concurrent_key_changes_applied_first_at_the_remote(sites, at_hq, at_r1, expected):
    """The same changes, with hq's change reaching r1 first: r1 applies it
    while its own change is pending and confirms it before its change
    reaches hq, so hq sees nothing unconfirmed.  An UPDATE of a key r1
    moved applies to r1's row under the new key; a row r1 moved that hq
    no longer holds goes back as a DELETE."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write_steps(hq, at_hq)
    on_its_way = send(hq, r1)
    write_steps(r1, at_r1)
    deliver(r1, hq, on_its_way)
    confirm(hq, r1)
    deliver(hq, r1, send(r1, hq))
    assert table_rows(hq, "orders", "WHERE id IN (3, 30, 40, 41)") == expected
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id IN (3, 30, 40, 41)") == expected
    assert_converged(hq, remotes)


@pytest.mark.parametrize("first", ["hq's move at r1", "r1's move at hq"])
def test_both_move_a_row_onto_one_key(sites, first):
    """hq gave row 3 the key 40 while r1 gave row 6 the key 40.  hq keeps its
    row there and refuses r1's move (an apply error), sending row 6 and row
    40 back whole; r1 drops its row 40 when it applies hq's move.  Both end
    with rows 6 and 40 as hq has them.  (Confirmations reach r1 before
    hq's data, as in the agent: before it, the INSERT of row 6 sent back
    would meet r1's pending move of row 6, the lost-confirmation case.)"""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET id = 40 WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET id = 40 WHERE id = 6")
    if first == "hq's move at r1":
        deliver(r1, hq, on_its_way)
        assert table_rows(r1, "orders", "WHERE id IN (3, 6, 40)") == [(40, "north", 1, "seed")]
        confirm(hq, r1)
        deliver(hq, r1, send(r1, hq))
    else:
        deliver(hq, r1, send(r1, hq))
        deliver(r1, hq, on_its_way)
    assert [error.problem for error in hq.apply_errors()] == [
        "constraint failed: UNIQUE constraint failed: orders.id"]
    assert table_rows(hq, "orders", "WHERE id IN (3, 6, 40)") == [(6, "north", 1, "seed"), (40, "north", 1, "seed")]
    confirm(r1, hq)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id IN (3, 6, 40)") == [(6, "north", 1, "seed"), (40, "north", 1, "seed")]
    assert_converged(hq, remotes)
    settle(hq, remotes)
    assert_converged(hq, remotes)


@pytest.mark.parametrize("reopen", [False, True], ids=["running", "reopened"])
def test_pending_changes_follow_the_consolidated_s_change_of_the_key(sites, reopen):
    """hq gave row 3 the key 40; r1 changed qty twice before receiving that.
    hq applies the first change to row 40 and sends row 40 back; r1 applies
    the move to its row and its second change stays pending under key 40
    (also once r1 is opened again), so the row sent back (written without
    it) does not overwrite it."""
    hq, remotes = sites
    r1 = remotes["r1"]
    write(hq, "UPDATE orders SET id = 40 WHERE id = 3")
    on_its_way = send(hq, r1)
    write(r1, "UPDATE orders SET qty = 7 WHERE id = 3")
    deliver(hq, r1, send(r1, hq))
    write(r1, "UPDATE orders SET qty = 8 WHERE id = 3")
    deliver(r1, hq, on_its_way)
    if reopen:
        r1.close()
        r1 = remotes["r1"] = SiteDatabase.open(r1.path)
    deliver(r1, hq, send(hq, r1))
    assert table_rows(r1, "orders", "WHERE id IN (3, 40)") == [(40, "north", 8, "seed")]
    deliver(hq, r1, send(r1, hq))
    assert table_rows(hq, "orders", "WHERE id IN (3, 40)") == [(40, "north", 8, "seed")]
    settle(hq, remotes)
    assert_converged(hq, remotes)
