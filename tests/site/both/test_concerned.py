"""Which subscribers a log range can concern (agent.site.concern), on both
backends: a send phase at a consolidated of thousands makes readers only
for the subscribers ``Site.concerned_reads`` names, so it must never leave
out one whose read yields anything, and should leave out the others."""

from __future__ import annotations

import random

import pytest

from agent.site import Article
from agent.site.concern import CONCERN_MIN_SUBSCRIBERS, Concern

REGIONS = 18  # r00 ... r17 subscribe to "regions", each by its own value
WHOLE = ("r18", "r19")  # subscribe to "lines", which takes every row


@pytest.fixture
def hq(backend):
    site = backend.site
    site.create_publication("regions", [Article("customer", subscribe_by="region")])
    site.create_publication("lines", [Article("line")])
    for number in range(REGIONS):
        site.add_remote(f"r{number:02}")
        site.subscribe(f"r{number:02}", "regions", f"g{number}")
    for name in WHOLE:
        site.add_remote(name)
        site.subscribe(name, "lines")
    return site


def names() -> list[str]:
    return [f"r{number:02}" for number in range(REGIONS)] + list(WHOLE)


def concerned(site, after: int, end: int) -> set[str]:
    reads = [(name, after, end) for name in names()]
    return {reads[index][0] for index in site.concerned_reads(reads)}


def yielding(site, after: int, end: int) -> set[str]:
    """The subscribers whose own read of ``(after, end]`` yields anything."""
    return {name for name in names() if list(site.read_log(name, after, end))}


def test_a_row_concerns_the_subscribers_of_its_value_alone(backend, hq):
    app = backend.app()
    start = hq.scan()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'g3')")
    end = hq.scan()
    assert concerned(hq, start, end) == yielding(hq, start, end) == {"r03"}
    app.execute("UPDATE customer SET region = 'g5' WHERE id = 1")  # leaves r03's subset, enters r05's
    after, end = end, hq.scan()
    assert concerned(hq, after, end) == yielding(hq, after, end) == {"r03", "r05"}
    app.execute("INSERT INTO line VALUES (7, 1, 'SKU', 2)")
    after, end = end, hq.scan()
    assert concerned(hq, after, end) == yielding(hq, after, end) == set(WHOLE)
    assert concerned(hq, end, end) == set()  # nothing in the range


def test_few_subscribers_are_all_read_for(backend, hq):
    app = backend.app()
    start = hq.scan()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'g3')")
    end = hq.scan()
    few = [(name, start, end) for name in names()[:CONCERN_MIN_SUBSCRIBERS - 1]]
    assert hq.concerned_reads(few) == list(range(len(few)))


def test_no_subscriber_a_read_yields_for_is_left_out(backend, hq):
    """Random work, moves between values included: every subscriber whose
    read yields anything is named, for ranges that start anywhere."""
    app = backend.app()
    chance = random.Random(7)
    offsets = [hq.scan()]
    for step in range(40):
        row_id = chance.randrange(1, 12)
        region = f"g{chance.randrange(REGIONS + 3)}"  # some values nobody subscribes to
        choices = [
            [("DELETE FROM customer WHERE id = %s", (row_id,)),
             ("INSERT INTO customer (id, name, region) VALUES (%s, %s, %s)", (row_id, f"n{step}", region))],
            [("UPDATE customer SET region = %s WHERE id = %s", (region, row_id))],
            [("UPDATE customer SET name = %s WHERE id = %s", (f"m{step}", row_id))],
            [("DELETE FROM customer WHERE id = %s", (row_id,))],
        ]
        app.run(*chance.choice(choices))
        if chance.random() < 0.2:
            app.execute("INSERT INTO line VALUES (%s, %s, 'SKU', 1)", (step, row_id))
        offsets.append(hq.scan())
    for after in offsets[::5]:
        for end in offsets[offsets.index(after)::7]:
            found, needed = concerned(hq, after, end), yielding(hq, after, end)
            assert needed <= found, (after, end)
    assert concerned(hq, offsets[-2], offsets[-1]) < set(names())  # one step concerns few


