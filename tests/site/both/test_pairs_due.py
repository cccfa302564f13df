"""Which pairs may have something due at a batch run (``Site.pairs_due``,
agent.site.due), on both backends: the agent loads and steps only the
pairs it names, so it must name every pair the core would send a control
message or read the log for, and should name few others."""

from __future__ import annotations

import random

import pytest

from agent.controls import HEARTBEAT_SPREAD, MAX_PROBE_DOUBLINGS, control_due, control_timers
from agent.pairs import ROW_FIELDS
from agent.protocol import PairState
from agent.site import Article
from agent.site.due import DueQuery, control_might_be_due, read_might_be_due

NOW = 1_000_000.0
HEARTBEAT, CONFIRM_TIMEOUT = 86400.0, 600.0
REMOTES = 80


def query(log_end: int, now: float = NOW) -> DueQuery:
    return DueQuery(now=now, log_end=log_end, heartbeat=HEARTBEAT, confirm_timeout=CONFIRM_TIMEOUT,
                    heartbeat_share=1 - HEARTBEAT_SPREAD, max_doublings=MAX_PROBE_DOUBLINGS)


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("regions", [Article("customer", subscribe_by="region")])
    app = backend.app()
    for number in range(6):
        app.execute("INSERT INTO customer (id, name, region) VALUES (%s, 'x', 'g1')", (number,))
        site.scan()
    return site


def random_rows(site, chance: random.Random) -> None:
    """Remotes in states around every bound of the rule: just before and just
    past a heartbeat, a probe wait (with backoff), owed confirmations."""
    end = site.log_end()
    for number in range(REMOTES):
        name = f"r{number:02}"
        site.add_remote(name, start=0)
        log_sent = chance.randrange(end + 1)
        beat = chance.choice([None, 3600, 86400])
        timeout = chance.choice([None, 60, 600, 7200])
        if beat is not None and timeout is not None:
            timeout = min(timeout, beat)
        in_force, probe_after = control_timers(beat, timeout, run_heartbeat=HEARTBEAT,
                                               run_confirm_timeout=CONFIRM_TIMEOUT)
        probes = chance.choice([0, 0, 1, 3, 30])
        quiet = chance.choice([0.0, 1.0, 0.5, 0.89, 0.9, 0.95, 1.0001, 2.0, 8.0, 40.0]) * chance.choice(
            [in_force, probe_after])
        sent_at = None if chance.random() < 0.05 else NOW - quiet
        log_received = chance.randrange(50)
        site.update_remote(name, log_sent=log_sent, log_send=max(log_sent, chance.randrange(end + 1)),
                           log_read=chance.choice([0, log_sent, end]),
                           confirm_sent=chance.choice([0, log_sent, log_sent // 2]),
                           log_received=log_received,
                           confirm_received=chance.choice([log_received, log_received, 0]),
                           confirm_owed=chance.random() < 0.1, heartbeat=beat, confirm_timeout=timeout,
                           control_sent_at=sent_at,
                           data_sent_at=chance.choice([None, sent_at, None if sent_at is None else sent_at - 5]),
                           probes=probes)


def core_owes_a_control(row, now: float) -> bool:
    state = PairState(**{field: getattr(row, field) for field in ROW_FIELDS})
    heartbeat, timeout = control_timers(row.heartbeat, row.confirm_timeout, run_heartbeat=HEARTBEAT,
                                        run_confirm_timeout=CONFIRM_TIMEOUT)
    return control_due(row.name, state, now, heartbeat=heartbeat, confirm_timeout=timeout, force=False) is not None


@pytest.mark.parametrize("seed", [1, 2])
def test_every_pair_the_core_owes_a_control_is_named(backend, hq, seed):
    random_rows(hq, random.Random(seed))
    rows = hq.remotes()
    for later in (0.0, 1.0, 3599.0, 80000.0):
        asked = query(hq.log_end(), NOW + later)
        due = hq.pairs_due(asked)
        assert due.controls == {row.name for row in rows if control_might_be_due(row, asked)}
        owed = {row.name for row in rows if core_owes_a_control(row, NOW + later)}
        assert owed <= due.controls
    # A filter worth having: a fleet heard from a moment ago owes nothing.
    assert len(hq.pairs_due(query(hq.log_end())).controls) < REMOTES


def test_reads_due_are_the_rows_behind_the_log_end(backend, hq):
    random_rows(hq, random.Random(3))
    rows = {row.name: row for row in hq.remotes()}
    end = hq.log_end()
    for log_end in (0, end // 2, end):
        due = hq.pairs_due(query(log_end))
        assert due.read_names() == {name for name, row in rows.items() if read_might_be_due(row, log_end)}
        assert sum(len(read.names) for read in due.reads) == len(due.read_names())
        positions = [(read.log_send, read.log_sent, read.log_read) for read in due.reads]
        assert len(set(positions)) == len(positions)  # one group for each
        for read in due.reads:
            for name in read.names:
                row = rows[name]
                assert (read.log_send, read.log_sent, read.log_read) == (row.log_send, row.log_sent, row.log_read)


def test_a_quiet_confirmed_fleet_owes_nothing_until_its_heartbeat(backend, hq):
    end = hq.log_end()
    for number in range(5):
        name = f"q{number}"
        hq.add_remote(name)
        hq.update_remote(name, log_send=end, log_sent=end, log_read=end, confirm_sent=end, control_sent_at=NOW)
    assert hq.pairs_due(query(end, NOW + 60)).controls == set()
    assert hq.pairs_due(query(end, NOW + 60)).reads == ()
    assert hq.pairs_due(query(end, NOW + HEARTBEAT)).controls == {f"q{number}" for number in range(5)}
    [read] = hq.pairs_due(query(end + 1)).reads
    assert sorted(read.names) == [f"q{number}" for number in range(5)] and read.log_read == end


def test_remotes_by_name(backend, hq):
    for name in ("a", "b", "c"):
        hq.add_remote(name)
    assert [row.name for row in hq.remotes(["c", "a", "nobody"])] == ["a", "c"]
    assert [row.name for row in hq.remotes([])] == []
    assert [row.name for row in hq.remotes()] == ["a", "b", "c"]
