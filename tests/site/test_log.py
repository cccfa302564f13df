"""The transaction log (agent.site.sqlite.log) where a SQLite site is its own:
chunked reads, the horizon, truncation's rules, a concurrent writer
process.  Scans, commit order, reading bounds and truncation on both
backends are tests/site/both/test_capture_log.py."""

from __future__ import annotations

import multiprocessing
from collections import Counter, defaultdict

import pytest

from agent.site import Article
from agent.site.errors import InvariantViolation
from agent.site.sqlite import log as site_log

from .conftest import CUSTOMER, app_connection, make_site
from .workers import write_transactions


@pytest.fixture
def site(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER)
    site.create_publication("p", [Article("customer")])
    site.add_remote("r1")
    site.subscribe("r1", "p")
    yield site
    site.close()


def insert(app, *ids):
    app.execute("BEGIN")
    for row_id in ids:
        app.execute("INSERT INTO customer (id, name) VALUES (?, ?)", (row_id, f"n{row_id}"))
    app.execute("COMMIT")


def test_reading_a_huge_backlog_is_chunked(site, monkeypatch):
    """The reader fetches bounded chunks: the first transaction comes after
    one small capture query, not after reading the whole backlog."""
    app = app_connection(site)
    app.execute("BEGIN")
    for row_id in range(1, 3001):
        app.execute("INSERT INTO customer (id, name) VALUES (?, 'x')", (row_id,))
        if row_id % 3 == 0:
            app.execute("COMMIT")
            site.scan()
            app.execute("BEGIN")
    app.execute("COMMIT")
    end = site.scan()
    monkeypatch.setattr(site_log, "READ_CHUNK", 50)
    statements: list[str] = []
    site.connection.set_trace_callback(statements.append)
    reader = site.read_log("r1", 0, end)
    first = next(reader)
    capture_queries = [s for s in statements if "FROM fieldsync_capture WHERE seq" in s]
    # One chunk: its INSERT and DELETE rows, and the others (read wider).
    assert len(capture_queries) == 2 and all("seq > 0 AND seq <= 50 " in query for query in capture_queries)
    assert [op.key for op in first.ops] == [(1,), (2,), (3,)]
    rest = list(reader)
    site.connection.set_trace_callback(None)
    assert len(rest) == 999
    capture_queries = [s for s in statements if "FROM fieldsync_capture WHERE seq" in s]
    assert len(capture_queries) == 2 * 3000 // 50  # full chunks only: the reader knows where the log ends
    ops = [op.key[0] for t in [first, *rest] for op in t.ops]
    assert ops == list(range(1, 3001))