def test_a_change_whose_steps_name_their_remotes_concerns_those_alone(backend, hq, tmp_path):
    """Passthrough SQL to one remote, an article removed where two were
    extracted: only they read the range (change_rows.addressed); a change
    of a published table may concern anyone, so everyone reads."""
    for name in ("r03", "r18"):
        hq.extract(name, tmp_path / f"{name}.db")
    start = hq.scan()
    hq.passthrough(["UPDATE customer SET name = 'mended' WHERE id = 1"], ["r03"])
    after = hq.scan()
    assert concerned(hq, start, after) == yielding(hq, start, after) == {"r03"}
    assert hq.remove_article("line") == ("r18",)
    end = hq.scan()
    assert concerned(hq, after, end) == yielding(hq, after, end) == {"r18"}
    assert concerned(hq, start, end) == {"r03", "r18"}
    hq.apply_schema(["ALTER TABLE customer ADD COLUMN note text"])
    assert concerned(hq, end, hq.scan()) == set(names())


def test_a_range_the_log_cannot_serve_is_named_for_its_read_to_say_so(backend, hq):
    app = backend.app()
    start = hq.scan()
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ana', 'g3')")
    end = hq.scan()
    reads = [(name, start, end) for name in names()]
    reads[7] = (reads[7][0], start, end + 5)  # beyond the log end
    assert hq.concerned_reads(reads) == [3, 7]


# SUBSCRIBE BY values of every numeric and text kind, and a fleet beside
# them subscribed to values no row holds.
AMOUNTS = {"int5": 5, "real5": 5.0, "half": 2.5, "text5": "5", "big": 1 << 62}
FLEET = [f"f{number:02}" for number in range(20)]


def subscriptions_read(backend, found: Concern) -> dict:
    """The subscription rows the backend asks for, for ``found``."""
    if backend.name == "sqlite":
        from agent.site.sqlite.selection import concern_rows

        return concern_rows(backend.site.connection).subscriptions(found)
    from agent.site.postgres.reading import concern_rows as pg_concern_rows

    with backend.site._transaction("reading subscriptions", snapshot=True) as conn:
        return pg_concern_rows(conn).subscriptions(found)


def test_a_number_concerns_the_subscribers_of_an_equal_value_and_only_their_rows_are_read(backend):
    site = backend.site
    site.create_publication("amounts", [Article("customer", subscribe_by="balance")])
    for name, value in [*AMOUNTS.items(), *((name, 100.5 + number) for number, name in enumerate(FLEET))]:
        site.add_remote(name)
        site.subscribe(name, "amounts", value)
    everyone = [*AMOUNTS, *FLEET]
    app = backend.app()
    for number, balance in enumerate([5.0, 2.5, 7.0, float(1 << 62), 5.5]):
        start = site.scan()
        app.execute("INSERT INTO customer (id, name, balance) VALUES (%s, 'n', %s)", (number, balance))
        end = site.scan()
        reads = [(name, start, end) for name in everyone]
        found = {reads[index][0] for index in site.concerned_reads(reads)}
        needed = {name for name in everyone if list(site.read_log(name, start, end))}
        assert found == needed, (balance, found, needed)
    assert {name for name in everyone if list(site.read_log(name, 0, site.scan()))} == {"int5", "real5", "half", "big"}
    read = subscriptions_read(backend, Concern(frozenset(), {"amounts": frozenset({5.0, 2.5})}, frozenset()))
    assert {"int5", "real5", "half"} <= set(read) and not set(read) & set(FLEET)
    assert subscriptions_read(backend, Concern(frozenset(), {}, frozenset({"f01"}))) == {}
    assert set(subscriptions_read(backend, Concern(frozenset({"amounts"}), {}, frozenset()))) == set(everyone)
