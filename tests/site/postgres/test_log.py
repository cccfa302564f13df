"""agent.site.postgres.log: cuts give offsets to finished transactions only,
in an order replay can trust; reading and truncating the log."""

from __future__ import annotations

import threading

import psycopg
import pytest

from agent.site.errors import LogOffsetError, LogTruncated
from agent.site.postgres.capture import install_capture, load_shapes, set_origin
from agent.site.postgres.connect import connect
from agent.site.postgres import log
from agent.site.postgres.log import check_boundary, cut, iter_capture, log_end, truncate_log, truncated_through

from .replay import Copy, operations

ACCOUNT = "CREATE TABLE account (id integer PRIMARY KEY, owner text, balance bigint)"


@pytest.fixture
def account(site, target):
    site.execute(ACCOUNT)
    install_capture(site, target, "account")
    return site


@pytest.fixture
def other(target):
    """A second application session."""
    conn = connect(target)
    yield conn
    conn.close()


def _read(conn, after: int, until: int) -> list[tuple[int, str, list[tuple]]]:
    return [(commit, origin, rows) for commit, origin, rows in iter_capture(conn, after, until)]


def _values(rows: list[tuple]) -> list[tuple]:
    return [row[4:] for row in rows]


def test_a_transaction_open_across_cuts_gets_its_offset_when_it_has_finished(account, other, target):
    other.execute("BEGIN")
    other.execute("INSERT INTO account VALUES (1, 'long', 10)")  # written first: the lowest seq
    account.execute("INSERT INTO account VALUES (2, 'short', 20)")
    first = cut(account, target, "hq")
    second = cut(account, target, "hq")  # still open: nothing new
    assert (first.log_end, first.transactions, second.log_end, second.transactions) == (1, 1, 1, 0)
    assert [_values(rows) for _, _, rows in _read(account, 0, 1)] == [[(2, "short", 20)]]
    other.execute("COMMIT")
    third = cut(account, target, "hq")
    assert (third.log_end, third.transactions) == (2, 1)
    [(commit, _, rows)] = _read(account, 1, 2)
    assert commit == 2 and _values(rows) == [(1, "long", 10)]
    assert rows[0][0] < _read(account, 0, 1)[0][2][0][0]  # its seq is below the earlier offset's row


