"""Rows that follow their parent, on a consolidated of either backend
(docs/site-database.md, "Rows that follow their parent"; docs/postgres.md,
"Rows that follow their parent"): ``customer@rep``, ``orders@->customer``,
``order_line@->orders``, two SQLite remotes made by extraction, rounds by
hand (tests/site/conftest.py's ``replicate``)."""

from __future__ import annotations

import contextlib

import pytest

from agent.site import Article, SiteDatabase
from agent.site.errors import PublicationError
from agent.site.extraction import Extraction
from codec.ops import OpKind
from tests.site.sessions import App

from ..conftest import app_connection, replicate, table_rows

TABLES = (
    "DROP TABLE customer",
    "CREATE TABLE customer (id integer PRIMARY KEY, name text, rep integer)",
    "CREATE TABLE orders (id integer PRIMARY KEY, customer_id integer REFERENCES customer (id), note text)",
    "CREATE TABLE order_line (id integer PRIMARY KEY, order_id integer REFERENCES orders (id), qty integer)",
)
REPS = {"rep1": 1, "rep2": 2}
ARTICLES = [Article("customer", subscribe_by="rep"), Article("orders", follows="customer"),
            Article("order_line", follows="orders")]


def seed(app: App) -> None:
    app.run(*[("INSERT INTO customer VALUES (%s, %s, %s)", (number, f"c{number}", 1 + number % 2))
              for number in range(1, 7)])
    app.run(*[("INSERT INTO orders VALUES (%s, %s, %s)", (number, 1 + number % 6, f"o{number}"))
              for number in range(10, 22)])
    app.run(*[("INSERT INTO order_line VALUES (%s, %s, %s)", (number, 10 + number % 12, number))
              for number in range(100, 136)])


class World:
    def __init__(self, backend, tmp_path, tables: tuple[str, ...] = TABLES) -> None:  # type: ignore[no-untyped-def]
        self.backend = backend
        self.hq = backend.site
        self.app = backend.app()
        self.app.run(*tables)
        self.hq.create_publication("sales", ARTICLES)
        seed(self.app)
        self.remotes: dict[str, SiteDatabase] = {}
        for name, rep in REPS.items():
            self.hq.add_remote(name)
            self.hq.subscribe(name, "sales", rep)
            self.hq.extract(name, tmp_path / f"{name}.db")
            self.remotes[name] = SiteDatabase.open(tmp_path / f"{name}.db")
        self.apps = {name: App(app_connection(remote), True) for name, remote in self.remotes.items()}

    def held(self, name: str) -> dict[str, list[tuple]]:
        """What remote ``name`` holds of each table."""
        return {table: table_rows(self.remotes[name], table) for table in ("customer", "orders", "order_line")}

    def owed(self, rep: int) -> dict[str, list[tuple]]:
        """What the subscriber of ``rep`` must hold: its customers, their
        orders, and those orders' lines, as the consolidated holds them."""
        return {
            "customer": self.backend.rows("customer", "*", f"WHERE rep = {rep}"),
            "orders": self.backend.rows("orders", "*", "WHERE customer_id IN (SELECT id FROM customer"
                                                      f" WHERE rep = {rep})"),
            "order_line": self.backend.rows("order_line", "*", "WHERE order_id IN (SELECT o.id FROM orders o"
                                                              " JOIN customer c ON c.id = o.customer_id"
                                                              f" WHERE c.rep = {rep})"),
        }

    def full_round(self) -> None:
        """Every remote to the consolidated, then the consolidated to each."""
        remotes = list(self.remotes.values())
        for publisher, subscriber in [(remote, self.hq) for remote in remotes] + [(self.hq, r) for r in remotes]:
            replicate(publisher, subscriber)

    def assert_converged(self) -> None:
        for name, rep in REPS.items():
            assert self.held(name) == self.owed(rep), name
        assert self.hq.apply_errors() == () and all(r.apply_errors() == () for r in self.remotes.values())

    def close(self) -> None:
        for app in self.apps.values():
            app.close()
        for remote in self.remotes.values():
            remote.close()


@pytest.fixture
def world(backend, tmp_path):
    with contextlib.closing(World(backend, tmp_path)) as made:
        yield made


