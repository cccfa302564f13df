"""Publications, articles and subscriptions of a PostgreSQL site
(agent.site.postgres.catalogue and .subscriptions): the same definitions,
values and refusals as a SQLite site's (tests/site/test_publications.py),
and the capture triggers that follow from them."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from agent.site import (Article, InvalidSetting, Publication, PublicationError, UnknownPublication, UnknownRemote,
                        UnpublishableTable)
from agent.site.postgres.errors import UnsupportedColumnType
from codec.ops import OpKind

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)
# Key order (line_no, order_id) differs from column order on purpose.
LINE = ("CREATE TABLE line (order_id integer NOT NULL, line_no integer NOT NULL, sku text NOT NULL, qty integer,"
        " PRIMARY KEY (line_no, order_id))")


def _triggers(conn, table: str) -> list[str]:  # type: ignore[no-untyped-def]
    return [name for (name,) in conn.execute(
        "SELECT tgname FROM pg_trigger WHERE tgrelid = to_regclass(%s) AND NOT tgisinternal ORDER BY tgname",
        (table,))]


def _captured(conn) -> int:  # type: ignore[no-untyped-def]
    return conn.execute("SELECT count(*) FROM fieldsync.capture").fetchone()[0]


@pytest.fixture
def sales(hq, app):
    """hq with publication sales: customer (SUBSCRIBE BY region, some
    columns) and line; remotes north1 and south1 subscribed by region,
    idle subscribed to nothing."""
    app.execute(LINE)
    hq.drop_publication("p")
    hq.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                    Article("line")], now=NOW)
    for remote in ("north1", "south1", "idle"):
        hq.add_remote(remote)
    hq.subscribe("north1", "sales", "north", now=NOW)
    hq.subscribe("south1", "sales", "south", now=NOW)
    return hq


# --- publications and articles -------------------------------------------------------

def test_definitions_are_listed(sales):
    (publication,) = sales.publications()
    assert publication == Publication("sales", (Article("customer", ("id", "name", "region"), "region"),
                                                Article("line")))
    assert [(s.remote, s.publication, s.value, s.created_at) for s in sales.subscriptions()] == [
        ("north1", "sales", "north", NOW), ("south1", "sales", "south", NOW)]
    assert [s.remote for s in sales.subscriptions("south1")] == ["south1"]


def test_publishing_a_table_installs_its_capture_and_unpublishing_removes_it(hq, app):
    assert _triggers(hq.connection, "customer") == ["0fieldsync_del", "0fieldsync_ins", "0fieldsync_truncate",
                                                    "0fieldsync_upd"]
    app.execute("INSERT INTO customer (name) VALUES ('a')")
    assert _captured(hq.connection) == 1
    hq.remove_article("customer")
    assert _triggers(hq.connection, "customer") == []
    app.execute("INSERT INTO customer (name) VALUES ('b')")
    app.execute("TRUNCATE customer")  # no longer refused
    assert _captured(hq.connection) == 1
    assert hq.publications() == (Publication("p", ()),)
    hq.add_article("p", "customer", subscribe_by="REGION")  # a name without quotes folds to lower case
    assert hq.publications() == (Publication("p", (Article("customer", None, "region"),)),)


def test_create_publication_returns_it_and_adds_its_articles_in_one_transaction(hq, app):
    app.execute(LINE)
    app.execute("CREATE TABLE no_key (a integer)")
    with pytest.raises(UnpublishableTable, match="has no primary key"):
        hq.create_publication("sales", ["line", "no_key"])
    assert [item.name for item in hq.publications()] == ["p"]
    assert _triggers(hq.connection, "line") == []
    made = hq.create_publication("sales", ["line"])
    assert made == Publication("sales", (Article("line"),))


def _shapes(conn, table: str) -> list[int]:  # type: ignore[no-untyped-def]
    """The shapes the articles of ``table`` name, one per article."""
    return [shape for (shape,) in conn.execute("SELECT shape FROM fieldsync.article WHERE table_name = %s"
                                               " ORDER BY publication", (table,))]


def test_a_table_is_published_once_in_a_publication(sales):
    with pytest.raises(PublicationError, match="'customer' is already published in 'sales'; remove it first"):
        sales.add_article("sales", "customer")
    with pytest.raises(PublicationError, match="'customer' is already published in 'sales'"):
        sales.add_article("sales", "public.customer")


def test_a_table_in_two_publications_has_one_capture_that_goes_with_its_last_article(sales, app):
    sales.create_publication("ledger", [Article("public.customer", columns=["balance"])])
    assert [(item.name, article) for item in sales.publications() for article in item.articles
            if article.table == "customer"] == [("ledger", Article("customer", ("id", "balance"))),
                                                ("sales", Article("customer", ("id", "name", "region"), "region"))]
    first, second = _shapes(sales.connection, "customer")
    assert first == second
    triggers = _triggers(sales.connection, "customer")
    app.execute("INSERT INTO customer (name, region, balance) VALUES ('a', 'north', 1)")
    assert _captured(sales.connection) == 1  # captured once
    sales.remove_article("customer", "sales")
    assert _triggers(sales.connection, "customer") == triggers
    assert [item.name for item in sales.publications() if any(a.table == "customer" for a in item.articles)] == [
        "ledger"]
    with pytest.raises(PublicationError, match="'customer' is not published in 'sales'"):
        sales.remove_article("customer", "sales")
    sales.add_article("sales", "customer", subscribe_by="region")
    sales.drop_publication("ledger")  # the sales article keeps the capture
    assert _triggers(sales.connection, "customer") == triggers
    sales.remove_article("customer")
    assert _triggers(sales.connection, "customer") == []


def test_removing_a_table_without_naming_a_publication_removes_every_article_of_it(sales):
    sales.create_publication("ledger", ["customer"])
    sales.remove_article("customer")
    assert [article.table for item in sales.publications() for article in item.articles] == ["line"]
    assert _triggers(sales.connection, "customer") == []
    assert sales.missing_tables() == ()


def test_bad_definitions_are_refused(sales, app):
    with pytest.raises(UnknownPublication):
        sales.add_article("nope", "line")
    app.execute("CREATE TABLE t (id integer PRIMARY KEY, a text, tags text[], parent integer)")
    app.execute("CREATE TABLE plain (id integer PRIMARY KEY, a text)")
    sales.create_publication("p2")
    with pytest.raises(PublicationError, match="no column 'zzz'"):
        sales.add_article("p2", "plain", columns=["zzz"])
    with pytest.raises(PublicationError, match="SUBSCRIBE BY column 'zzz'"):
        sales.add_article("p2", "plain", subscribe_by="zzz")
    with pytest.raises(UnsupportedColumnType, match="column tags has type text"):
        sales.add_article("p2", "t")
    with pytest.raises(UnpublishableTable, match="does not exist"):
        sales.add_article("p2", "nowhere")
    with pytest.raises(PublicationError, match="'plain' follows 'customer', which is not an article of 'p2'"):
        sales.add_article("p2", "plain", follows="customer")
    with pytest.raises(PublicationError, match="exists already"):
        sales.create_publication("p2")
    with pytest.raises(InvalidSetting, match="publication name"):
        sales.create_publication("")
    with pytest.raises(PublicationError, match="'plain' is not published"):
        sales.remove_article("plain")
    with pytest.raises(UnknownPublication):
        sales.drop_publication("nope")
    assert _triggers(sales.connection, "plain") == [] and _triggers(sales.connection, "t") == []
    assert sales.publications()[0] == Publication("p2", ())


def test_dropping_a_publication_stops_capture_and_subscriptions(sales, app):
    sales.drop_publication("sales")
    app.execute("INSERT INTO line VALUES (1, 1, 'a', 1)")
    assert _captured(sales.connection) == 0
    assert sales.subscriptions() == ()
    assert sales.publications() == ()


def test_tables_of_other_schemas_are_named_with_their_schema(hq, app):
    app.execute("CREATE SCHEMA field")
    app.execute('CREATE TABLE field.visit (id integer PRIMARY KEY, "Crew" text, note text)')
    article = hq.add_article("p", "field.visit", columns=["Crew"], subscribe_by="Crew")
    assert article == Article("field.visit", ("id", "Crew"), "Crew")
    app.execute('CREATE TABLE field.stop (id integer PRIMARY KEY, "Crew" text)')
    with pytest.raises(PublicationError, match="no column 'crew'"):  # a quoted name keeps its case
        hq.create_publication("p2", [Article("field.stop", columns=["crew"])])
    assert [item.name for item in hq.publications()] == ["p"]
    hq.remove_article("field.visit")
    assert _triggers(hq.connection, "field.visit") == []


def test_missing_tables_are_listed_and_can_be_unpublished(sales, app):
    assert sales.missing_tables() == ()
    app.execute("ALTER TABLE line RENAME TO order_line")
    assert sales.missing_tables() == ("line",)
    assert _triggers(sales.connection, "order_line") != []  # the triggers went with the table
    sales.remove_article("line")
    assert _triggers(sales.connection, "order_line") == []  # found by its oid
    app.execute("DROP TABLE customer")
    assert sales.missing_tables() == ("customer",)
    sales.remove_article("customer")
    assert sales.missing_tables() == () and sales.publications() == (Publication("sales", ()),)


# --- subscriptions ---------------------------------------------------------------------

def test_subscription_values_keep_their_type(sales):
    for value in (7, 7.0, "7", b"7", None, -0.5, 2**63 - 1):
        assert sales.subscribe("idle", "sales", value, now=NOW).changed
    assert [item.value for item in sales.subscriptions("idle")] == [7, 7.0, "7", b"7", None, -0.5, 2**63 - 1]
    assert [type(item.value) for item in sales.subscriptions("idle")][:4] == [int, float, str, bytes]
    again = sales.subscribe("idle", "sales", 7.0)
    assert (again.changed, again.subscribed) == (False, True)  # subscribing twice is one subscription
    assert len(sales.subscriptions("idle")) == 7
    assert sales.unsubscribe("idle", "sales", 7.0).changed
    assert [item.value for item in sales.subscriptions("idle")][:2] == [7, "7"]


def test_ending_a_subscription_that_is_not_held_names_those_that_are(sales):
    with pytest.raises(InvalidSetting, match=r"'north1' does not subscribe to 'sales' with 'east'; its "
                                             r"subscriptions: sales='north'"):
        sales.unsubscribe("north1", "sales", "east")
    with pytest.raises(InvalidSetting, match="its subscriptions: none"):
        sales.unsubscribe("idle", "sales")


def test_bad_subscriptions_are_refused(sales):
    with pytest.raises(UnknownRemote):
        sales.subscribe("ghost", "sales", "north")
    with pytest.raises(UnknownPublication):
        sales.subscribe("north1", "nope", "north")
    with pytest.raises(InvalidSetting):
        sales.subscribe("north1", "sales", [1, 2])
    with pytest.raises(InvalidSetting, match="NaN"):
        sales.subscribe("north1", "sales", float("nan"))
    with pytest.raises(InvalidSetting, match="outside SQLite's 64-bit range"):
        sales.subscribe("north1", "sales", 2**63)


def test_a_change_counts_the_rows_that_hold_the_value_as_readers_select(sales, app):
    app.execute("INSERT INTO customer (name, region) VALUES ('a', 'north'), ('b', 'north'), ('c', 'south'),"
                " ('d', NULL), ('e', 'North')")
    assert sales.subscribe("idle", "sales", "north").matching == 2
    assert sales.subscribe("idle", "sales", "west").matching == 0
    assert sales.subscribe("idle", "sales", 7).matching == 0  # text never equals an integer
    assert sales.subscribe("idle", "sales").matching is None  # no value
    assert sales.unsubscribe("idle", "sales", "north").matching == 2
    app.execute("CREATE TABLE shop (id integer PRIMARY KEY, zone bigint)")
    app.execute("CREATE TABLE scale (id integer PRIMARY KEY, weight double precision)")
    app.execute("INSERT INTO shop VALUES (1, 7), (2, 7), (3, 8)")
    app.execute("INSERT INTO scale VALUES (1, 7.0), (2, 2.5), (3, 7.0), (4, 'NaN')")
    sales.create_publication("by_zone", [Article("shop", subscribe_by="zone"),
                                         Article("scale", subscribe_by="weight")])
    sales.create_publication("whole")
    assert sales.subscribe("idle", "by_zone", 7).matching == 4
    assert sales.subscribe("idle", "by_zone", 7.0).matching == 4  # 7.0 == 7, as readers compare
    assert sales.subscribe("idle", "by_zone", 2.5).matching == 1
    assert sales.subscribe("idle", "by_zone", "7").matching == 0
    assert sales.subscribe("idle", "whole", 7).matching is None  # no SUBSCRIBE BY article


def test_an_extracted_remote_s_subscriptions_change_through_its_stream(sales, app):
    """Its new rows as INSERTs with the article's columns, nothing for the
    table it receives whole already (tests/site/postgres/test_resubscribe.py
    has the rest)."""
    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ann', 'east'), (2, 'Bo', 'north')")
    sales.update_remote("north1", peer_incarnation=b"\x02" * 16)
    start = sales.scan()
    added = sales.subscribe("north1", "sales", "east")
    assert (added.streamed, added.inserts, added.deletes) == (True, 1, 0)
    [transaction] = sales.read_log("north1", start)
    assert [(op.key, op.after) for op in transaction.ops] == [((1,), {"id": 1, "name": "Ann", "region": "east"})]
    assert not sales.subscribe("north1", "sales", "north").changed  # held already: nothing to change
    assert [item.value for item in sales.subscriptions("north1")] == ["north", "east"]


def test_a_table_published_where_an_extracted_remote_subscribes_is_sent_through_the_stream(hq, app) -> None:
    """The change that creates it, a log transaction of its own, then its
    rows as INSERTs, then the writes after it (new_tables.py); published in
    a second publication, its rows go to that publication's remote alone."""
    from codec.changes import SchemaChange

    app.execute("CREATE TABLE visit (id integer PRIMARY KEY, note text)")
    app.execute("INSERT INTO visit VALUES (2, 'b'), (1, 'a')")
    hq.add_remote("r1", address="inbox/r1")
    hq.subscribe("r1", "p")
    hq.update_remote("r1", peer_incarnation=bytes(range(16)))  # as extraction records it
    start = hq.scan()
    hq.add_article("p", "visit")
    app.execute("INSERT INTO visit VALUES (3, 'c')")
    transactions = list(hq.read_log("r1", start, hq.scan()))
    # The rows and the application's write after them: one origin, one cut, one log transaction.
    assert [len(transaction.ops) for transaction in transactions] == [1, 3]
    [change] = transactions[0].ops
    assert isinstance(change, SchemaChange) and change.steps == (
        ("create_table", "visit", 'CREATE TABLE "visit" ("id" INTEGER NOT NULL, "note" TEXT, PRIMARY KEY ("id"))',
         "p", None),)
    assert [(op.key, op.after) for op in transactions[1].ops] == [((1,), {"id": 1, "note": "a"}),
                                                                  ((2,), {"id": 2, "note": "b"}),
                                                                  ((3,), {"id": 3, "note": "c"})]
    assert hq.schema_version() == transactions[0].commit
    hq.add_remote("r2", address="inbox/r2")
    hq.create_publication("q")
    hq.subscribe("r2", "q")
    hq.update_remote("r2", peer_incarnation=bytes(range(1, 17)))
    end = hq.scan()
    hq.add_article("q", "visit")  # in a second publication: its rows go to r2 alone (the next test)
    assert [op.key for transaction in hq.read_log("r2", end, hq.scan()) for op in transaction.ops
            if not isinstance(op, SchemaChange)] == [(1,), (2,), (3,)]
    assert [type(op).__name__ for transaction in hq.read_log("r1", end) for op in transaction.ops] == [
        "SchemaChange"]