def test_insert_and_delete_rows_are_read_with_one_image(site):
    """A reader with no route columns reads an INSERT or DELETE capture row
    with its one image, an UPDATE row with both, in seq order within one log
    transaction, across chunks and over seqs that are missing."""
    app = app_connection(site)
    app.execute("BEGIN")
    for row_id in range(1, 9):
        app.execute("INSERT INTO customer (id, name) VALUES (?, ?)", (row_id, f"n{row_id}"))
        app.execute("UPDATE customer SET name = ? WHERE id = ?", (f"m{row_id}", row_id))
        if row_id % 2:
            app.execute("DELETE FROM customer WHERE id = ?", (row_id,))
    app.execute("COMMIT")
    end = site.scan()
    site.connection.execute("DELETE FROM fieldsync_capture WHERE seq BETWEEN 5 AND 12")  # seqs missing
    conn = site.connection
    width = conn.execute("SELECT count(*) FROM pragma_table_info('fieldsync_capture')").fetchone()[0] - 4
    whole = [row for _, _, rows in site_log.iter_capture(conn, 0, end, value_columns=width) for row in rows]
    read = [row for _, _, rows in site_log.iter_capture(conn, 0, end, chunk=3, value_columns=width,
                                                        image_columns=width // 2) for row in rows]
    assert [row[0] for row in read] == [row[0] for row in whole] and len(read) == 12
    for row, full in zip(read, whole):
        assert row == (full if full[2] == 2 else full[:4 + width // 2])


def test_truncation_follows_log_read_of_a_peer_that_confirmed_all_it_was_sent(site):
    """Rule 8: a peer that confirmed all that was sent to it holds the log
    back only to where it was read for it (what lies between held nothing
    for it); one with unconfirmed data holds it at confirm_sent."""
    app = app_connection(site)
    offsets = []
    for row_id in range(1, 6):
        insert(app, row_id)
        offsets.append(site.scan())
    site.update_remote("r1", log_sent=offsets[1], confirm_sent=offsets[1], log_read=offsets[3])
    assert site.remote("r1").horizon == offsets[3]
    assert site.truncate_log() == offsets[3]
    site.update_remote("r1", log_sent=offsets[4])  # data sent, not yet confirmed
    assert site.remote("r1").horizon == offsets[1]
    assert site.truncate_log() == offsets[3]  # never back; nothing more goes either
    with pytest.raises(InvariantViolation, match="log_read"):
        site.update_remote("r1", log_read=offsets[4] + 1)


def test_truncating_the_whole_log_keeps_the_last_capture_row_as_it_was(site):
    """Every peer confirmed everything: the capture table is emptied whole
    (log._clear_capture) but for its last row, kept value for value, a
    TEXT that is not UTF-8 included; the next change gets the next seq.
    With a capture row the peers have not confirmed, rows go up to the
    bound only."""
    app = app_connection(site)
    insert(app, 1, 2)
    first = site.scan()
    app.execute("INSERT INTO customer (id, name, balance, photo, extra) VALUES (3, CAST(X'FF61' AS TEXT), -0.5,"
                " X'00FF', 7)")
    end = site.scan()
    conn = site.connection
    last = conn.execute("SELECT seq, shape, kind, flags, typeof(v1), hex(v1), v3, hex(v4), v5, v6"
                        " FROM fieldsync_capture ORDER BY seq DESC LIMIT 1").fetchone()
    site.update_remote("r1", log_sent=first, confirm_sent=first)
    assert site.truncate_log() == first
    assert [row[0] for row in conn.execute("SELECT seq FROM fieldsync_capture ORDER BY seq")] == [end]
    insert(app, 4)
    later = site.scan()
    site.update_remote("r1", log_sent=end, confirm_sent=end)
    assert site.truncate_log() == end  # the row of id 4 is not confirmed: a range
    assert [row[0] for row in conn.execute("SELECT seq FROM fieldsync_capture")] == [later]
    site.update_remote("r1", log_sent=later, confirm_sent=later)
    conn.execute("UPDATE fieldsync_capture SET v1 = CAST(X'FF61' AS TEXT), v3 = -0.5, v4 = X'00FF', v5 = 7"
                 " WHERE seq = ?", (later,))
    kept = conn.execute("SELECT seq, shape, kind, flags, typeof(v1), hex(v1), v3, hex(v4), v5, v6"
                        " FROM fieldsync_capture").fetchall()
    assert site.truncate_log() == later  # the whole log
    assert conn.execute("SELECT seq, shape, kind, flags, typeof(v1), hex(v1), v3, hex(v4), v5, v6"
                        " FROM fieldsync_capture").fetchall() == kept
    assert kept[0][4:6] == last[4:6] == ("text", "FF61")
    assert conn.execute("SELECT name FROM sqlite_temp_master").fetchall() == []
    insert(app, 5)
    assert site.scan() == later + 1
    assert [[op.key for op in t.ops] for t in site.read_log("r1", later)] == [[(5,)]]

def test_no_peers_means_no_truncation(tmp_path):
    site = make_site(tmp_path, "solo", "consolidated", CUSTOMER)
    site.create_publication("p", ["customer"])
    insert(app_connection(site), 1)
    site.scan()
    assert site.truncate_log() == 0
    assert site.connection.execute("SELECT count(*) FROM fieldsync_capture").fetchone()[0] == 1
    site.close()


EVENT = "CREATE TABLE event (id INTEGER PRIMARY KEY, txn INTEGER NOT NULL, size INTEGER NOT NULL, pos INTEGER, payload TEXT)"


def test_a_concurrent_writer_process_is_never_split_or_lost(tmp_path):
    """Another process commits multi-row transactions in a loop while this
    one scans as fast as it can: every application transaction lands whole
    in exactly one log transaction, and nothing is lost."""
    site = make_site(tmp_path, "hq", "consolidated", EVENT,
                     "CREATE TABLE counter (id INTEGER PRIMARY KEY, value INTEGER)")
    site.connection.execute("INSERT INTO counter VALUES (1, 0)")
    site.create_publication("p", ["event", "counter"])
    site.add_remote("r1")
    site.subscribe("r1", "p")
    transactions = 400
    writer = multiprocessing.get_context("spawn").Process(
        target=write_transactions, args=(site.path, transactions, 5))
    writer.start()
    scans = 0
    while writer.is_alive():
        site.scan()
        scans += 1
    writer.join()
    assert writer.exitcode == 0
    site.scan()
    log = list(site.read_log("r1", 0))
    assert len(log) > 10, "the scans did not interleave with the writer"
    home: dict[int, set[int]] = defaultdict(set)
    rows_per_txn: Counter = Counter()
    counter_updates = 0
    for entry in log:
        for op in entry.ops:
            if op.table == "event":
                home[op.after["txn"]].add(entry.commit)
                rows_per_txn[op.after["txn"]] += 1
                size = op.after["size"]
                assert rows_per_txn[op.after["txn"]] <= size
            else:
                counter_updates += 1
    assert sorted(home) == list(range(1, transactions + 1))  # nothing lost
    split = {txn: commits for txn, commits in home.items() if len(commits) > 1}
    assert split == {}
    sizes = dict(site.connection.execute("SELECT txn, size FROM event GROUP BY txn").fetchall())
    assert dict(rows_per_txn) == sizes  # every row of every transaction, once
    assert counter_updates == transactions
    site.close()


def test_the_horizon_is_one_rule_in_python_and_in_sql():
    """Rule 8's horizon is computed in Python (a pair's state, a remote's
    row) and in SQL (truncation, metrics): the same for every state."""
    import itertools
    import sqlite3

    from agent.site.sqlite.log import HORIZON_SQL
    from agent.site.remote_rules import horizon

    conn = sqlite3.connect(":memory:")
    # A row that follows the common read position (here 2) reads its log_read as at least there.
    conn.execute("CREATE TABLE fieldsync_site (id INTEGER PRIMARY KEY, common_read INTEGER)")
    conn.execute("INSERT INTO fieldsync_site VALUES (1, 2)")
    conn.execute("CREATE TABLE fieldsync_remote (log_read INTEGER, log_sent INTEGER, confirm_sent INTEGER,"
                 " follows_common INTEGER)")
    states = list(itertools.product(range(4), range(4), range(4), (0, 1)))
    conn.executemany("INSERT INTO fieldsync_remote VALUES (?, ?, ?, ?)", states)
    in_sql = conn.execute(f"SELECT log_read, log_sent, confirm_sent, follows_common, {HORIZON_SQL}"
                          " FROM fieldsync_remote").fetchall()
    assert [row[4] for row in in_sql] == [horizon(max(read, 2) if follows else read, sent, confirmed)
                                          for read, sent, confirmed, follows, _ in in_sql]
    assert {row[4] for row in in_sql} == {0, 1, 2, 3}
