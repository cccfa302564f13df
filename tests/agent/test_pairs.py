"""The pairs' one owner (agent/pairs.py): loading the remote-user rows again
costs nothing when nothing was committed since the last load, and a change
committed by any connection, this one or another, is still picked up."""

import asyncio

from agent.admin import init_site
from agent.pairs import PairStore
from agent.run_options import RunOptions
from agent.runner import Agent
from agent.site import SiteDatabase
from codec.keys import Keyring


def consolidated(tmp_path, *remotes):
    (tmp_path / "hq-in").mkdir()
    site = init_site(tmp_path / "hq.db", name="hq", role="consolidated", address=str(tmp_path / "hq-in"),
                     transport="folder")
    for name in remotes:
        (tmp_path / f"{name}-in").mkdir()
        site.add_remote(name, address=str(tmp_path / f"{name}-in"), transport="folder")
    return site


class CountingDatabase:
    """The site database, counting how often the remote-user rows are listed."""

    def __init__(self, db):
        self.db, self.listings = db, 0

    def __getattr__(self, name):
        return getattr(self.db, name)

    def remotes(self):
        self.listings += 1
        return self.db.remotes()


def test_a_load_with_nothing_committed_since_the_last_reads_no_row(tmp_path):
    site = consolidated(tmp_path, "f1", "f2")
    db = CountingDatabase(site)
    store, peers = PairStore(db, tmp_path / "state", Keyring()), {}
    settings = RunOptions().settings(True)
    assert store.load(peers, settings) is True and sorted(peers) == ["f1", "f2"]
    assert store.load(peers, settings) is False
    assert db.listings == 1  # the second load looked at nothing
    site.close()


def test_a_remote_added_through_the_same_connection_is_picked_up(tmp_path):
    site = consolidated(tmp_path, "f1")
    store, peers = PairStore(site, tmp_path / "state", Keyring()), {}
    settings = RunOptions().settings(True)
    store.load(peers, settings)
    (tmp_path / "f2-in").mkdir()
    site.add_remote("f2", address=str(tmp_path / "f2-in"), transport="folder")
    assert store.load(peers, settings) is True and sorted(peers) == ["f1", "f2"]
    site.remove_remote("f1")
    assert store.load(peers, settings) is True and sorted(peers) == ["f2"]
    site.close()


def test_a_remote_added_by_another_connection_after_the_agent_opened_is_sent_to(tmp_path):
    consolidated(tmp_path, "f1").close()

    async def scenario():
        async with Agent(tmp_path / "hq.db", RunOptions(), batch=True) as agent:
            assert sorted(agent.peers) == []  # a batch run builds the pairs with work as it goes
            (tmp_path / "f2-in").mkdir()
            with SiteDatabase.open(tmp_path / "hq.db") as other:
                other.add_remote("f2", address=str(tmp_path / "f2-in"), transport="folder")
            await agent.run_once()
            return sorted(agent.peers)

    assert asyncio.run(scenario()) == ["f1", "f2"]
    # Its first contact (a heartbeat) went out in that same run.
    assert len(list((tmp_path / "f2-in").iterdir())) == 1


def test_a_receive_phase_records_when_a_peer_was_heard_of_once_not_with_every_file(tmp_path):
    """heard_at is for operators: the protocol never reads it, so the files
    of one poll cost one write of it (at the phase's end), not a database
    transaction each."""
    import sqlite3

    from benchmarks.e2e import make_sites

    make_sites(tmp_path)
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    for start in range(0, 6000, 500):
        app.execute("BEGIN")
        app.executemany("INSERT INTO customer VALUES (?, ?, 'Lyon', 1.5, 2, NULL)",
                        [(i, f"row {i:06d} " * 8) for i in range(start, start + 500)])
        app.execute("COMMIT")
    app.close()

    async def run(site, statements=None):
        async with Agent(tmp_path / f"{site}.db", RunOptions(max_message_size=10_000)) as agent:
            if statements is not None:
                agent.db.connection.set_trace_callback(statements.append)
            assert (await agent.run_once()).ok

    asyncio.run(run("hq"))
    files = len(list((tmp_path / "inbox" / "r1").iterdir()))
    assert files >= 6
    statements: list[str] = []
    asyncio.run(run("r1", statements))
    writes = [sql for sql in statements if sql.startswith("UPDATE fieldsync_remote SET") and "heard_at" in sql]
    # At the phase's end, and with the control message's own change: not one per file.
    assert 1 <= len(writes) <= 2, writes
    with SiteDatabase.open(tmp_path / "r1.db") as r1:
        assert r1.remote("hq").heard_at is not None
        assert r1.connection.execute("SELECT count(*) FROM customer").fetchone()[0] == 6000


def test_a_peer_heard_from_while_its_stream_runs_has_its_errors_in_force_ended(tmp_path):
    """Saving a pair whose peer was heard from ends the transport error and
    the stopped stream in force on its row, in the same transaction; a
    stopped pair's (late mail of the old copy was heard) keep them."""
    from codec.payloads import ControlState

    site = consolidated(tmp_path, "f1", "f2")
    (tmp_path / "state").mkdir()
    store, peers = PairStore(site, tmp_path / "state", Keyring()), {}
    store.load(peers, RunOptions().settings(True))
    for name in ("f1", "f2"):
        site.record_stream_stopped(name, f"{name} changed its incarnation id")
        site.record_transport_error(name, "folder gone")
    control = ControlState(log_received=0, rereceive_count=0, log_sent=0, resend_count=0)
    old, new = bytes(16), bytes([1]) * 16
    for name in ("f1", "f2"):
        peers[name].protocol.control_received(10.0, control, old)
    assert peers["f2"].protocol.control_received(11.0, control, new)  # StreamStopped
    assert peers["f2"].protocol.control_received(12.0, control, old) == [] and peers["f2"].protocol.stopped
    store.save([peers["f1"], peers["f2"]])
    f1, f2 = site.remote("f1"), site.remote("f2")
    assert (f1.heard_at, f1.last_error, f1.stream_stopped, f1.error_count) == (10.0, None, None, 2)
    assert (f2.heard_at, f2.last_error, f2.stream_stopped) == (12.0, "folder gone", "f2 changed its incarnation id")
    site.close()
