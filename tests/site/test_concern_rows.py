"""The subscription rows a SQLite consolidated asks for once it knows what
a range's rows concern (agent.site.sqlite.selection.concern_rows): only
those that can match, and never fewer than the check needs, whatever the
types of the SUBSCRIBE BY values (agent.site.concern.Concern.wanted)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from agent.site import Article, SiteDatabase
from agent.site.concern import Concern
from agent.site.sqlite.selection import concern_rows

# SUBSCRIBE BY values of every kind a SQLite column without a type keeps.
VALUES = {"int": 5, "float": 2.5, "whole_float": 7.0, "text": "5", "blob": b"\x05", "big": 1 << 62, "true": 1}


def test_a_row_is_read_for_exactly_the_subscribers_of_its_value_of_any_type(tmp_path: Path) -> None:
    site = SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated", address="inbox/hq",
                             transport="folder")
    site.connection.execute("CREATE TABLE reading (id INTEGER PRIMARY KEY, place, value REAL)")
    site.create_publication("places", [Article("reading", subscribe_by="place")])
    for name, value in VALUES.items():
        site.add_remote(name)
        site.subscribe(name, "places", value)
    for number in range(20):  # a fleet beside them, none of them concerned
        site.add_remote(f"other{number:02}")
        site.subscribe(f"other{number:02}", "places", f"o{number}")
    everyone = list(VALUES) + [f"other{number:02}" for number in range(20)]
    app = sqlite3.connect(tmp_path / "hq.db", isolation_level=None)
    for number, place in enumerate([5, 2.5, 7, "5", b"\x05", 1 << 62, True, 6, "x"]):
        start = site.scan()
        app.execute("INSERT INTO reading VALUES (?, ?, 0)", (number, place))
        end = site.scan()
        reads = [(name, start, end) for name in everyone]
        concerned = {reads[index][0] for index in site.concerned_reads(reads)}
        yielding = {name for name in everyone if list(site.read_log(name, start, end))}
        assert concerned == yielding, (place, concerned, yielding)
    app.close()
    site.close()


def test_only_the_rows_of_the_values_held_are_read(tmp_path: Path) -> None:
    site = SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated", address="inbox/hq",
                             transport="folder")
    site.connection.execute("CREATE TABLE reading (id INTEGER PRIMARY KEY, place TEXT, value REAL)")
    site.create_publication("places", [Article("reading", subscribe_by="place")])
    for number in range(50):
        site.add_remote(f"r{number:02}")
        site.subscribe(f"r{number:02}", "places", f"p{number}")
    rows = concern_rows(site.connection)
    found = Concern(frozenset(), {"places": frozenset({"p3", "p7", "nobody"})}, frozenset())
    assert set(rows.subscriptions(found)) == {"r03", "r07"}
    assert rows.subscriptions(Concern(frozenset(), {}, frozenset({"r01"}))) == {}
    assert len(rows.subscriptions(Concern(frozenset({"places"}), {}, frozenset()))) == 50
    site.close()


def test_values_json_cannot_carry_exactly_ask_for_the_whole_publication() -> None:
    exact = Concern(frozenset({"all"}), {"all": frozenset({b"x"}), "some": frozenset({"a", 1, 2.5})}, frozenset())
    publications, pairs = exact.wanted()
    assert publications == ["all"] and sorted(map(tuple, pairs), key=repr) == sorted(
        [("some", "a"), ("some", 1), ("some", 2.5)], key=repr)
    for value in (b"x", True, float("nan"), 1 << 64, None):
        assert Concern(frozenset(), {"p": frozenset({value, "a"})}, frozenset()).wanted() == (["p"], [])
