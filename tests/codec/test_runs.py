"""Format version 2: operations travel in runs of positional rows
(docs/message-format.md, "Payloads"; codec.ops.Run, codec.payloads._run)."""

from __future__ import annotations

import msgpack
import pytest

from codec.errors import CorruptMessage, InvalidValue
from codec.header import Header
from codec.message import decode_message, encode_data_message
from codec.payloads import read_group
from codec.ops import RUN_ROWS, Operation, Run, Transaction, to_runs, values_identical
from codec.packing import pack_messages

from .helpers import FIELD, HQ, INCARNATION, KEYRING, craft, sample_transactions


def decode(data, **options):
    return decode_message(data, source="test", keyring=KEYRING, recipient="field1", recipient_keys=FIELD, **options)


def test_runs_group_consecutive_operations_of_one_layout_and_stand_for_them():
    ops = [Operation.insert("t", (1,), {"id": 1, "a": "x"}), Operation.insert("t", (2,), {"id": 2, "a": None}),
           Operation.insert("t", (3,), {"a": 1.5, "id": 3}),  # another column order: another run
           Operation.update("t", (3,), {"a": 1.5}, {"a": -0.0}),
           Operation.delete("t", (1,), {"id": 1, "a": "x"}), Operation.delete("u", (1, "k"), {"x": b"\x00"})]
    runs = to_runs(ops)
    assert [(run.table, run.kind, run.key_width, run.before, run.after, len(run.rows)) for run in runs] == [
        ("t", 1, 1, (), ("id", "a"), 2), ("t", 1, 1, (), ("a", "id"), 1), ("t", 2, 1, ("a",), ("a",), 1),
        ("t", 3, 1, ("id", "a"), (), 1), ("u", 3, 2, ("x",), (), 1)]
    assert runs[2].rows == [(3, 1.5, -0.0)]
    assert values_identical(tuple(op for run in runs for op in run.operations()), tuple(ops))


def test_a_run_holds_at_most_run_rows_rows():
    ops = [Operation.insert("t", (i,), {"id": i}) for i in range(2 * RUN_ROWS + 5)]
    assert [len(run.rows) for run in to_runs(ops)] == [RUN_ROWS, RUN_ROWS, 5]


def test_runs_are_taken_as_they_are_unless_two_in_a_row_share_a_head():
    """to_runs of runs alone, a run among operations, and runs that merge:
    the runs of the operations they stand for, each time."""
    from codec.ops import op_count

    ops = [Operation.insert("t", (i,), {"id": i, "a": str(i)}) for i in range(4)]
    ops.insert(2, Operation.delete("t", (9,), {"id": 9, "a": "z"}))
    runs = to_runs(ops)
    assert len(runs) == 3
    taken = to_runs(tuple(runs))
    assert taken == runs and all(a is b for a, b in zip(taken, runs))  # the very runs, never changed
    first = runs[0]
    halves = [first._replace(rows=first.rows[:1]), first._replace(rows=first.rows[1:]), *runs[1:]]
    merged = to_runs(halves)
    assert merged == runs and merged[0] is not halves[0] and halves[0].rows == first.rows[:1]
    assert to_runs([ops[0], *runs[1:], ops[-1]]) == to_runs([ops[0], *ops[2:], ops[-1]])
    assert to_runs([runs[0], ops[2], *ops[3:]]) == runs
    assert op_count(ops) == op_count(runs) == op_count(halves) == op_count([runs[0], *ops[2:]]) == 5
    assert op_count(iter(runs)) == 5 and op_count(()) == 0
    assert op_count([runs[0]]) == len(runs[0].rows) == 2 and op_count((ops[0],)) == 1
    from codec.ops import runs_counted
    for given in (ops, tuple(runs), halves, [ops[0], *runs[1:], ops[-1]], [runs[0], *ops[2:]], ()):
        assert runs_counted(given) == (to_runs(given), op_count(given))
    wide = [*runs, runs[0]._replace(rows=[(i, i, str(i)) for i in range(RUN_ROWS + 1)])]  # too many rows: cut
    assert runs_counted(wide) == (to_runs(wide), RUN_ROWS + 6) and [len(run.rows) for run in to_runs(wide)][-2:] == [RUN_ROWS, 3]


def test_an_operation_no_run_can_carry_is_refused():
    with pytest.raises(InvalidValue, match="cannot travel in a run"):
        to_runs([("t", 1, (1,), {"id": 0}, {"id": 1})])  # an INSERT with a before-image


