"""A PostgreSQL consolidated put back from an older backup is noticed as a
SQLite file is (agent/restore.py, through Site.count_run): the agent's
folder counts runs ahead of the database's, so the site takes a new
incarnation and its peers stop its streams."""

from __future__ import annotations

from agent.restore import check_restored


def test_runs_are_counted_and_a_database_put_back_takes_a_new_incarnation(hq, tmp_path) -> None:
    folder = tmp_path / "agent"
    (folder / "state").mkdir(parents=True)
    first = hq.identity.incarnation
    assert check_restored(hq, folder) is None
    backup = hq.connection.execute("SELECT generation FROM fieldsync.agent_run").fetchone()[0]
    assert check_restored(hq, folder) is None  # a second run: counted in both places
    assert hq.identity.incarnation == first
    # The database put back from the backup taken after the first run:
    hq.connection.execute("UPDATE fieldsync.agent_run SET generation = %s", (backup,))
    assert check_restored(hq, folder) == first
    assert hq.identity.incarnation != first
    reopened = type(hq).open(hq.target)
    try:
        assert reopened.identity.incarnation == hq.identity.incarnation
    finally:
        reopened.close()
    assert check_restored(hq, folder) is None  # and from then on it runs as itself
