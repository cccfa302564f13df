"""The SiteDatabase facade (agent.site.sqlite.database): life cycle, threads,
locking errors."""

from __future__ import annotations

import asyncio
import sqlite3

import pytest

from agent.site import SiteBusy, SiteDatabase, SiteError

from .conftest import CUSTOMER, app_connection, make_site
from .facade_checks import check_calls_from_two_threads_are_serialised


def test_close_is_idempotent_and_closed_sites_refuse_work(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated")
    site.close()
    site.close()
    with pytest.raises(SiteError, match="closed"):
        site.scan()


def test_context_manager_closes(tmp_path):
    make_site(tmp_path, "hq", "consolidated").close()
    with SiteDatabase.open(tmp_path / "hq.db") as site:
        assert site.remotes() == ()
    with pytest.raises(SiteError):
        site.remotes()


def test_usable_from_a_worker_thread(tmp_path):
    """The agent calls the adapter with asyncio.to_thread."""
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    site.create_publication("p", ["customer"])
    site.add_remote("r1")
    site.subscribe("r1", "p")
    app_connection(site).execute("INSERT INTO customer (id, name) VALUES (1, 'a')")

    async def agent_step():
        end = await asyncio.to_thread(site.scan)
        transactions = await asyncio.to_thread(lambda: list(site.read_log("r1", 0, end)))
        await asyncio.to_thread(site.record_send, "r1", log_sent=end)
        return end, transactions

    end, transactions = asyncio.run(agent_step())
    assert [t.commit for t in transactions] == [end]
    assert site.remote("r1").log_sent == end
    site.close()


def test_concurrent_calls_from_two_threads_are_serialised(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    site.create_publication("p", ["customer"])
    site.add_remote("r1")
    check_calls_from_two_threads_are_serialised(site, "r1", rounds=50)
    site.close()


def test_a_lock_held_too_long_is_a_site_busy_error(tmp_path):
    make_site(tmp_path, "hq", "consolidated", CUSTOMER).close()
    site = SiteDatabase.open(tmp_path / "hq.db", busy_timeout=0.2)
    blocker = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    blocker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(SiteBusy, match="locked by another connection"):
            site.scan()
    finally:
        blocker.execute("ROLLBACK")
    assert site.scan() == 0
    site.close()


def test_the_connection_commits_durably_and_keeps_its_temporary_files_in_memory(tmp_path):
    """synchronous=FULL (an apply is confirmed once it commits); temp_store
    MEMORY (the fast path's savepoint journals, _db.connect), which changes
    nothing a crash needs."""
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    conn = site.connection
    assert conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL
    assert conn.execute("PRAGMA temp_store").fetchone()[0] == 2  # MEMORY
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    site.close()
