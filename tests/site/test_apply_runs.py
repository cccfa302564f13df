"""Applying a version-2 message's runs (agent.site.sqlite.apply.driver._apply_run):
their rows are bound as decoded, and anything unusual takes the general
path with the operations they stand for."""

from __future__ import annotations

import sqlite3

from codec.ops import Operation, Run, Transaction, to_runs

from .applying import hq, remote  # noqa: F401  (fixtures)
from .conftest import table_rows


def runs_of(commit, *ops, origin="r1"):
    runs = tuple(run._replace(rows=tuple(run.rows)) for run in to_runs(ops))
    return Transaction._trusted(commit, origin, runs)


def traced(monkeypatch):
    """The statements the run path builds (so the test sees it was taken)."""
    from agent.site.sqlite.apply.statements import Statements

    statements = []
    build = Statements.run_sql

    def spy(self, table, run, consolidated):
        statements.append(build(self, table, run, consolidated))
        return statements[-1]

    monkeypatch.setattr(Statements, "run_sql", spy)
    return statements


def test_rows_of_a_run_are_bound_as_they_come(hq, monkeypatch):
    statements = traced(monkeypatch)
    inserts = [Operation.insert("line", (i, 7), {"order_id": 7, "line_no": i, "sku": f"s{i}"}) for i in range(1, 301)]
    result = hq.apply("r1", [runs_of(3, *inserts)], log_received=3)
    assert (result.operations_applied, result.errors) == (300, 0)
    updates = [Operation.update("line", (i, 7), {"sku": f"s{i}"}, {"sku": f"t{i}"}) for i in range(1, 301)]
    deletes = [Operation.delete("line", (i, 7), {"order_id": 7, "line_no": i, "sku": f"t{i}"}) for i in range(1, 101)]
    result = hq.apply("r1", [runs_of(4, *updates), runs_of(5, *deletes)], log_received=5)
    assert (result.operations_applied, result.errors, result.conflicts) == (400, 0, 0)
    assert statements == [
        'INSERT OR IGNORE INTO "line" ("order_id", "line_no", "sku") VALUES (?3, ?4, ?5)',
        'UPDATE OR IGNORE "line" SET "sku" = ?4 WHERE "line_no" IS ?1 AND "order_id" IS ?2 AND "sku" IS ?3',
        'DELETE FROM "line" WHERE "line_no" IS ? AND "order_id" IS ?']
    rows = table_rows(hq, "line")
    assert len(rows) == 200 and (7, 101, "t101", None) in rows


def test_a_remote_binds_an_update_row_without_its_before_values(remote, monkeypatch):
    remote.apply("hq", [runs_of(3, *(Operation.insert("customer", (i,), {"id": i, "name": "a"})
                                      for i in range(1, 11)), origin="hq")], log_received=3)
    statements = traced(monkeypatch)
    ops = [Operation.update("customer", (i,), {"name": "stale"}, {"name": "b"}) for i in range(1, 11)]
    result = remote.apply("hq", [runs_of(4, *ops, origin="hq")], log_received=4)
    assert (result.operations_applied, result.errors) == (10, 0)
    assert statements == ['UPDATE OR IGNORE "customer" SET "name" = ?3 WHERE "id" IS ?1']
    assert {row[1] for row in table_rows(remote, "customer")} == {"b"}


def test_a_bad_value_in_a_run_is_recorded_and_the_rest_applied(hq):
    ops = [Operation.insert("customer", (i,), {"id": i, "name": f"n{i}"}) for i in range(1, 6)]
    [run] = to_runs(ops)
    rows = list(map(tuple, run.rows))
    rows[2] = (3, 3, True)            # bool is no SQLite value
    rows[3] = (4, 4, ("nested",))     # nor is an array
    result = hq.apply("r1", [Transaction._trusted(3, "r1", (run._replace(rows=tuple(rows)),))], log_received=3)
    assert (result.operations_applied, result.errors) == (3, 2)
    assert [row[0] for row in table_rows(hq, "customer")] == [1, 2, 5]
    assert [(error.key, error.problem.split(":")[0]) for error in hq.apply_errors()] == [
        ((3,), "malformed operation"), ((4,), "malformed operation")]


