"""The common read position (``Site.move_reads``; docs/protocol.md, "The
common read position"), on both backends: a send phase moves the pairs
its range held nothing for with one write of the site row, and every
reader of the positions (the rows, the pairs due, the horizon, the lagging
filter, the truncation point) sees what a move of each row would have
written; a pair whose positions are written leaves it with its values of
the moment, so a position set back is never read forward."""

from __future__ import annotations

import pytest

from agent.site import Article
from agent.site.errors import InvariantViolation
from agent.site.remote_rules import RemoteFilter

from .test_pairs_due import query

NAMES = ("r1", "r2", "r3")


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("regions", [Article("customer", subscribe_by="region")])
    for name in NAMES:
        site.add_remote(name, start=0)
        site.subscribe(name, "regions", name)
    return site


def change(backend, number: int) -> int:
    """A row for nobody's region, logged: the new log end."""
    backend.app().execute("INSERT INTO customer (id, name, region) VALUES (%s, 'x', 'elsewhere')", (number,))
    return backend.site.scan()


def stored(backend) -> dict[str, tuple]:
    """Each row's own (log_send, log_read, follows_common), and the common position."""
    prefix = "fieldsync_" if backend.name == "sqlite" else "fieldsync."
    rows = {name: (send, read, bool(follows)) for name, send, read, follows in backend.rows(
        f"{prefix}remote", "name, log_send, log_read, follows_common")}
    [(common,)] = backend.rows(f"{prefix}site", "common_read")
    return {**rows, "common": common}


def positions(site, name: str) -> tuple[int, int]:
    row = site.remote(name)
    return row.log_send, row.log_read


def test_the_pairs_that_join_move_with_the_common_position_unwritten(backend, hq):
    first = change(backend, 1)
    hq.move_reads(first, leave=[], join=["r1", "r2"])
    assert stored(backend) == {"r1": (first, first, True), "r2": (first, first, True), "r3": (0, 0, False),
                               "common": first}
    second = change(backend, 2)
    hq.move_reads(second, leave=[], join=[])
    assert stored(backend) == {"r1": (first, first, True), "r2": (first, first, True), "r3": (0, 0, False),
                               "common": second}
    # Every reader sees the moved positions: the rows, the reads due, the horizon and filters.
    assert [positions(hq, name) for name in NAMES] == [(second, second), (second, second), (0, 0)]
    assert {row.name: (row.log_send, row.log_read) for row in hq.remotes()}["r2"] == (second, second)
    due = hq.pairs_due(query(second))
    assert due.read_names() == {"r3"} and [read.follows for read in due.reads] == [False]
    assert [row.name for row in hq.iter_remotes(RemoteFilter(lagging=True))] == ["r3"]
    assert hq.remote("r1").horizon == second
    third = change(backend, 3)
    [read] = [read for read in hq.pairs_due(query(third)).reads if read.follows]
    assert (read.log_send, read.log_read, read.names) == (second, second, ("r1", "r2"))


def test_the_log_is_truncated_through_the_common_position_when_every_pair_follows_it(backend, hq):
    first = change(backend, 1)
    change(backend, 2)
    hq.move_reads(first, leave=[], join=list(NAMES))
    end = change(backend, 3)
    hq.move_reads(end, leave=[], join=[])
    assert hq.truncate_log() == end and hq.log_start() == end


def test_a_pair_whose_position_is_written_leaves_with_its_values_of_the_moment(backend, hq):
    first = change(backend, 1)
    hq.move_reads(first, leave=[], join=list(NAMES))
    second = change(backend, 2)
    hq.move_reads(second, leave=[], join=[])
    # Set back (a resend reads again from there): read from there, not from the common position.
    hq.update_remote("r1", log_read=first - 1)
    # A save of a pair's reads alone (update_remotes' path for a send phase's moves), and of its
    # reads with its other columns (its path for a pair's own save).
    hq.update_remotes({"r2": {"log_read": second}, "r3": {"log_read": second, "control_sent_at": 5.0}})
    assert {name: row for name, row in stored(backend).items() if name != "common"} == {
        "r1": (second, first - 1, False), "r2": (second, second, False), "r3": (second, second, False)}
    third = change(backend, 3)
    hq.move_reads(third, leave=[], join=[])  # no follower left: nobody moves
    assert [positions(hq, name) for name in NAMES] == [(second, first - 1), (second, second), (second, second)]


def test_a_send_recorded_for_a_follower_makes_it_leave(backend, hq):
    first = change(backend, 1)
    hq.move_reads(first, leave=[], join=["r1"])
    second = change(backend, 2)
    hq.move_reads(second, leave=[], join=[])
    hq.record_send("r1", log_sent=second)
    assert stored(backend)["r1"] == (second, second, False)
    hq.move_reads(change(backend, 3), leave=[], join=[])
    assert positions(hq, "r1") == (second, second)


def test_the_followers_a_run_builds_leave_before_the_position_moves(backend, hq):
    first = change(backend, 1)
    hq.move_reads(first, leave=[], join=list(NAMES))
    second = change(backend, 2)
    hq.move_reads(second, leave=["r2", "r3"], join=[])
    assert stored(backend) == {"r1": (first, first, True), "r2": (first, first, False),
                               "r3": (first, first, False), "common": second}
    assert [positions(hq, name) for name in NAMES] == [(second, second), (first, first), (first, first)]
    hq.move_reads(second, leave=[], join=["r2"])  # a later range held nothing for r2: it rejoins
    assert stored(backend)["r2"] == (second, second, True)


def test_the_common_position_never_goes_back_nor_past_the_log_end(backend, hq):
    first = change(backend, 1)
    second = change(backend, 2)
    hq.move_reads(second, leave=[], join=["r1"])
    with pytest.raises(InvariantViolation, match=f"cannot move from {second} to {first}"):
        hq.move_reads(first, leave=[], join=[])
    with pytest.raises(InvariantViolation, match=f"cannot move from {second} to {second + 1}"):
        hq.move_reads(second + 1, leave=[], join=[])
    assert stored(backend)["common"] == second and positions(hq, "r1") == (second, second)