def test_a_line_added_at_hq_under_an_order_its_remote_deletes_meanwhile_is_held_by_neither(backend, tmp_path):
    """hq adds a line to an order of rep 1 while rep 1, which has not
    heard of it, deletes the order and the lines it knows; the lines
    follow their order ON DELETE CASCADE.  The consolidated applies the
    DELETE (PostgreSQL's key cascades the line away there, as rep 1's
    change; SQLite's apply runs with its keys off and keeps it, reaching
    nobody), and the line reaches rep 1 after its order went there: rep 1
    refuses it as its key would (a copy extracted from PostgreSQL carries
    no foreign key, so the apply checks the parent itself), instead of
    holding a line whose order it lacks."""
    cascading = (*TABLES[:3], TABLES[3].replace("REFERENCES orders (id)", "REFERENCES orders (id) ON DELETE CASCADE"))
    assert cascading != TABLES
    with contextlib.closing(World(backend, tmp_path, cascading)) as world:
        lines = [row[0] for row in world.held("rep1")["order_line"] if row[1] == 11]  # order 11: customer 2, rep 1
        assert lines
        world.app.run(("INSERT INTO order_line VALUES (%s, %s, %s)", (777, 11, 7)))
        world.apps["rep1"].run(("DELETE FROM order_line WHERE order_id = %s", (11,)),
                               ("DELETE FROM orders WHERE id = %s", (11,)))
        world.full_round()
        world.full_round()
        for name, rep in REPS.items():
            assert world.held(name) == world.owed(rep), name
        assert 777 not in [row[0] for row in world.held("rep1")["order_line"]]
        assert [(error.table, error.key) for error in world.remotes["rep1"].apply_errors()] == [("order_line", (777,))]
        assert world.remotes["rep1"].connection.execute("PRAGMA foreign_key_check").fetchall() == []


def test_extraction_gives_each_remote_exactly_its_customers_orders_and_lines(world):
    for name, rep in REPS.items():
        held = world.held(name)
        assert held == world.owed(rep) and all(held.values()), name
    assert [(article.table, article.follows) for article in world.hq.publications()[0].articles] == [
        ("customer", None), ("order_line", "orders"), ("orders", "customer")]
    # The remote's catalogue records them: there a child lives and dies with its parent.
    assert sorted((article.table, article.follows) for article in world.remotes["rep1"].publications()[0].articles) == [
        ("customer", None), ("order_line", "orders"), ("orders", "customer")]


def test_a_moved_customer_takes_its_orders_and_lines_and_new_rows_reach_their_parents_subscribers(world):
    moved = world.backend.rows("orders", "id", "WHERE customer_id = 2")
    assert moved and world.held("rep1")["customer"][0][0] == 2  # customer 2 is rep 1's, with orders
    world.app.run("UPDATE customer SET rep = 2 WHERE id = 2",
                  ("INSERT INTO order_line VALUES (%s, %s, %s)", (500, moved[0][0], 5)))
    # At rep 2 (before it hears of the move): an order with a line for its customer 1.
    world.apps["rep2"].run("INSERT INTO orders VALUES (900, 1, 'from rep2')",
                           "INSERT INTO order_line VALUES (901, 900, 1)")
    world.full_round()
    world.assert_converged()
    rep1 = world.held("rep1")
    assert 2 not in [row[0] for row in rep1["customer"]]
    assert not {row[0] for row in rep1["orders"]} & {row[0] for row in moved}
    assert 500 not in [row[0] for row in rep1["order_line"]]
    rep2 = world.held("rep2")
    assert (500, moved[0][0], 5) in rep2["order_line"] and (900, 1, "from rep2") in rep2["orders"]
    assert (901, 900, 1) in rep2["order_line"]
    world.full_round()  # a quiet round changes nothing
    world.assert_converged()


def test_a_move_is_one_log_transaction_children_before_parents(world):
    end = world.hq.scan()
    world.app.run("UPDATE customer SET rep = 2 WHERE id = 2")
    world.hq.scan()
    [lost] = list(world.hq.read_log("rep1", end))
    kinds = [(op.table, op.kind) for op in lost.ops]
    assert {kind for _table, kind in kinds} == {OpKind.DELETE}
    tables = [table for table, _kind in kinds]
    assert tables.index("customer") > max(i for i, t in enumerate(tables) if t == "orders") > max(
        i for i, t in enumerate(tables) if t == "order_line")
    [gained] = list(world.hq.read_log("rep2", end))
    assert {op.kind for op in gained.ops} == {OpKind.INSERT}
    assert sorted({op.table for op in gained.ops}) == ["customer", "order_line", "orders"]