def test_a_run_the_table_cannot_take_records_each_operation(hq):
    unknown = Run("customer", 1, 1, (), ("id", "colour"), ((1, 1, "red"), (2, 2, "blue")))
    nowhere = Run("nowhere", 3, 1, ("id",), (), ((1, 1),))
    wide = Run("customer", 2, 2, ("name",), ("name",), ((1, 9, "a", "b"),))
    result = hq.apply("r1", [Transaction._trusted(3, "r1", (unknown, nowhere, wide))], log_received=3)
    assert (result.operations_applied, result.errors) == (0, 4)
    problems = [error.problem for error in hq.apply_errors()]
    assert problems[:2] == ["customer has no column 'colour' at this site"] * 2
    assert problems[2] == "no table 'nowhere' with a primary key at this site"
    assert problems[3].startswith("key has 2 values but customer has 1 key columns")


def test_a_failing_chunk_of_a_run_is_replayed_one_by_one(hq):
    hq.connection.execute("INSERT INTO customer (id, name) VALUES (150, 'already here')")
    ops = [Operation.insert("customer", (i,), {"id": i, "name": f"n{i}"}) for i in range(1, 301)]
    result = hq.apply("r1", [runs_of(3, *ops)], log_received=3)
    assert (result.operations_applied, result.errors) == (299, 1)
    assert hq.apply_errors()[0].operation == ("customer", 1, (150,), None, {"id": 150, "name": "n150"})
    assert table_rows(hq, "customer", "WHERE id = 150")[0][1] == "already here"


def test_inserts_go_many_rows_a_statement_and_the_rest_one_by_one(hq):
    """The fast path writes an INSERT run's rows many at a time in one
    statement (driver._insert_rows; as many as SQLite binds), the rest one
    by one, with the same result."""
    statements = []
    hq.connection.set_trace_callback(statements.append)
    hq.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 31)  # 10 rows of key, id and name
    ops = [Operation.insert("customer", (i,), {"id": i, "name": f"n{i}"}) for i in range(1, 26)]
    plain = [Operation.insert("customer", (i,), {"id": i, "name": f"p{i}"}) for i in range(26, 42)]
    result = hq.apply("r1", [runs_of(3, *ops), Transaction(4, "r1", tuple(plain))], log_received=4)
    hq.connection.set_trace_callback(None)
    assert (result.operations_applied, result.errors) == (41, 0)
    many = {s for s in statements if s.startswith('INSERT OR IGNORE INTO "customer"') and "), (" in s}
    assert len(many) == 3  # two of the run's 10 rows, one of the operations' (15 rows of 2 values)
    assert [row[:2] for row in table_rows(hq, "customer")] == [(i, f"n{i}") for i in range(1, 26)] + [
        (i, f"p{i}") for i in range(26, 42)]


def test_rows_of_a_run_made_by_hand_not_all_of_its_width_are_never_bound_together(hq):
    """A short row and a long one hold as many values as two good rows: in
    one statement of many rows they would shift values from row to row
    (here into rows 2 and 30).  They go one by one, as the operations they
    stand for."""
    rows = [(i, i, 10 * i) for i in range(1, 11)]
    rows[1], rows[2] = (2, 2), (3, 3, 30, 99)
    run = Run("customer", 1, 1, (), ("id", "extra"), tuple(rows))
    hq.connection.setlimit(sqlite3.SQLITE_LIMIT_VARIABLE_NUMBER, 31)  # 10 rows of 3 values a statement
    hq.apply("r1", [Transaction._trusted(3, "r1", (run,))], log_received=3)
    assert [(row[0], row[-1]) for row in table_rows(hq, "customer")] == [
        (1, 10), (2, None), *((i, 10 * i) for i in range(3, 11))]