def test_a_table_that_follows_its_parent_published_where_extracted_remotes_subscribe_goes_by_its_routes(
        sales, app, monkeypatch) -> None:
    """Its change carries its foreign key, its rows reach the subscribers of
    their parents, and a parent moved before its rows are sent (a process
    that died between the two transactions) sends each row once, with the
    route it has then (new_tables.py)."""
    from codec.changes import SchemaChange

    app.execute("INSERT INTO customer (id, name, region) VALUES (1, 'Ann', 'north'), (2, 'Bo', 'south')")
    app.execute("CREATE TABLE visit (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id), note text)")
    app.execute("INSERT INTO visit VALUES (10, 1, 'a'), (20, 2, 'b'), (30, NULL, 'c')")
    for number, remote in enumerate(("north1", "south1")):
        sales.update_remote(remote, peer_incarnation=bytes([number + 1]) * 16)
    start = sales.scan()
    with monkeypatch.context() as patched:
        patched.setattr(sales, "_finish_sends", lambda: None)  # dies before the rows are sent
        sales.add_article("sales", "visit", follows="customer")
    app.execute("UPDATE customer SET region = 'south' WHERE id = 1")  # customer 1 and its visit move to south1
    end = sales.scan()  # the next run sends the rows
    north = list(sales.read_log("north1", start, end))
    [change] = north[0].ops
    assert isinstance(change, SchemaChange)
    (step,) = [step for step in change.steps if step[0] == "create_table"]
    assert step[4] is None and 'FOREIGN KEY ("customer_id") REFERENCES "customer" ("id")' in step[2]
    assert [(op.table, op.kind) for transaction in north[1:] for op in transaction.ops] == [
        ("customer", OpKind.DELETE)]
    south = [(op.table, op.kind, op.key) for transaction in sales.read_log("south1", start, end)
             for op in transaction.ops if not isinstance(op, SchemaChange)]
    assert south == [("customer", OpKind.INSERT, (1,)), ("visit", OpKind.INSERT, (10,)),
                     ("visit", OpKind.INSERT, (20,))]


