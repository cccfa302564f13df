"""The remote-user table of a PostgreSQL site (agent.site.postgres.remotes):
the checks every backend passes (tests/site/remote_user_checks.py), and
what is PostgreSQL's own (rows locked while they are checked)."""

from __future__ import annotations

import threading

import pytest
from psycopg import pq

from agent.site.errors import InvariantViolation
from agent.site.postgres.connect import connect

from ..remote_user_checks import NOW, RemoteUserChecks


class PostgresWorld:
    """What the shared checks need of a PostgreSQL site."""

    def __init__(self, site, app) -> None:  # type: ignore[no-untyped-def]
        self.site = site
        self.app = app

    def grow_log(self, rows: int = 3) -> int:
        # A scan makes one log transaction of consecutive ones of one
        # origin: one scan each, so the log end grows by ``rows``.
        for _ in range(rows):
            self.app.execute("INSERT INTO customer (name) VALUES ('x')")
            end = self.site.scan()
        return end

    def add_apply_error(self, peer: str) -> None:
        self.app.execute("INSERT INTO fieldsync.apply_error (at, peer, peer_commit, problem)"
                         " VALUES (%s, %s, 1, 'a row that was not there')", (NOW, peer))

    def refuse_remote(self, name: str) -> None:
        self.app.execute("CREATE FUNCTION refuse() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN"
                         " RAISE EXCEPTION 'refused by a test trigger'; END $$")
        self.app.execute(f"CREATE TRIGGER refuse AFTER INSERT ON fieldsync.remote FOR EACH ROW"
                         f" WHEN (new.name = '{name}') EXECUTE FUNCTION refuse()")

    def in_transaction(self) -> bool:
        return self.site.connection.info.transaction_status != pq.TransactionStatus.IDLE


class TestRemoteUsers(RemoteUserChecks):
    @pytest.fixture
    def world(self, hq, app):
        return PostgresWorld(hq, app)


def test_a_change_waits_for_another_sessions_change_of_the_row(hq, app, target):
    """Checked against the row as it is: a change of another session to the
    same row is waited for (FOR UPDATE), then checked against its result."""
    end = PostgresWorld(hq, app).grow_log()
    hq.add_remote("r1", start=0)
    hq.update_remote("r1", log_sent=end)
    other = connect(target)
    other.execute("BEGIN")
    other.execute("UPDATE fieldsync.remote SET confirm_sent = 3 WHERE name = 'r1'")
    outcome: list[object] = []
    worker = threading.Thread(target=lambda: outcome.append(_try(lambda: hq.update_remote("r1", confirm_sent=2))))
    worker.start()
    worker.join(0.5)
    assert worker.is_alive()  # waiting for the other session's row lock
    other.execute("COMMIT")
    worker.join(10)
    other.close()
    assert isinstance(outcome[0], InvariantViolation) and "cannot go back from 3 to 2" in str(outcome[0])


def _try(call):  # type: ignore[no-untyped-def]
    try:
        return call()
    except Exception as error:  # noqa: BLE001 - the test looks at it
        return error
