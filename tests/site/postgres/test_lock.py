"""agent.site.postgres.lock: one agent per consolidated database."""

from __future__ import annotations

import pytest

from agent.site.postgres.errors import AgentRunning, NotReachable
from agent.site.postgres.lock import LOCK_KEY, AgentLock


def test_a_second_agent_on_the_same_database_is_refused(target):
    with AgentLock(target) as first:
        assert first.held
        second = AgentLock(target.uri)
        with pytest.raises(AgentRunning) as caught:
            second.acquire()
        message = str(caught.value)
        assert "\n" not in message
        assert target.where in message and "server process" in message and "application fieldsync" in message
        assert not second.held
    # Released: the next agent gets it.
    with AgentLock(target) as third:
        assert third.held


def test_agents_on_two_databases_do_not_collide(postgres, target):
    other = postgres.create_database()
    try:
        with AgentLock(target), AgentLock(postgres.uri(other)) as second:
            assert second.held
    finally:
        postgres.drop_database(other)


def test_the_lock_goes_with_its_connection(postgres, target):
    lock = AgentLock(target).acquire()
    lock.check()
    with postgres.admin(target.dbname) as admin:
        terminated = admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
            ((LOCK_KEY >> 32) & 0xFFFFFFFF, LOCK_KEY & 0xFFFFFFFF)).fetchall()
    assert terminated == [(True,)]
    with pytest.raises(NotReachable) as caught:
        lock.check()
    assert "lock" in str(caught.value) and "\n" not in str(caught.value)
    assert not lock.held
    with AgentLock(target) as again:
        assert again.held
    lock.release()  # idempotent


def test_release_is_idempotent(target):
    lock = AgentLock(target).acquire()
    lock.release()
    lock.release()
    assert not lock.held