def test_rolled_back_work_leaves_nothing(account, target):
    with pytest.raises(psycopg.errors.DivisionByZero):
        with account.transaction():
            account.execute("INSERT INTO account VALUES (1, 'gone', 1)")
            account.execute("SELECT 1/0")
    with account.transaction():
        account.execute("INSERT INTO account VALUES (2, 'kept', 2)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            with account.transaction():  # a savepoint
                account.execute("INSERT INTO account VALUES (3, 'savepoint', 3)")
                account.execute("INSERT INTO account VALUES (3, 'again', 3)")
    end = cut(account, target, "hq").log_end
    assert [_values(rows) for _, _, rows in _read(account, 0, end)] == [[(2, "kept", 2)]]


def test_within_a_cut_a_transaction_that_waited_for_another_comes_after_it(account, other, target):
    """``other`` gets its transaction id first, then waits for ``account``'s
    row lock: ordering by transaction id would replay its UPDATE before the
    INSERT it updates.  By last seq the order is right."""
    other.execute("INSERT INTO account VALUES (1, 'seed', 0)")
    cut(account, target, "hq")
    other.execute("BEGIN")
    other.execute("INSERT INTO account VALUES (2, 'other first', 0)")  # other's xid is the older one
    account.execute("BEGIN")
    account.execute("UPDATE account SET balance = 5 WHERE id = 1")
    account.execute("INSERT INTO account VALUES (3, 'account', 0)")
    waiter = threading.Thread(target=lambda: other.execute("UPDATE account SET balance = balance * 10 WHERE id = 1"))
    waiter.start()
    waiter.join(0.3)
    assert waiter.is_alive()  # blocked on account's row lock
    account.execute("COMMIT")
    waiter.join(10)
    other.execute("COMMIT")
    finished = cut(account, target, "hq")
    assert finished.transactions == 2
    members = account.execute("SELECT txid::text::bigint FROM fieldsync.log_txn ORDER BY commit_offset, position"
                              ).fetchall()
    assert members[-2] > members[-1]  # the older transaction id replays last
    copy = Copy()
    copy.apply(operations([row for _, _, rows in _read(account, 0, finished.log_end) for row in rows],
                          load_shapes(account)))
    assert not copy.problems
    assert copy.rows("account") == account.execute("SELECT * FROM account ORDER BY id").fetchall()


def test_offsets_below_the_log_end_never_change(account, other, target):
    account.execute("INSERT INTO account VALUES (1, 'a', 1)")
    end = cut(account, target, "hq").log_end
    before = _read(account, 0, end)
    other.execute("BEGIN")
    other.execute("UPDATE account SET balance = 2 WHERE id = 1")
    cut(account, target, "hq")
    other.execute("COMMIT")
    account.execute("INSERT INTO account VALUES (2, 'b', 2)")
    later = cut(account, target, "hq").log_end
    assert later > end and _read(account, 0, end) == before


def test_an_empty_cut_changes_nothing_but_its_snapshot(account, target):
    account.execute("INSERT INTO account VALUES (1, 'a', 1)")
    assert cut(account, target, "hq").log_end == 1
    assert cut(account, target, "hq") == cut(account, target, "hq")
    assert account.execute("SELECT count(*) FROM fieldsync.log").fetchone() == (1,)


def test_truncation_removes_confirmed_entries_and_keeps_the_rest(account, other, target):
    for n in range(3):
        account.execute(f"INSERT INTO account VALUES ({n}, 'row', {n})")
        cut(account, target, "hq")
    other.execute("BEGIN")
    other.execute("INSERT INTO account VALUES (10, 'uncut', 10)")
    assert truncate_log(account, target, 2) == 2
    other.execute("COMMIT")
    end = cut(account, target, "hq").log_end
    assert end == 4 and log_end(account) == 4 and truncated_through(account) == 2
    assert [commit for commit, _, _ in _read(account, 2, end)] == [3, 4]
    assert _values(_read(account, 3, 4)[0][2]) == [(10, "uncut", 10)]
    assert account.execute("SELECT count(*) FROM fieldsync.capture").fetchone() == (2,)
    with pytest.raises(LogTruncated):
        check_boundary(account, 1, "start offset")
    check_boundary(account, 2, "start offset")
    check_boundary(account, 3, "start offset")
    with pytest.raises(LogOffsetError):
        check_boundary(account, 5, "end offset")
    with pytest.raises(LogOffsetError):
        truncate_log(account, target, 9)
    assert truncate_log(account, target, 4) == 4 and log_end(account) == 4
    account.execute("INSERT INTO account VALUES (11, 'next', 11)")
    assert cut(account, target, "hq").log_end == 5  # offsets never go back


def test_cuts_from_two_sessions_never_share_a_transaction(account, target):
    stop = threading.Event()
    errors: list[BaseException] = []

    def cutter() -> None:
        conn = connect(target)
        try:
            while not stop.is_set():
                cut(conn, target, "hq")
        except BaseException as error:  # reported by the test
            errors.append(error)
        finally:
            conn.close()

    threads = [threading.Thread(target=cutter) for _ in range(2)]
    for thread in threads:
        thread.start()
    for n in range(300):
        account.execute("INSERT INTO account VALUES (%s, 'w', %s)", (n, n))
    stop.set()
    for thread in threads:
        thread.join(30)
    assert not errors
    cut(account, target, "hq")
    assert account.execute("SELECT count(*), count(DISTINCT txid) FROM fieldsync.log_txn").fetchone() == (300, 300)
    offsets = [row[0] for row in account.execute("SELECT commit_offset FROM fieldsync.log ORDER BY 1")]
    assert offsets == list(range(1, len(offsets) + 1))


def _logged_rows(conn) -> list[tuple]:  # type: ignore[no-untyped-def]
    """Every logged capture row, in replay order, straight from the tables."""
    return [tuple(row) for row in conn.execute(
        "SELECT t.commit_offset, c.seq FROM fieldsync.log_txn t JOIN fieldsync.capture c ON c.txid = t.txid"
        " AND c.origin IS NOT DISTINCT FROM t.origin ORDER BY t.commit_offset, t.position, c.seq")]


def test_reading_in_chunks_of_any_size_gives_every_row_once_in_replay_order(account, other, target):
    """Log transactions of several writing transactions (two sessions, one
    cut), a large one, and single rows: read a chunk at a time of any
    size, the rows are those of the log in replay order, each chunk of one
    log transaction and at most ``chunk`` rows."""
    other.execute("BEGIN")
    other.execute("INSERT INTO account VALUES (1, 'other', 1)")
    account.execute("INSERT INTO account SELECT n, 'bulk', n FROM generate_series(100, 124) AS n")
    other.execute("INSERT INTO account VALUES (2, 'other', 2)")
    other.execute("COMMIT")
    account.execute("INSERT INTO account VALUES (3, 'single', 3)")
    cut(account, target, "hq")
    for n in range(4, 9):
        account.execute(f"INSERT INTO account VALUES ({n}, 'single', {n})")
        cut(account, target, "hq")
    end = log_end(account)
    expected = _logged_rows(account)
    assert len(expected) == 33
    for chunk in (1, 2, 3, 7, 24, 25, 26, 1000):
        read = list(iter_capture(account, 0, end, chunk=chunk))
        assert all(0 < len(rows) <= chunk for _, _, rows in read)
        assert [(commit, row[0]) for commit, _, rows in read for row in rows] == expected, chunk
        assert [(commit, row[0]) for commit, _, rows in iter_capture(account, 1, 3, chunk=chunk)
                for row in rows] == [entry for entry in expected if 1 < entry[0] <= 3]


class _Counting:
    """A connection that counts the statements run through it."""

    def __init__(self, conn: psycopg.Connection) -> None:
        self.conn, self.statements = conn, 0

    def execute(self, *arguments, **options):  # type: ignore[no-untyped-def]
        self.statements += 1
        return self.conn.execute(*arguments, **options)


def test_a_large_writing_transaction_comes_a_chunk_at_a_time_as_it_is_read(account, target):
    """Its first chunk is handed out after one statement, not once the whole
    transaction is read; then a statement per chunk (and one to find it)."""
    account.execute("INSERT INTO account SELECT n, 'bulk', n FROM generate_series(1, 95) AS n")
    account.execute("INSERT INTO account VALUES (100, 'after', 100)")
    end = cut(account, target, "hq").log_end
    counting = _Counting(account)
    chunks = iter_capture(counting, 0, end, chunk=10)
    first = next(chunks)
    assert [row[4] for row in first[2]] == list(range(1, 11)) and counting.statements <= 2  # the shapes, a page
    rest = list(chunks)
    assert [len(rows) for _, _, rows in rest] == [10] * 8 + [6]  # one log transaction
    assert [row[4] for _, _, rows in [first, *rest] for row in rows] == [*range(1, 96), 100]
    # The shapes, the first page, the member found, its 9 pages, the page of
    # the second writing transaction, and the empty page after it.
    assert counting.statements <= 14


def _plan_nodes(plan: dict) -> list[tuple[str, str | None]]:
    """``(node type, index name)`` of every node of an EXPLAIN (FORMAT JSON) plan."""
    return [(plan["Node Type"], plan.get("Index Name")),
            *(node for child in plan.get("Plans", []) for node in _plan_nodes(child))]


@pytest.mark.parametrize("origin", [None, "north1"])
def test_the_rest_of_a_large_writing_transaction_is_read_by_its_index_range(account, target, origin):
    """Once the statistics know one transaction holds most capture rows,
    its rest is still read by capture's (txid, seq) index, a page at a
    time, not by a scan of the whole table and a sort for every page."""
    with account.transaction():
        if origin is not None:
            set_origin(account, origin)
        account.execute("INSERT INTO account SELECT n, 'bulk', n FROM generate_series(1, 5000) AS n")
    account.execute("ANALYZE fieldsync.capture")
    cut(account, target, "hq")
    txid, stored_origin = account.execute(log._MEMBER, (1, 0)).fetchone()
    statement = log._APPLICATION_ROWS if stored_origin is None else log._ORIGIN_ROWS
    [explained] = account.execute("EXPLAIN (FORMAT JSON) " + statement, {
        "width": 6, "txid": txid, "origin": stored_origin, "seq": 2500, "skipped": False, "keep": 0,
        "limit": 1001}).fetchone()
    nodes = _plan_nodes(explained[0]["Plan"])
    assert ("Index Scan", "capture_pkey") in nodes and "Sort" not in {node for node, _ in nodes}, nodes


def test_pages_are_as_full_as_the_writing_transactions_allow(account, target):
    """Twenty writing transactions of five rows, read ten rows at a time:
    about one statement per ten rows, never a page per writing transaction."""
    for n in range(20):
        account.execute(f"INSERT INTO account SELECT n, 'batch', n FROM generate_series({5 * n}, {5 * n + 4}) AS n")
    end = cut(account, target, "hq").log_end
    counting = _Counting(account)
    assert sum(len(rows) for _, _, rows in iter_capture(counting, 0, end, chunk=10)) == 100
    assert counting.statements <= 1 + 11  # the shapes, 5 rows, then 10 a page


def test_writing_transactions_with_no_row_for_the_reader_are_passed_over(account, target):
    """A subscriber's own writing transactions whose rows it does not get
    back, between others, at every chunk size."""
    account.execute("INSERT INTO account VALUES (1, 'hq', 1)")
    for n in (2, 3):
        with account.transaction():
            set_origin(account, "north1")
            account.execute(f"INSERT INTO account VALUES ({n}, 'from north1', {n})")
    account.execute("INSERT INTO account VALUES (4, 'hq', 4)")
    with account.transaction():
        set_origin(account, "north1")
        account.execute("INSERT INTO account VALUES (5, 'from north1', 5)")
    end = cut(account, target, "hq").log_end
    for chunk in (1, 2, 1000):
        read = list(iter_capture(account, 0, end, chunk=chunk, skip_origin="north1", keep_flag=1))
        assert [(origin, row[4]) for _, origin, rows in read for row in rows] == [("hq", 1), ("hq", 4)], chunk


def test_a_reader_leaves_out_a_subscriber_s_own_log_transactions_but_rows_written_back_to_it(account, target):
    account.execute("INSERT INTO account VALUES (1, 'hq', 1)")
    with account.transaction():
        set_origin(account, "north1")
        account.execute("INSERT INTO account VALUES (2, 'from north1', 2)")
        # What an apply writes back to its origin (flag 1), by hand here.
        account.execute("INSERT INTO fieldsync.capture (shape, kind, flags, v) SELECT shape, 1, 1, v"
                        " FROM fieldsync.capture WHERE v[1] = '2'")
    account.execute("INSERT INTO account VALUES (3, 'hq', 3)")
    end = cut(account, target, "hq").log_end
    assert [origin for _, origin, _ in iter_capture(account, 0, end)] == ["hq", "north1", "hq"]
    skipped = list(iter_capture(account, 0, end, skip_origin="north1"))
    assert [(origin, _values(rows)) for _, origin, rows in skipped] == [("hq", [(1, "hq", 1)]), ("hq", [(3, "hq", 3)])]
    kept = list(iter_capture(account, 0, end, skip_origin="north1", keep_flag=1))
    assert [(origin, [row[3] for row in rows]) for _, origin, rows in kept] == [("hq", [0]), ("north1", [1]),
                                                                                  ("hq", [0])]
    # As wide as asked: cut, or filled with None.
    assert [len(row) for _, _, rows in iter_capture(account, 0, 1, value_columns=2) for row in rows] == [6]
    assert [row[4:] for _, _, rows in iter_capture(account, 0, 1, value_columns=5) for row in rows] == [
        (1, "hq", 1, None, None)]
