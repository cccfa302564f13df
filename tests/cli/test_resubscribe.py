"""`agent remote subscribe` / `unsubscribe` on extracted remotes: the rows
that enter or leave a remote's subset reach it through its stream, with no
new extraction (docs/site-database.md, "Changing a remote's
subscriptions"); from the CLI alone, on real files."""

from __future__ import annotations

from pathlib import Path

from agent.site import SiteDatabase

from .conftest import Agent, World, sync

SUBSET = "SELECT id, region, name FROM customer WHERE region IN ({}) ORDER BY id"


def subset(world: World, *regions: str) -> list[tuple]:
    return world.rows("hq", SUBSET.format(", ".join(f"'{region}'" for region in regions)))


def test_a_subscription_added_then_ended_reaches_the_remote_through_its_stream(world: World, agent: Agent) -> None:
    sync(agent, world)
    assert world.rows("n1") == subset(world, "n1")
    added = agent("remote", "subscribe", world.hq, "n1", "territory=n2")
    assert added.code == 0, added.err
    assert added.out.strip() == "Subscribed n1 to territory with 'n2': 10 rows go to it as INSERTs with its next send"
    assert added.err == ""
    sync(agent, world)
    assert world.rows("n1") == subset(world, "n1", "n2")  # no extraction: the rows came as INSERTs
    assert world.rows("n2") == subset(world, "n2")  # nobody else got them
    # Changes after the subscription reach it as any other change.
    world.execute("hq", "UPDATE customer SET name = 'renamed' WHERE id = 2")
    ended = agent("remote", "unsubscribe", world.hq, "n1", "territory=n1")
    assert ended.code == 0, ended.err
    assert ended.out.strip() == "Unsubscribed n1 from territory with 'n1': 10 rows go to it as DELETEs with its next send"
    sync(agent, world)
    assert world.rows("n1") == subset(world, "n2") and (2, "n2", "renamed") in world.rows("n1")
    assert world.rows("n2") == subset(world, "n2")
    with SiteDatabase.open(world.hq) as hq:
        assert [(item.publication, item.value) for item in hq.subscriptions("n1")] == [("territory", "n2")]
        assert {row.name: row.log_sent == row.confirm_sent for row in hq.remotes()} == {"n1": True, "n2": True}


def test_a_row_that_left_before_the_unsubscribe_is_still_deleted_at_the_remote(world: World, agent: Agent) -> None:
    """A row of n1 moved to a region n1 does not subscribe to, not yet sent,
    then n1 unsubscribes from its own region: the move is read as n1 saw it
    when it was made (a DELETE), so the row leaves n1 though the
    unsubscribe's DELETEs (rows of region n1 now) do not name it."""
    sync(agent, world)
    world.execute("hq", "UPDATE customer SET region = 'east' WHERE id = 1")
    world.execute("hq", "UPDATE customer SET name = 'changed first' WHERE id = 3")
    assert agent("remote", "subscribe", world.hq, "n1", "territory=n2").code == 0
    ended = agent("remote", "unsubscribe", world.hq, "n1", "territory=n1")
    assert "9 rows go to it as DELETEs" in ended.out
    sync(agent, world)
    assert world.rows("n1") == subset(world, "n2")
    assert world.rows("n1", "SELECT count(*) FROM customer WHERE id IN (1, 3)") == [(0,)]


def test_a_value_that_matches_no_row_is_taken_with_a_warning_and_undone_by_unsubscribe(
        world: World, agent: Agent) -> None:
    sync(agent, world)
    typo = agent("remote", "subscribe", world.hq, "n1", "territory=nl")
    assert typo.code == 0, typo.err
    assert typo.out.strip() == "Subscribed n1 to territory with 'nl': no row moves"
    assert len(typo.err_lines) == 1 and typo.err.startswith(
        "warning: no row of publication territory holds 'nl' now; the subscription is kept")
    assert f"agent remote unsubscribe {world.hq} n1 territory=nl" in typo.err
    # A row that takes the value later reaches n1 as a change.
    world.execute("hq", "INSERT INTO customer VALUES (99, 'nl', 'later', 'x')")
    sync(agent, world)
    assert world.rows("n1") == subset(world, "n1", "nl")
    undone = agent("remote", "unsubscribe", world.hq, "n1", "territory=nl")
    assert undone.code == 0 and "1 row goes to it as DELETEs" in undone.out
    sync(agent, world)
    assert world.rows("n1") == subset(world, "n1")


def test_unsubscribing_a_value_the_remote_does_not_hold_is_one_line_and_changes_nothing(
        world: World, agent: Agent) -> None:
    sync(agent, world)
    with SiteDatabase.open(world.hq) as hq:
        end = hq.log_end()
    result = agent("remote", "unsubscribe", world.hq, "n1", "territory=n1", "territory=n2")
    assert result.code == 1 and len(result.err_lines) == 1
    assert "n1 does not subscribe to territory with 'n2' (its subscriptions: territory='n1')" in result.err
    with SiteDatabase.open(world.hq) as hq:
        assert [(item.publication, item.value) for item in hq.subscriptions("n1")] == [("territory", "n1")]
        assert hq.log_end() == end  # the first, valid one was not done either
    again = agent("remote", "subscribe", world.hq, "n1", "territory=n1")
    assert again.code == 0 and again.out.strip() == "n1 subscribes to territory with 'n1' already: nothing changed"


def test_a_remote_not_extracted_yet_gets_its_rows_by_extraction(world: World, agent: Agent, tmp_path: Path) -> None:
    (tmp_path / "inbox" / "n3").mkdir()
    assert agent("remote", "add", world.hq, "n3", "--address", tmp_path / "inbox" / "n3").code == 0
    with SiteDatabase.open(world.hq) as hq:
        end = hq.log_end()
    result = agent("remote", "subscribe", world.hq, "n3", "territory=n2")
    assert result.out.strip() == "Subscribed n3 to territory with 'n2': `agent extract` gives it its rows"
    with SiteDatabase.open(world.hq) as hq:
        assert hq.log_end() == end  # nothing went into the log
    assert agent("extract", world.hq, "n3", tmp_path / "n3.db").code == 0
    assert world.rows("n3") == subset(world, "n2")
