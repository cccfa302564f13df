"""The quick reading of a version-2 payload (codec.payloads.version2_runs:
msgspec against Run's annotations, then the checks no type can say) is
taken for the payloads the packer writes, and never accepts what the
careful reading (codec.payloads.careful_transactions) refuses or reads
otherwise."""

from __future__ import annotations

import random

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from codec.errors import CorruptMessage
from codec.header import Header
from codec.ops import Operation, Run, to_runs
from codec.payloads import SEEN_COLUMN_LISTS, careful_transactions, transactions_of, version2_runs

HEADER = Header(0, 0, 10_000)


def payload(*entries) -> bytes:
    return msgpack.packb(list(entries), use_bin_type=True)


def careful(data: bytes, runs: bool = True):
    try:
        return careful_transactions(data, HEADER, "test", 2, runs)
    except CorruptMessage:
        return None


def assert_no_more_lenient(data: bytes) -> None:
    """What the quick reading accepts, the careful one reads alike; and a
    reader of operations (whose quick reading leaves what runs hold to the
    operations it makes) gets what the careful reading gives, or its error."""
    try:
        as_operations = transactions_of(data, HEADER, "test", 2, False)
    except CorruptMessage:
        as_operations = None
    careful_operations = careful(data, runs=False)
    assert (None if as_operations is None else [(t.commit, t.origin, t.ops) for t in as_operations]) == (
        None if careful_operations is None else [(t.commit, t.origin, t.ops) for t in careful_operations])
    quick = version2_runs(data, HEADER)
    if quick is None:
        return
    read = careful(data)
    assert read is not None, "the quick reading accepted a payload the careful one refuses"
    assert [(t.commit, t.origin, t.ops) for t in read] == [(c, o, r) for c, o, r in quick]
    assert all(type(run) is Run for _, _, runs in quick for run in runs)


values = st.one_of(st.none(), st.integers(-2**63, 2**63 - 1), st.floats(allow_nan=False), st.text(max_size=8))
names = st.text(alphabet="abcdé", min_size=1, max_size=3)


@st.composite
def operations(draw):
    table = draw(st.sampled_from(["t", "u"]))
    columns = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    row = {column: draw(values) for column in columns}
    key = (draw(st.integers(0, 5)),)
    kind = draw(st.sampled_from(["insert", "update", "delete"]))
    if kind == "insert":
        return Operation.insert(table, key, row)
    if kind == "delete":
        return Operation.delete(table, key, row)
    return Operation.update(table, key, row, {column: draw(values) for column in columns[:2]})


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(operations(), max_size=12), min_size=1, max_size=5), st.booleans())
def test_what_the_packer_writes_is_read_the_quick_way_as_the_careful_way_reads_it(transactions, runs):
    data = payload(*[(10 * (i + 1), "hq", to_runs(ops)) for i, ops in enumerate(transactions)])
    assert version2_runs(data, HEADER) is not None, "a payload of scalars is read the quick way"
    quick = transactions_of(data, HEADER, "test", 2, runs)
    assert [(t.commit, t.origin, t.ops) for t in quick] == [
        (t.commit, t.origin, t.ops) for t in careful_transactions(data, HEADER, "test", 2, runs)]
    if not runs:
        assert [t.ops for t in quick] == [tuple(ops) for ops in transactions]


def test_a_payload_with_a_blob_or_an_array_for_a_value_is_read_the_careful_way():
    for value in (b"\x00\xff", (1, 2)):
        data = payload((5, "hq", [("t", 1, 1, (), ("id", "v"), [(1, 1, value)])]))
        assert version2_runs(data, HEADER) is None
        (transaction,) = transactions_of(data, HEADER, "test", 2, True)
        assert transaction.ops == (Run("t", 1, 1, (), ("id", "v"), ((1, 1, value),)),)


GOOD_RUN = ["t", 2, 1, ["a"], ["a", "b"], [[1, 2, 3, 4]]]


