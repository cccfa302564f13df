"""Apply into PostgreSQL while the applications keep writing the same rows
(agent.site.postgres.apply.driver): a deadlock with an application's
transaction runs the whole message again, a message whose operations can
be read only once is refused instead, and under a steady load of
application writers no update is lost and every conflict recorded, and
only those, is one the row really had when the peer's change was written
(read back from the capture rows, which the triggers write under each
row's lock)."""

from __future__ import annotations

import logging
import random
import threading
import time
from collections import Counter

import psycopg
import pytest

from agent.site import SiteBusy
from agent.site.postgres.connect import connect
from codec.ops import Operation, Transaction

ROWS = 60
TABLE = ("CREATE TABLE account (id integer PRIMARY KEY, owner text NOT NULL, hits bigint NOT NULL DEFAULT 0,"
         " note text)")
RETRIED = (psycopg.errors.DeadlockDetected, psycopg.errors.SerializationFailure)
# The apply's session checks for a deadlock soon after it waits; the
# applications' much later, so that in a cycle the apply is the one refused.
APPLY_DEADLOCK_TIMEOUT = "200ms"
APP_DEADLOCK_TIMEOUT = "10s"


@pytest.fixture
def accounts(hq, app):
    app.execute(TABLE)
    app.execute("INSERT INTO account (id, owner) SELECT n, 'base-' || n FROM generate_series(1, %s) AS n", (ROWS,))
    hq.create_publication("bank", ["account"])
    hq.add_remote("r1")
    hq.update_remote("r1", log_sent=hq.scan(), confirm_sent=hq.log_end())
    hq.connection.execute(f"SET deadlock_timeout = '{APPLY_DEADLOCK_TIMEOUT}'")
    app.execute(f"SET deadlock_timeout = '{APP_DEADLOCK_TIMEOUT}'")
    return hq


def owner_message(round_number: int, first_commit: int, ops=tuple) -> list[Transaction]:
    """r1's change of every row's owner, in key order, in two transactions:
    from its value of round ``round_number - 1`` to the next."""
    def owner(row_id: int, number: int) -> str:
        return f"base-{row_id}" if number == 0 else f"r1-{number}-{row_id}"

    updates = [Operation.update("account", (row_id,), {"owner": owner(row_id, round_number - 1)},
                                {"owner": owner(row_id, round_number)}) for row_id in range(1, ROWS + 1)]
    half = ROWS // 2
    return [Transaction._trusted(first_commit, "r1", ops(updates[:half])),
            Transaction._trusted(first_commit + 1, "r1", ops(updates[half:]))]