def test_a_table_added_to_a_second_publication_reaches_its_extracted_subscribers_alone(hq, app) -> None:
    """member is in regions already (captured for r1); published in reps
    too, its rows go to reps' extracted subscriber r3 alone, written back
    to it after the change, in the transaction that publishes it; r1, which
    holds the table, gets the change only.  A remote of the new publication
    that gets the table through another already is refused (new_tables.py)."""
    from codec.changes import SchemaChange

    app.execute("CREATE TABLE member (id integer PRIMARY KEY, name text, region text, rep text,"
                " price double precision NOT NULL)")
    app.execute("INSERT INTO member VALUES (1, 'a', 'north', 'ann', 1.0), (2, 'b', 'north', 'bob', 2.0),"
                " (3, 'c', 'south', 'ann', 3.0), (4, 'd', 'south', 'bob', 4.0)")
    hq.create_publication("regions", [Article("member", columns=["name", "region"], subscribe_by="region")])
    hq.create_publication("reps")
    for number, (remote, publication, value) in enumerate((("r1", "regions", "north"), ("r3", "reps", "ann"))):
        hq.add_remote(remote, address=f"inbox/{remote}")
        hq.subscribe(remote, publication, value)
        hq.update_remote(remote, peer_incarnation=bytes([number + 1]) * 16)
    start = hq.scan()
    hq.add_article("reps", "member", columns=["price"], subscribe_by="rep")
    app.execute("UPDATE member SET price = 5.0 WHERE id = 3")  # after the rows: r3 gets it after them
    end = hq.scan()
    assert [type(op).__name__ for transaction in hq.read_log("r1", start, end) for op in transaction.ops] == [
        "SchemaChange"]
    r3 = [op for transaction in hq.read_log("r3", start, end) for op in transaction.ops]
    assert isinstance(r3[0], SchemaChange)
    assert [(op.kind, op.key, op.after) for op in r3[1:]] == [
        (OpKind.INSERT, (1,), {"id": 1, "price": 1.0}), (OpKind.INSERT, (3,), {"id": 3, "price": 3.0}),
        (OpKind.UPDATE, (3,), {"price": 5.0})]
    hq.subscribe("r1", "reps", "bob")
    hq.create_publication("more")
    hq.subscribe("r1", "more")
    before = hq.scan()
    with pytest.raises(PublicationError, match="'r1' subscribes to 'more' and gets 'member' through 'regions' "
                                               "already"):
        hq.add_article("more", "member")
    assert hq.scan() == before
    assert [item.name for item in hq.publications() if item.articles] == ["p", "regions", "reps"]