@pytest.mark.parametrize("field, bad", [
    (0, ""), (0, 5), (1, 0), (1, 4), (1, True), (1, 2.0), (2, 0), (2, True), (2, -1),
    (3, ["a", "a"]), (3, [""]), (3, [5]), (4, ["b", "b"]), (4, "ab"), (5, []), (5, [[1, 2, 3]]),
    (5, [[1, 2, 3, 4, 5]]), (5, [[1, 2, 3, 4], [1, 2, 3, 4, 5]]), (5, [7]), (5, [[1, 2, 3, {"m": 1}]]),
])
def test_a_malformed_run_is_left_to_the_careful_reading_which_refuses_it(field, bad):
    run = list(GOOD_RUN)
    run[field] = bad
    data = payload((5, "hq", [GOOD_RUN, run]))
    assert version2_runs(data, HEADER) is None
    assert careful(data) is None
    assert_no_more_lenient(data)


@pytest.mark.parametrize("entries", [
    [(5, "hq", [GOOD_RUN]), (5, "hq", [GOOD_RUN])],           # commits out of order
    [(0, "hq", [GOOD_RUN])], [(10_001, "hq", [GOOD_RUN])],      # outside (prev, last]
    [(5, "", [GOOD_RUN])], [(5, 7, [GOOD_RUN])], [(True, "hq", [])],
    [(5, "hq", [GOOD_RUN], 3)], [(5, "hq")],                    # an applied offset is version 4's
    [(5, "hq", [["t", 1, 1, ["a"], ["b"], [[1, 2, 3]]]])],      # an INSERT with before columns
    [(5, "hq", [["t", 3, 1, ["a"], ["b"], [[1, 2, 3]]]])],      # a DELETE with after columns
])
def test_a_malformed_transaction_is_left_to_the_careful_reading_which_refuses_it(entries):
    data = payload(*entries)
    assert version2_runs(data, HEADER) is None
    assert careful(data) is None


def test_no_mutation_of_a_payload_is_accepted_the_quick_way_and_refused_or_read_otherwise():
    rng = random.Random(2)
    ops = [Operation.insert("customer", (i,), {"id": i, "name": f"n{i}", "score": i * 1.5}) for i in range(30)]
    ops += [Operation.update("customer", (i,), {"score": 1.0}, {"score": None}) for i in range(10)]
    ops += [Operation.delete("orders", (i, "x"), {"id": i, "line": "x"}) for i in range(5)]
    good = payload((7, "hq", to_runs(ops[:20])), (9, "hq", to_runs(ops[20:])))
    accepted = 0
    for _ in range(3000):
        data = bytearray(good)
        for _ in range(rng.randint(1, 3)):
            choice = rng.random()
            position = rng.randrange(len(data))
            if choice < 0.6:
                data[position] = rng.randrange(256)
            elif choice < 0.8:
                del data[position]
            else:
                data.insert(position, rng.randrange(256))
        data = bytes(data)
        accepted += version2_runs(data, HEADER) is not None
        assert_no_more_lenient(data)
    assert accepted > 100, "mutated values are still read the quick way"


@pytest.mark.parametrize("kind, side", [(1, 4), (2, 3), (2, 4), (3, 3)])
def test_column_lists_beyond_those_remembered_are_each_checked_whenever_they_come(kind, side):
    """version2_runs remembers SEEN_COLUMN_LISTS checked column lists for
    each kind's before (field 3) and after (field 4) lists; in a payload of
    more distinct lists than that, every run's lists are still checked:
    good ones read, and a list with a name twice is refused after the
    remembered ones are full, however many came before."""
    other = [] if kind != 2 else ["v"]  # an INSERT has no before columns, a DELETE no after columns

    def run(columns: list[str]) -> list:
        lists = [columns, other] if side == 3 else [other, columns]
        return ["t", kind, 1, *lists, [[1, *range(len(columns) + len(other))]]]

    distinct = [run([f"c{number}", "x"]) for number in range(SEEN_COLUMN_LISTS + 4)]
    good = payload((5, "hq", distinct + distinct))
    assert version2_runs(good, HEADER) is not None
    assert_no_more_lenient(good)
    twice = run(["y", "y"])
    for bad in (payload((5, "hq", [*distinct, twice])), payload((5, "hq", [*distinct, *distinct, twice]))):
        assert version2_runs(bad, HEADER) is None
        assert careful(bad) is None