def test_version_2_is_written_and_decodes_to_the_same_operations_as_version_1():
    transactions = sample_transactions()
    header = Header(0, 100, 200)
    files = {version: encode_data_message(transactions, header, keys=HQ, recipient="field1",
                                          incarnation=INCARNATION, version=version).data for version in (1, 2)}
    assert files[2][4] == 2 and files[1][4] == 1
    assert len(files[2]) < len(files[1]) + 16
    one, two = decode(files[1]), decode(files[2])
    assert (one.version, two.version) == (1, 2)
    assert values_identical(one.transactions, two.transactions)
    assert values_identical(two.transactions, tuple(transactions))
    as_runs = decode(files[2], runs=True).transactions
    assert all(type(op) is Run for transaction in as_runs for op in transaction.ops)
    assert values_identical(tuple(Transaction._trusted(t.commit, t.origin, tuple(op for run in t.ops
                                                                                 for op in run.operations()))
                                  for t in as_runs), tuple(transactions))
    # runs=True has no effect on a version-1 message
    assert values_identical(decode(files[1], runs=True).transactions, one.transactions)


def entry_payload(*runs, commit=5):
    return msgpack.packb([[commit, "hq", list(runs)]], use_bin_type=True)


@pytest.mark.parametrize("run, problem", [
    (["t", 1, 1, [], ["id"]], "malformed run"),                            # five fields
    ([7, 1, 1, [], ["id"], [[1, 1]]], "malformed run"),                    # table not a string
    (["t", 4, 1, [], ["id"], [[1, 1]]], "malformed run"),                  # no such kind
    (["t", True, 1, [], ["id"], [[1, 1]]], "malformed run"),               # a bool is no kind
    (["t", 1, 0, [], ["id"], [[1]]], "malformed run"),                     # no key
    (["t", 1, 1, ["id"], ["id"], [[1, 1, 1]]], "malformed run"),           # an INSERT with before columns
    (["t", 3, 1, ["id"], ["id"], [[1, 1, 1]]], "malformed run"),           # a DELETE with after columns
    (["t", 1, 1, [], ["id"], []], "malformed run"),                        # no rows
    (["t", 1, 1, [], ["id", "id"], [[1, 1, 1]]], "bad column names"),      # a column twice
    (["t", 1, 1, [], ["id", 5], [[1, 1, 1]]], "bad column names"),         # a column name not a string
    (["t", 1, 1, [], ["id", ""], [[1, 1, 1]]], "bad column names"),        # an empty column name
    (["t", 1, 1, [], ["id", "a"], [[1, 1, 1], [2, 2]]], "malformed row"),  # a row too short
    (["t", 1, 1, [], ["id"], [[1, 1], 7]], "malformed row"),               # a row not an array
])
@pytest.mark.parametrize("runs", [False, True])
def test_a_malformed_run_makes_the_message_corrupt(run, problem, runs):
    data = craft(version=2, header=Header(0, 0, 9), payload=entry_payload(run))
    with pytest.raises(CorruptMessage, match=problem):
        decode(data, runs=runs)


@pytest.mark.parametrize("kind, width", [(True, 1), (1, True), (1.0, 1), (1, 1.0)])
@pytest.mark.parametrize("runs", [False, True])
def test_a_head_equal_to_a_checked_one_with_no_int_for_an_int_is_malformed(kind, width, runs):
    """true and 1.0 are equal to 1 (one lookup of checked heads finds
    them): the second run is refused all the same."""
    checked = ["t", 1, 1, [], ["id"], [[1, 1]]]
    data = craft(version=2, header=Header(0, 0, 9),
                 payload=entry_payload(checked, ["t", 2, 1, ["id"], ["id"], [[1, 1, 2]]],
                                       ["t", kind, width, [], ["id"], [[2, 2]]]))
    with pytest.raises(CorruptMessage, match="malformed run"):
        decode(data, runs=runs)


def test_a_wide_key_of_a_checked_head_is_read_again():
    """Ints above 256 are new objects each time: a repeated head with a
    key of 300 columns is read as the first was."""
    names = [f"c{i}" for i in range(300)]
    run = ["t", 3, 300, names, [], [list(range(600))]]
    data = craft(version=2, header=Header(0, 0, 9), payload=entry_payload(run, ["t", 1, 1, [], ["id"], [[1, 1]]],
                                                                            run))
    for runs in (False, True):
        ops = decode(data, runs=runs).transactions[0].ops
        assert len(ops) == 3 and ops[0] == ops[2]