def test_an_order_handed_to_another_customer_moves_with_its_lines(world):
    order = world.backend.rows("orders", "id", "WHERE customer_id = 2")[0][0]  # rep 1's customer
    world.app.run(f"UPDATE orders SET customer_id = 1 WHERE id = {order}")  # rep 2's
    world.full_round()
    world.assert_converged()
    assert order in [row[0] for row in world.held("rep2")["orders"]]
    assert order not in [row[0] for row in world.held("rep1")["orders"]]


def test_a_remotes_child_of_a_parent_missing_at_the_consolidated_is_an_apply_error_there(world):
    world.apps["rep1"].run("INSERT INTO orders VALUES (950, 77, 'no such customer')")
    replicate(world.remotes["rep1"], world.hq)
    errors = world.hq.apply_errors()
    assert len(errors) == 1 and errors[0].table == "orders"
    assert world.backend.rows("orders", "id", "WHERE id = 950") == []
    replicate(world.hq, world.remotes["rep1"])  # the refused row leaves its origin too
    assert 950 not in [row[0] for row in world.held("rep1")["orders"]]


def test_a_remotes_order_handed_to_a_missing_customer_goes_back_whole(world):
    order = world.backend.rows("orders", "id", "WHERE customer_id = 2")[0][0]  # rep 1's
    lines = world.backend.rows("order_line", "*", f"WHERE order_id = {order}")
    world.apps["rep1"].run(f"UPDATE orders SET customer_id = 77 WHERE id = {order}")  # no customer 77 at hq
    replicate(world.remotes["rep1"], world.hq)
    assert [error.table for error in world.hq.apply_errors()] == ["orders"]
    replicate(world.hq, world.remotes["rep1"])
    assert [row for row in world.held("rep1")["orders"] if row[0] == order] == world.backend.rows(
        "orders", "*", f"WHERE id = {order}")
    assert lines and [row for row in world.held("rep1")["order_line"] if row[1] == order] == lines


def test_a_follow_article_is_refused_without_its_parent_or_key(backend):
    backend.app().run(*TABLES, "CREATE TABLE note (id integer PRIMARY KEY, body text)",
                      "CREATE TABLE visit (id integer PRIMARY KEY, host integer REFERENCES customer (id),"
                      " guest integer REFERENCES customer (id))")
    backend.site.create_publication("sales", [Article("customer", subscribe_by="rep")])
    with pytest.raises(PublicationError, match="not an article of 'sales'"):
        backend.site.add_article("sales", "order_line", follows="orders")
    with pytest.raises(PublicationError, match="has no foreign key to 'customer'"):
        backend.site.add_article("sales", "note", follows="customer")
    with pytest.raises(PublicationError, match="has 2 foreign keys to 'customer'; name the one to follow"):
        backend.site.add_article("sales", "visit", follows="customer")
    with pytest.raises(PublicationError, match=r"has no foreign key \(id\) to 'customer'"):
        backend.site.add_article("sales", "visit", follows="customer", follow_columns=["id"])
    assert backend.site.add_article("sales", "visit", follows="customer", follow_columns=["guest"]).follow_columns == (
        "guest",)
    backend.site.add_article("sales", "orders", follows="customer")
    with pytest.raises(PublicationError, match="follow 'customer': remove them first"):
        backend.site.remove_article("customer")


def test_a_child_a_remote_writes_under_another_reps_parent_leaves_it_for_that_rep(world):
    """rep 1 writes an order (and a line) for customer 1, rep 2's: the
    consolidated routes them to rep 2, and sends them back out of rep 1."""
    world.apps["rep1"].run("INSERT INTO orders VALUES (960, 1, 'for rep 2')",
                           "INSERT INTO order_line VALUES (961, 960, 4)")
    world.full_round()
    world.full_round()
    world.assert_converged()
    assert (960, 1, "for rep 2") in world.held("rep2")["orders"]
    assert 960 not in [row[0] for row in world.held("rep1")["orders"]]


