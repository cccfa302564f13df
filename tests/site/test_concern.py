"""agent.site.concern on plain rows: what makes a range concern a
subscriber, and when it answers "anyone" (None).  Both backends' sites are
held to it in tests/site/both/test_concerned.py."""

from __future__ import annotations

from agent.site.capture import (FLAG_RETURN_TO_ORIGIN, KIND_DELETE, KIND_INSERT, KIND_SCHEMA, KIND_UPDATE, Shape,
                                ShapeTable)
from agent.site.change_rows import row_value
from agent.site.concern import concerned

SHAPES = ShapeTable([Shape(1, "customer", ("id", "region"), ("id",)), Shape(2, "note", ("id", "text"), ("id",))])
ARTICLES = [("customer", "regions", None, "region"), ("note", "notes", None, None)]
SUBSCRIPTIONS = {
    "north": [("regions", "n", 0, None)],
    "south": [("regions", "s", 0, None)],
    "gone": [("regions", "s", 0, 5)],  # ended at offset 5
    "later": [("regions", "e", 9, None), ("regions", "s", 0, 9)],  # moved from s to e at offset 9
    "reader": [("notes", None, 0, None)],
}
EVERYONE = list(SUBSCRIPTIONS)


def rows(*rows: tuple, origin: str = "hq", commit: int = 10) -> list[tuple[int, str, list[tuple]]]:
    return [(commit, origin, list(rows))]


def test_a_row_concerns_its_old_and_new_values_and_whole_tables_every_subscriber():
    insert = (1, 1, KIND_INSERT, 0, 7, "n")
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(insert), 0) == {"north"}
    move = (2, 1, KIND_UPDATE, 0, 7, "n", 7, "s")
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(move), 0) == {"north", "south", "gone", "later"}
    delete = (3, 1, KIND_DELETE, 0, 7, "s")
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(delete), 6) == {"south", "later"}
    note = (4, 2, KIND_INSERT, 0, 1, "hello")
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(note), 0) == {"reader"}


def test_a_subscription_that_ended_before_the_range_does_not_count():
    delete = (3, 1, KIND_DELETE, 0, 7, "s")
    assert "gone" in concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(delete), 4)
    assert "gone" not in concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(delete), 5)
    assert "later" not in concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(delete), 9)


def test_a_row_written_back_concerns_its_origin():
    returned = (5, 1, KIND_UPDATE, FLAG_RETURN_TO_ORIGIN, 7, "x", 7, "y")
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(returned, origin="north"), 0) == {"north"}


def test_a_schema_change_or_a_large_range_concerns_anyone():
    schema = (6, 0, KIND_SCHEMA, 0, row_value([("add_column", "customer", "note", "TEXT", None)], {"customer": 1}, {}))
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(schema), 0) is None
    many = [(seq, 1, KIND_INSERT, 0, seq, "n") for seq in range(1, 12)]
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(*many), 0, limit=10) is None
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(*many), 0, limit=11) == {"north"}


def test_a_change_whose_steps_each_name_their_remotes_concerns_those_alone():
    """Passthrough steps name their remote, drop_article steps the remotes
    of their publication (change_rows.addressed)."""
    passthrough = (6, 0, KIND_SCHEMA, 0, row_value([("passthrough", "north", "UPDATE t SET a = 1")], {}, {}))
    drop = (7, 0, KIND_SCHEMA, 0, row_value([("drop_article", "customer", "sales")], {}, {},
                                            {"sales": ["gone", "north"]}))
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(passthrough), 0) == {"north"}
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(drop), 0) == {"north", "gone"}
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, ["north"], rows(passthrough, drop), 0) == {"north"}


def test_only_the_subscribers_asked_about_are_named():
    insert = (1, 1, KIND_INSERT, 0, 7, "s")
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, ["north", "gone"], rows(insert), 0) == {"gone"}
    assert concerned(SHAPES, ARTICLES, SUBSCRIPTIONS, ["nobody"], rows(insert), 0) == set()


def test_a_row_logged_under_a_tables_old_name_concerns_its_articles_subscribers():
    shapes = ShapeTable([Shape(3, "client", ("id", "region"), ("id",))])  # customer's name before a rename
    insert = (1, 3, KIND_INSERT, 0, 7, "n")
    assert concerned(shapes, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(insert), 0) == set()
    assert concerned(shapes, ARTICLES, SUBSCRIPTIONS, EVERYONE, rows(insert), 0,
                     renames={"client": "customer"}) == {"north"}