def _wait_until_waiting(admin, pid: int, timeout: float = 20.0) -> None:
    """Until the session ``pid`` waits for a lock."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = admin.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        if found and found[0] == "Lock":
            return
        time.sleep(0.002)
    raise AssertionError(f"session {pid} never waited for a lock")


def _deadlock_while(hq, app, target, apply):  # type: ignore[no-untyped-def]
    """Run ``apply()`` in a thread while an application holds row 50 and,
    once the apply waits for it, asks for row 10, which the apply holds: a
    deadlock PostgreSQL breaks by refusing the apply's statement.  Returns
    what ``apply`` returned or raised."""
    outcome: list = []
    app.execute("BEGIN")
    app.execute("UPDATE account SET hits = hits + 1 WHERE id = 50")
    worker = threading.Thread(target=lambda: outcome.append(_call(apply)))
    worker.start()
    admin = connect(target)
    try:
        _wait_until_waiting(admin, hq.connection.info.backend_pid)
    finally:
        admin.close()
    app.execute("UPDATE account SET hits = hits + 1 WHERE id = 10")  # waits until the apply gives way
    app.execute("COMMIT")
    worker.join(60)
    assert not worker.is_alive()
    return outcome[0]


def _call(function):  # type: ignore[no-untyped-def]
    try:
        return function()
    except Exception as error:  # handed to the test
        return error


def test_a_deadlock_with_an_application_runs_the_whole_message_again(accounts, app, target, caplog):
    caplog.set_level(logging.WARNING, logger="fieldsync.site")
    message = owner_message(1, 5)
    result = _deadlock_while(accounts, app, target, lambda: accounts.apply("r1", message, log_received=6))
    assert not isinstance(result, Exception), result
    assert (result.transactions_applied, result.operations_applied, result.conflicts, result.errors) == (2, ROWS, 0, 0)
    retries = [record.getMessage() for record in caplog.records if "trying again" in record.getMessage()]
    assert len(retries) == 1 and "deadlock detected" in retries[0]
    assert app.execute("SELECT id, owner, hits FROM account WHERE id IN (10, 50) ORDER BY id").fetchall() == [
        (10, "r1-1-10", 1), (50, "r1-1-50", 1)]
    assert app.execute("SELECT count(*) FROM account WHERE owner = 'r1-1-' || id").fetchone()[0] == ROWS
    assert accounts.remote("r1").log_received == 6


def test_a_message_read_once_is_not_run_again_after_a_deadlock(accounts, app, target):
    message = owner_message(1, 5, ops=iter)  # a group of parts: its operations are read as they are applied
    result = _deadlock_while(accounts, app, target, lambda: accounts.apply("r1", message, log_received=6))
    assert isinstance(result, SiteBusy), result
    assert "deadlock detected once (its operations are read once)" in str(result)
    assert app.execute("SELECT count(*) FROM account WHERE owner LIKE 'r1-%'").fetchone()[0] == 0
    assert accounts.remote("r1").log_received == 0
    # The agent applies the message again at its next poll.
    assert accounts.apply("r1", owner_message(1, 5), log_received=6).operations_applied == ROWS


# Under a steady load both sides check soon and alike: whichever finds the
# cycle gives way (the applications try their transaction again, the
# apply its message).
LOAD_DEADLOCK_TIMEOUT = "50ms"


class Writers:
    """Application sessions: each transaction adds 1 to ``hits`` of a few
    rows, one in three in descending key order (the apply goes ascending),
    and now and then gives one of them an owner of its own."""

    def __init__(self, target, seed: int) -> None:
        self.target = target
        self.seed = seed
        self.hits: Counter[int] = Counter()
        self.committed = 0
        self.refused = 0
        self.errors: list[BaseException] = []
        self.done = threading.Event()
        self.lock = threading.Lock()

    def session(self, number: int) -> None:
        rng = random.Random(self.seed * 100 + number)
        conn = connect(self.target)
        conn.execute(f"SET deadlock_timeout = '{LOAD_DEADLOCK_TIMEOUT}'")
        try:
            serial = 0
            while not self.done.is_set():
                rows = sorted(rng.sample(range(1, ROWS + 1), rng.randint(2, 3)), reverse=rng.random() < 0.3)
                owner = rng.choice(rows) if rng.random() < 0.3 else None
                serial += 1
                try:
                    with conn.transaction():
                        for row_id in rows:
                            conn.execute("UPDATE account SET hits = hits + 1 WHERE id = %s", (row_id,))
                            if row_id == owner:
                                conn.execute("UPDATE account SET owner = %s WHERE id = %s",
                                             (f"app-{number}-{serial}", row_id))
                            time.sleep(0.001)
                except RETRIED:
                    with self.lock:
                        self.refused += 1
                    continue
                with self.lock:
                    self.hits.update(rows)
                    self.committed += 1
        except BaseException as error:  # reported by the test
            self.errors.append(error)
        finally:
            conn.close()


def test_application_writers_on_the_same_rows_lose_no_update_and_cause_no_wrong_conflict(accounts, app, target,
                                                                                        caplog):
    caplog.set_level(logging.WARNING, logger="fieldsync.site")
    accounts.connection.execute(f"SET deadlock_timeout = '{LOAD_DEADLOCK_TIMEOUT}'")
    rounds = 8
    writers = Writers(target, seed=20260301)
    threads = [threading.Thread(target=writers.session, args=(number,)) for number in range(3)]
    for thread in threads:
        thread.start()
    busy = 0
    try:
        time.sleep(0.05)
        for round_number in range(1, rounds + 1):
            while True:  # as the agent does: a message refused stays queued and is applied again
                try:
                    accounts.apply("r1", owner_message(round_number, 10 * round_number),
                                   log_received=10 * round_number + 1)
                    break
                except SiteBusy:
                    busy += 1
    finally:
        writers.done.set()
        for thread in threads:
            thread.join(60)
    assert not writers.errors, writers.errors
    assert writers.committed > 0 and accounts.remote("r1").log_received == 10 * rounds + 1
    retries = sum("trying again" in record.getMessage() for record in caplog.records)
    print(f"{writers.committed} application transactions, {writers.refused} refused to them, {retries} retries"
          f" and {busy} refusals of the apply, {len(accounts.conflicts())} conflicts")

    # No lost update: every increment an application committed is there.
    assert dict(app.execute("SELECT id, hits FROM account").fetchall()) == {
        row_id: writers.hits[row_id] for row_id in range(1, ROWS + 1)}

    # Each of r1's writes of a row, as the trigger captured it under the
    # row's lock: a conflict is recorded exactly when the row then held
    # another owner than r1's before-image, and shows that owner.
    conflicts = {(conflict.key[0], conflict.peer_commit): conflict for conflict in accounts.conflicts()}
    assert all(conflict.resolution == "incoming" for conflict in conflicts.values())
    captured = app.execute("SELECT seq, origin, v FROM fieldsync.capture WHERE kind = 2 AND flags = 0 ORDER BY seq").fetchall()
    last_owner: dict[int, tuple[int, str | None]] = {}
    checked = 0
    for seq, origin, values in captured:
        row_id, old_owner, new_owner = int(values[0]), values[1], values[5]
        if old_owner == new_owner:
            continue  # hits only
        last_owner[row_id] = (seq, origin)
        if origin != "r1":
            continue
        round_number = int(new_owner.split("-")[1])
        commit = 10 * round_number + (0 if row_id <= ROWS // 2 else 1)
        expected = f"base-{row_id}" if round_number == 1 else f"r1-{round_number - 1}-{row_id}"
        conflict = conflicts.pop((row_id, commit), None)
        if old_owner == expected:
            assert conflict is None, f"row {row_id} held r1's before-image, yet a conflict was recorded"
        else:
            assert conflict is not None, f"row {row_id} held {old_owner!r}, not {expected!r}: no conflict recorded"
            assert conflict.local_row["owner"] == old_owner and conflict.result_row["owner"] == new_owner
        checked += 1
    assert checked == rounds * ROWS and not conflicts, conflicts
    # The last owner of every row is the last write of it.
    final = dict(app.execute("SELECT id, owner FROM account").fetchall())
    for row_id, owner in final.items():
        assert owner.startswith("app-" if last_owner[row_id][1] is None else f"r1-{rounds}-")