def test_a_version_2_payload_holds_no_maps():
    data = craft(version=2, header=Header(0, 0, 9), payload=entry_payload(["t", 1, 1, [], ["id"], [[1, {"a": 1}]]]))
    with pytest.raises(CorruptMessage, match="not valid msgpack"):
        decode(data)


def big(count):
    return Transaction(5, "hq", tuple(Operation.insert("t", (i,), {"id": i, "pad": f"{i:08d}" * 20})
                                      for i in range(count)))


def test_a_version_2_group_yields_runs_when_asked_and_operations_otherwise():
    transaction = big(25_000)
    messages = list(pack_messages([transaction], keys=HQ, recipient="field1", incarnation=INCARNATION,
                                  resend_count=0, start=0))
    parts = [decode(message.data) for message in messages]
    assert len(parts) > 3 and {part.version for part in parts} == {2}
    runs = list(read_group(iter(parts), runs=True).ops)
    assert all(type(run) is Run and len(run.rows) <= RUN_ROWS for run in runs)
    assert sum(len(run.rows) for run in runs) == 25_000
    ops = tuple(read_group(iter(parts)).ops)
    assert values_identical(ops, transaction.ops)


def test_a_group_of_parts_of_two_versions_is_corrupt():
    transaction = big(12_000)
    by_version = {version: [decode(message.data) for message in pack_messages(
        [transaction], keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=0,
        version=version)] for version in (1, 2)}
    mixed = by_version[2][:1] + by_version[1][1:]
    with pytest.raises(CorruptMessage, match="format version 1, the group's first of 2"):
        list(read_group(iter(mixed)).ops)


def test_runs_handed_to_the_packer_make_the_files_their_operations_make():
    """The sender's reader bundles INSERTs and DELETEs in runs: the files
    are byte for byte those of the operations, a large transaction in
    pieces included (its entries of 10,000 operations cut inside runs)."""
    from codec.ops import PartialTransaction, op_count, split_ops

    small = sample_transactions()
    large = big(23_456)
    ops = list(large.ops)
    bundled = to_runs(ops[:9_999]) + ops[9_999:10_003] + to_runs(ops[10_003:])
    assert op_count(bundled) == len(ops)
    first, rest = split_ops(bundled, 12_345)
    pieces = [PartialTransaction._trusted(500, "hq", tuple(first)),
              Transaction._trusted(500, "hq", tuple(rest))]
    whole = Transaction._trusted(500, "hq", tuple(ops))
    as_runs = [Transaction._trusted(t.commit, t.origin, tuple(to_runs(t.ops))) for t in small]

    def files(transactions):
        return [(m.name, m.data) for m in pack_messages(transactions, keys=HQ, recipient="field1",
                                                        incarnation=INCARNATION, resend_count=0, start=0)]

    assert files([*as_runs, *pieces]) == files([*small, whole])
    assert len(files([whole])) > 3


def test_version_1_is_written_from_runs_too():
    ops = [Operation.insert("t", (i,), {"id": i, "a": f"{i}"}) for i in range(50)]
    bundled = Transaction._trusted(7, "hq", tuple(to_runs(ops)))
    [message] = pack_messages([bundled], keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0,
                              start=0, version=1)
    decoded = decode(message.data)
    assert decoded.version == 1 and values_identical(decoded.transactions[0].ops, tuple(ops))


@pytest.mark.parametrize("count", [1, 2, 7, 8, 9, 30])
def test_a_few_runs_and_many_are_taken_as_they_are_alike(count):
    """Runs are taken as they are, however many, unless one is empty or
    two neighbours share a head."""
    from codec.ops import _rows_taken_as_they_are

    ops = [Operation.insert("t", (i,), {"id": i}) if i % 2 else Operation.delete("t", (i,), {"id": i})
           for i in range(count)]
    runs = to_runs(ops)
    assert len(runs) == count and all(a is b for a, b in zip(to_runs(tuple(runs)), runs))
    assert _rows_taken_as_they_are(runs) == count
    for at in range(count):
        halves = [*runs[:at], runs[at]._replace(rows=[]), *runs[at:]]  # an empty run: not taken
        assert _rows_taken_as_they_are(halves) == 0
        twice = [*runs[:at + 1], runs[at], *runs[at + 1:]]  # two neighbours of one head: merged
        assert _rows_taken_as_they_are(twice) == 0
        assert to_runs(twice) == to_runs([*ops[:at + 1], ops[at], *ops[at + 1:]])