def test_a_conflict_on_a_child_goes_back_whole_to_its_origin(world):
    order = world.backend.rows("orders", "id", "WHERE customer_id = 2")[0][0]  # rep 1's
    world.app.run(f"UPDATE orders SET note = 'hq' WHERE id = {order}")
    world.apps["rep1"].run(f"UPDATE orders SET note = 'rep1' WHERE id = {order}")
    world.full_round()
    world.full_round()
    assert len(world.hq.conflicts()) == 1
    world.assert_converged()
    assert (order, 2, "rep1") in world.held("rep1")["orders"]


@pytest.mark.parametrize("first", ["hq", "rep1"])
def test_an_order_written_at_rep1_while_hq_moves_its_customer_ends_at_rep2(world, first):
    """rep 1 inserts an order (with a line) for customer 2 while hq gives
    customer 2 to rep 2: whichever change reaches its peer first, the
    order goes to rep 2 and leaves rep 1 with its customer, and no site
    records an error."""
    world.apps["rep1"].run("INSERT INTO orders VALUES (970, 2, 'rep1 at the move')",
                           "INSERT INTO order_line VALUES (971, 970, 7)")
    world.app.run("UPDATE customer SET rep = 2 WHERE id = 2")
    if first == "hq":
        replicate(world.hq, world.remotes["rep1"])
        replicate(world.remotes["rep1"], world.hq)
    else:
        replicate(world.remotes["rep1"], world.hq)
        replicate(world.hq, world.remotes["rep1"])
    world.full_round()
    world.full_round()
    world.assert_converged()
    assert (970, 2, "rep1 at the move") in world.held("rep2")["orders"] and world.held("rep1")["orders"] == [
        row for row in world.held("rep1")["orders"] if row[1] != 2]


def test_remotes_extracted_together_get_exactly_their_customers_orders_and_lines(world, tmp_path):
    """extract_many (each table read once for every remote, on PostgreSQL)
    selects by route as extract does: rep 1's copy made again after its
    customer 2 moved to rep 2 holds nothing of it."""
    world.app.run("UPDATE customer SET rep = 2 WHERE id = 2")
    for remote in world.remotes.values():
        remote.close()
    world.remotes.clear()
    results = list(world.hq.extract_many([Extraction(name, tmp_path / f"again-{name}.db") for name in REPS]))
    assert [result.remote for result in results] == list(REPS)
    world.remotes.update({name: SiteDatabase.open(tmp_path / f"again-{name}.db") for name in REPS})
    for name, rep in REPS.items():
        assert world.held(name) == world.owed(rep), name
    assert 2 not in [row[1] for row in world.held("rep1")["orders"]]


@pytest.mark.parametrize("case", ["a new order", "a changed order"])
def test_an_order_rep1_wrote_under_a_customer_that_went_away_and_came_back_stays_there(world, case):
    """rep 1 writes an order of customer 2 while hq moves customer 2 to rep
    2 and back, and hq applies rep 1's change before rep 1 hears of the
    moves: at rep 1 the order goes with its customer, and hq sends it back
    whole (it lies under a parent that left rep 1 and came back, unconfirmed)."""
    order = world.backend.rows("orders", "id", "WHERE customer_id = 2")[0][0]
    if case == "a new order":
        order = 980
        world.apps["rep1"].run("INSERT INTO orders VALUES (980, 2, 'rep1 wrote')",
                               "INSERT INTO order_line VALUES (981, 980, 5)")
    else:
        world.apps["rep1"].run(f"UPDATE orders SET note = 'rep1 wrote' WHERE id = {order}")
    world.app.run("UPDATE customer SET rep = 2 WHERE id = 2")
    world.hq.scan()
    world.app.run("UPDATE customer SET rep = 1 WHERE id = 2")
    replicate(world.remotes["rep1"], world.hq)
    replicate(world.hq, world.remotes["rep1"])
    world.full_round()
    world.assert_converged()
    assert world.backend.rows("orders", "note", f"WHERE id = {order}") == [("rep1 wrote",)]
    assert (order, 2, "rep1 wrote") in world.held("rep1")["orders"]



def test_a_composite_key_chain_routes_each_row_and_a_null_key_goes_nowhere(backend):
    """A chain through a composite foreign key (line -> orders (id, shop)
    -> shop), on either backend; a line whose key is NULL goes to nobody;
    a shop moved to another region takes its orders and their lines."""
    backend.app().run(
        "DROP TABLE line",
        "CREATE TABLE shop (id integer PRIMARY KEY, region text)",
        "CREATE TABLE orders (id integer NOT NULL, shop integer NOT NULL REFERENCES shop (id), note text,"
        " PRIMARY KEY (id, shop))",
        "CREATE TABLE line (id integer PRIMARY KEY, order_id integer, order_shop integer, qty integer,"
        " FOREIGN KEY (order_id, order_shop) REFERENCES orders (id, shop))")
    hq = backend.site
    hq.create_publication("sales", [Article("shop", subscribe_by="region"), Article("orders", follows="shop"),
                                    Article("line", follows="orders", follow_columns=("order_id", "order_shop"))])
    for name, region in (("north", "n"), ("south", "s")):
        hq.add_remote(name)
        hq.subscribe(name, "sales", region)
    start = hq.scan()
    backend.app().run("INSERT INTO shop VALUES (1, 'n'), (2, 's')",
                      "INSERT INTO orders VALUES (10, 1, 'a'), (10, 2, 'b')",
                      "INSERT INTO line VALUES (100, 10, 1, 1), (101, 10, 2, 2), (102, NULL, NULL, 3)")

    def keys(remote: str, after: int) -> list[tuple]:
        end = hq.scan()
        return sorted((op.table, op.kind, op.key) for transaction in hq.read_log(remote, after, end)
                      for op in transaction.ops)
    assert keys("north", start) == [("line", OpKind.INSERT, (100,)), ("orders", OpKind.INSERT, (10, 1)),
                                    ("shop", OpKind.INSERT, (1,))]
    assert keys("south", start) == [("line", OpKind.INSERT, (101,)), ("orders", OpKind.INSERT, (10, 2)),
                                    ("shop", OpKind.INSERT, (2,))]
    end = hq.scan()
    backend.app().run("UPDATE shop SET region = 's' WHERE id = 1")
    assert keys("north", end) == [("line", OpKind.DELETE, (100,)), ("orders", OpKind.DELETE, (10, 1)),
                                  ("shop", OpKind.DELETE, (1,))]
    assert keys("south", end) == [("line", OpKind.INSERT, (100,)), ("orders", OpKind.INSERT, (10, 1)),
                                  ("shop", OpKind.INSERT, (1,))]


def test_a_child_no_longer_published_no_longer_moves_with_its_parent(world):
    world.hq.remove_article("order_line")
    end = world.hq.scan()
    world.app.run("UPDATE customer SET rep = 2 WHERE id = 2")
    world.hq.scan()
    assert sorted({op.table for transaction in world.hq.read_log("rep2", end) for op in transaction.ops}) == [
        "customer", "orders"]


def test_a_send_phase_reads_only_for_the_reps_a_range_concerns(world):
    """Site.concerned_reads (agent.site.concern) with rows that follow their
    parent, among many more reps: a line added under a rep 2 customer's
    order names rep 2's subscriber alone; a customer's move, which carries
    its orders and lines, names its old and new rep; nobody whose own read
    yields anything is left out."""
    hq = world.hq
    others = [f"rep{number}" for number in range(10, 30)]
    for number, name in enumerate(others, start=10):
        hq.add_remote(name)
        hq.subscribe(name, "sales", number)
    everyone = [*REPS, *others]

    def concerned(after: int, end: int) -> set[str]:
        reads = [(name, after, end) for name in everyone]
        return {reads[index][0] for index in hq.concerned_reads(reads)}

    def yielding(after: int, end: int) -> set[str]:
        return {name for name in everyone if list(hq.read_log(name, after, end))}

    start = hq.scan()
    world.app.execute("INSERT INTO order_line VALUES (200, 11, 9)")  # order 11 is customer 6's, rep 1's
    added = hq.scan()
    assert concerned(start, added) == yielding(start, added) == {"rep1"}
    world.app.execute("UPDATE customer SET rep = 12 WHERE id = 6")
    end = hq.scan()
    assert concerned(added, end) == yielding(added, end) == {"rep1", "rep12"}
    assert yielding(start, end) <= concerned(start, end)
