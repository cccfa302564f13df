import os
import random
import tracemalloc

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from codec.errors import InvalidValue
from codec.header import Header
from codec.message import decode_message
from codec.payloads import reassemble
from codec.ops import Operation, Transaction, values_identical
from codec.packing import DEFAULT_MAX_SIZE, MIN_MAX_SIZE, MessagePacker, PayloadPacker, pack_messages

from .helpers import FIELD, HQ, INCARNATION, KEYRING, OTHER


def pack(transactions, **options):
    options.setdefault("resend_count", 0)
    options.setdefault("start", 0)
    return list(pack_messages(transactions, keys=HQ, recipient="field1", incarnation=INCARNATION, **options))


def unpack_stream(messages, start, max_size, recipient_keys=None):
    """Check every rule a receiver relies on and return the transactions."""
    result = []
    prev = start
    group = []
    for encoded in messages:
        assert len(encoded.data) <= max_size, f"{encoded.name} is {len(encoded.data)} bytes"
        message = decode_message(encoded.data, source=encoded.name, keyring=KEYRING, recipient="field1",
                                 recipient_keys=recipient_keys)
        header = message.header
        assert header.prev == prev, f"{header} does not follow {prev}"
        if message.is_part:
            assert header.seq == len(group)
            group.append(message)
            if header.is_final_part:
                result.append(reassemble(group))
                group = []
                prev = header.last
            else:
                assert header.last == header.prev
        else:
            assert header.seq == 0 and header.prev < header.last
            result.extend(message.transactions)
            prev = header.last
    assert not group, "stream ends inside a multi-part group"
    return result, prev


def make_transactions(sizes, seed=1, start=0):
    rng = random.Random(seed)
    commit = start
    transactions = []
    for size in sizes:
        commit += rng.randint(1, 50)
        ops = tuple(Operation.insert("t", (i,), {"id": i, "v": rng.random(), "s": "x" * rng.randint(0, 40)})
                    for i in range(size))
        transactions.append(Transaction(commit, "hq", ops))
    return transactions


def test_small_stream_fits_one_message_and_round_trips():
    transactions = make_transactions([3, 1, 7])
    messages = pack(transactions, start=0)
    assert len(messages) == 1
    assert messages[0].header == Header(0, 0, transactions[-1].commit, 0)
    decoded, last = unpack_stream(messages, 0, DEFAULT_MAX_SIZE)
    assert values_identical(decoded, transactions)


def test_large_transaction_is_split_like_the_seed_example():
    # Incompressible blobs force a transaction of ~200 KB over 50,000-byte messages.
    big = Transaction(1_119_170, "hq", tuple(Operation.insert("b", (i,), {"id": i, "data": os.urandom(4000)})
                                             for i in range(50)))
    messages = pack([big], start=942_712)
    headers = [str(m.header) for m in messages]
    assert len(messages) >= 4
    assert headers[0] == "(0-0000942712-0000942712-0)"
    assert headers[1] == "(0-0000942712-0000942712-1)"
    assert headers[-1] == f"(0-0000942712-0001119170-{len(messages) - 1})"
    decoded, last = unpack_stream(messages, 942_712, DEFAULT_MAX_SIZE)
    assert values_identical(decoded, [big]) and last == 1_119_170


def test_a_transaction_that_compresses_into_one_file_but_expands_beyond_the_payload_limit_is_split():
    # 20 MB of repetitive text compresses far below max_size, but a single
    # payload may not expand beyond MAX_PAYLOAD (16 MiB): it must be split.
    filler = "abcdefghij" * 400
    big = Transaction(90, "hq", tuple(Operation.insert("d", (i,), {"id": i, "body": f"{i:08d}{filler}"})
                                      for i in range(5_000)))
    messages = pack([big], start=7, max_size=1_000_000)
    assert len(messages) >= 2 and all(m.header.is_part for m in messages)
    decoded, last = unpack_stream(messages, 7, 1_000_000)
    assert values_identical(decoded, [big]) and last == 90


def test_messages_are_cut_at_commit_boundaries_and_filled():
    transactions = make_transactions([40] * 300)
    messages = pack(transactions)
    decoded, _ = unpack_stream(messages, 0, DEFAULT_MAX_SIZE)
    assert values_identical(decoded, transactions)
    commits = {t.commit for t in transactions}
    assert all(m.header.last in commits for m in messages)
    # Cut points leave little space unused (the last message may be short).
    assert min(len(m.data) for m in messages[:-1]) > 0.8 * DEFAULT_MAX_SIZE


def test_same_input_gives_same_bytes():
    transactions = make_transactions([25] * 100 + [3000], seed=4)
    first = [m.data for m in pack(transactions, start=5, resend_count=3)]
    assert first == [m.data for m in pack(transactions, start=5, resend_count=3)]
    assert first != [m.data for m in pack(transactions, start=5, resend_count=4)]


def test_end_extends_the_final_message_or_makes_an_empty_one():
    transactions = make_transactions([2, 2])
    messages = pack(transactions, end=10_000)
    assert messages[-1].header.last == 10_000
    decoded, last = unpack_stream(messages, 0, DEFAULT_MAX_SIZE)
    assert values_identical(decoded, transactions) and last == 10_000
    empty = pack([], start=50, end=80)
    assert [m.header for m in empty] == [Header(0, 50, 80, 0)]
    assert unpack_stream(empty, 50, DEFAULT_MAX_SIZE) == ([], 80)
    assert pack([], start=50) == [] and pack([], start=50, end=50) == []


def test_sealed_stream_respects_the_limit():
    transactions = make_transactions([60] * 50, seed=9)
    messages = pack(transactions, seal_to=FIELD.public, max_size=MIN_MAX_SIZE)
    decoded, _ = unpack_stream(messages, 0, MIN_MAX_SIZE, recipient_keys=FIELD)
    assert values_identical(decoded, transactions)


@pytest.mark.parametrize("size", [0, MIN_MAX_SIZE - 1, 10**9, 50_000.0])
def test_bad_limits_are_refused(size):
    with pytest.raises(InvalidValue):
        pack([], max_size=size)


def test_out_of_order_commits_are_refused():
    a, b = make_transactions([1, 1])
    with pytest.raises(InvalidValue, match="must increase"):
        pack([b, a])
    with pytest.raises(InvalidValue):
        pack([a], start=a.commit)


@pytest.mark.parametrize("ops", [
    (("t", 1, (1,), {"id": 0}, {"id": 1}),),     # an INSERT with a before-image
    (("t", 2, (1,), {"id": 0}, None),),          # an UPDATE without its after-image
])
def test_an_operation_no_run_can_carry_is_refused_naming_its_transaction(ops):
    with pytest.raises(InvalidValue, match=r"transaction 5 cannot be serialized: operation .* cannot travel in a run"):
        list(pack_messages([Transaction._trusted(5, "hq", ops)], keys=HQ, recipient="field1",
                           incarnation=INCARNATION, resend_count=0, start=0))


def test_memory_stays_bounded_by_the_message_size_whatever_the_backlog():
    consumed = 0

    def backlog():
        nonlocal consumed
        for index in range(1, 60_001):
            consumed += 1
            yield Transaction(index, "hq", (Operation.insert("t", (index,), {"id": index, "v": os.urandom(40)}),))

    tracemalloc.start()
    first_message_consumed = None
    count = 0
    for message in pack_messages(backlog(), keys=HQ, recipient="field1", incarnation=INCARNATION,
                                 resend_count=0, start=0):
        count += 1
        if first_message_consumed is None:
            first_message_consumed = consumed
            per_message = message.header.last
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert consumed == 60_000 and count > 10
    # Streaming: the first message came out long before the input ended ...
    assert first_message_consumed < 3 * per_message + 10
    # ... and the peak stays a few messages' worth, not the backlog's (~5 MB serialized).
    assert peak < 2_000_000, peak


def random_stream(sizes, blob, start, seed):
    """Transactions of ``sizes`` inserts after ``start``, with random blobs
    of up to ``blob`` bytes and text that compresses well."""
    rng = random.Random(seed)
    transactions = []
    commit = start
    for size in sizes:
        commit += rng.randint(1, 10**6)
        ops = tuple(Operation.insert("t", (i,), {"id": i, "r": rng.randbytes(rng.randint(0, blob)),
                                                 "s": "abc" * rng.randint(0, 30)}) for i in range(size))
        transactions.append(Transaction(commit, "hq", ops))
    return transactions


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.one_of(st.integers(0, 30), st.integers(200, 1500)), min_size=0, max_size=25),
       blob=st.integers(0, 3000), max_size=st.sampled_from([MIN_MAX_SIZE, 23_456, DEFAULT_MAX_SIZE]),
       start=st.integers(0, 10**12), seed=st.integers(0, 1000))
def test_packer_rules_hold_for_arbitrary_transaction_sizes(sizes, blob, max_size, start, seed):
    transactions = random_stream(sizes, blob, start, seed)
    messages = pack(transactions, start=start, max_size=max_size, resend_count=seed)
    assert all(m.header.resend_count == seed for m in messages)
    decoded, last = unpack_stream(messages, start, max_size)
    assert values_identical(decoded, transactions)
    assert last == (transactions[-1].commit if transactions else start)


# -- the push form (MessagePacker) ---------------------------------------------------------


def push(transactions, **options):
    """Pack by handing transactions over one at a time; return the files and,
    for each, how many transactions had been handed over when it came out."""
    options.setdefault("resend_count", 0)
    options.setdefault("start", 0)
    packer = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, **options)
    files, handed = [], []
    for count, transaction in enumerate(transactions, 1):
        for message in packer.add(transaction):
            files.append(message)
            handed.append(count)
    files.extend(packer.close())
    return files, handed


@pytest.mark.parametrize("sizes, options", [
    ([3, 1, 7], {}),
    ([40] * 300, {"start": 17, "resend_count": 2}),
    ([25] * 100 + [3000] + [5] * 40, {"max_size": MIN_MAX_SIZE}),
    ([2, 2], {"end": 10_000}),
    ([], {"start": 50, "end": 80}),
    ([], {"start": 50}),
    ([60] * 50, {"seal_to": FIELD.public, "max_size": MIN_MAX_SIZE}),
])
def test_pushing_makes_the_files_pulling_makes(sizes, options):
    transactions = make_transactions(sizes, seed=len(sizes), start=options.get("start", 0))
    pushed, _ = push(transactions, **options)
    pulled = pack(transactions, **options)
    assert [(m.name, m.data) for m in pushed] == [(m.name, m.data) for m in pulled]


def test_pushing_a_split_transaction_makes_the_same_parts():
    big = Transaction(1_119_170, "hq", tuple(Operation.insert("b", (i,), {"id": i, "data": os.urandom(4000)})
                                             for i in range(50)))
    small = make_transactions([5, 5], seed=2, start=big.commit)
    pushed, _ = push([big, *small], start=942_712)
    assert [m.data for m in pushed] == [m.data for m in pack([big, *small], start=942_712)]
    assert sum(m.header.is_part for m in pushed) >= 4


def test_a_pushed_message_comes_out_as_soon_as_it_is_complete():
    transactions = make_transactions([40] * 300)
    pushed, handed = push(transactions, max_size=MIN_MAX_SIZE)
    assert len(pushed) > 10
    # Each message but the last came out while the stream was still being
    # handed over, at most about one message's worth of look-ahead after its
    # own last transaction: the packer holds one message and its look-ahead.
    commits = [t.commit for t in transactions]
    ends = [commits.index(message.header.last) + 1 for message in pushed]
    per_message = max(b - a for a, b in zip([0, *ends], ends))
    for end, count in zip(ends[:-1], handed):
        assert end <= count < len(transactions)
        assert count - end < 2 * per_message


def test_a_packer_that_failed_or_closed_refuses_more():
    a, b = make_transactions([1, 1])
    packer = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=0)
    packer.add(b)
    with pytest.raises(InvalidValue, match="must increase"):
        packer.add(a)
    with pytest.raises(InvalidValue, match="closed or failed"):
        packer.close()
    closed = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=0, end=9)
    assert [m.header for m in closed.close()] == [Header(0, 0, 9, 0)]
    with pytest.raises(InvalidValue, match="closed or failed"):
        closed.add(a)
    with pytest.raises(InvalidValue, match="a transaction is required"):
        MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=0).add(None)


def test_a_packer_that_cannot_seal_fails_at_its_first_message():
    # A sealing key of another site: the frame refuses it, as pack_messages does.
    packer = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=0,
                           seal_to=OTHER.public)
    transactions = make_transactions([40] * 300)
    with pytest.raises(InvalidValue, match="sealing key is for field2"):
        for transaction in transactions:
            packer.add(transaction)
    with pytest.raises(InvalidValue, match="sealing key is for field2"):
        pack(transactions, seal_to=OTHER.public)


@pytest.mark.parametrize("options", [{"start": -1}, {"max_size": 100}])
def test_bad_packer_settings_are_refused_at_once(options):
    options = {"resend_count": 0, "start": 0, **options}
    with pytest.raises(InvalidValue):
        MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, **options)
    with pytest.raises(InvalidValue):
        MessagePacker(keys=HQ, recipient="not a site", incarnation=INCARNATION, resend_count=0, start=0)


def test_a_transaction_pushed_alone_over_the_limit_is_split_at_once():
    big = Transaction(500, "hq", tuple(Operation.insert("b", (i,), {"id": i, "data": os.urandom(4000)})
                                       for i in range(50)))
    packer = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=7)
    parts = packer.add(big)
    # Every part but the last is out before anything follows it; the last
    # waits, since the stream's end may still raise its ``last``.
    assert len(parts) >= 3 and all(m.header.is_part and not m.header.is_final_part for m in parts)
    rest = packer.close()
    assert [m.header.is_final_part for m in rest] == [True]
    assert [m.data for m in parts + rest] == [m.data for m in pack([big], start=7)]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.one_of(st.integers(0, 30), st.integers(200, 1500)), min_size=0, max_size=25),
       blob=st.integers(0, 3000), max_size=st.sampled_from([MIN_MAX_SIZE, 23_456, DEFAULT_MAX_SIZE]),
       start=st.integers(0, 10**12), seed=st.integers(0, 1000), beyond=st.integers(0, 5))
def test_pushing_and_pulling_make_the_same_files_for_arbitrary_streams(sizes, blob, max_size, start, seed,
                                                                      beyond):
    transactions = random_stream(sizes, blob, start, seed)
    end = (transactions[-1].commit if transactions else start) + beyond
    options = {"start": start, "max_size": max_size, "resend_count": seed, "end": end}
    pushed, _ = push(transactions, **options)
    assert [m.data for m in pushed] == [m.data for m in pack(transactions, **options)]


# -- payloads without the key (PayloadPacker, Payload.frame) -----------------------------


@pytest.mark.parametrize("sizes, options", [
    ([40] * 300, {"start": 17, "resend_count": 2}),
    ([25] * 100 + [3000] + [5] * 40, {"max_size": MIN_MAX_SIZE}),
    ([], {"start": 50, "end": 80}),
    ([60] * 50, {"seal_to": FIELD.public, "max_size": MIN_MAX_SIZE}),
])
def test_payloads_framed_with_the_key_are_the_files_pulling_makes(sizes, options):
    transactions = make_transactions(sizes, start=options.get("start", 0))
    expected = pack(transactions, **options)
    seal_to = options.pop("seal_to", None)
    options.setdefault("resend_count", 0)
    options.setdefault("start", 0)
    packer = PayloadPacker(sender=HQ.site, recipient="field1", sealed=seal_to is not None, **options)
    payloads = [payload for transaction in transactions for payload in packer.add(transaction)] + packer.close()
    framed = [payload.frame(keys=HQ, recipient="field1", incarnation=INCARNATION, seal_to=seal_to)
              for payload in payloads]
    assert [(message.name, message.data) for message in framed] == \
        [(message.name, message.data) for message in expected]
    assert all(HQ.secret_seed() not in payload.compressed for payload in payloads)


# --- large transactions ---------------------------------------------------------------


def large_ops(count, seed=5):
    rng = random.Random(seed)
    return [Operation.insert("t", (i,), {"id": i, "name": f"row {rng.randrange(10**6)}", "n": rng.random()})
            for i in range(1, count + 1)]


def pieces(commit, ops, size):
    """The transaction ``commit`` handed over in pieces of ``size`` operations."""
    from codec.ops import PartialTransaction

    chunks = [ops[start:start + size] for start in range(0, len(ops), size)]
    return [(PartialTransaction if index < len(chunks) - 1 else Transaction)._trusted(commit, "hq", tuple(chunk))
            for index, chunk in enumerate(chunks)]


def test_a_large_transaction_in_pieces_makes_the_files_it_makes_whole():
    """Pieces of any size, or none: the same operations make the same
    files, an entry per LARGE_TRANSACTION_OPS operations, in parts that
    join back into the transaction."""
    from codec.message import LARGE_TRANSACTION_OPS

    ops = large_ops(2 * LARGE_TRANSACTION_OPS + 123)
    small = Transaction(2, "hq", (Operation.insert("t", (0,), {"id": 0}),))
    after = Transaction(9, "hq", (Operation.insert("t", (-1,), {"id": -1}),))
    whole = pack([small, Transaction(5, "hq", tuple(ops)), after], end=12)
    for size in (999, 4096, LARGE_TRANSACTION_OPS + 1):
        assert pack([small, *pieces(5, ops, size), after], end=12) == whole
    pushed = MessagePacker(keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0, start=0, end=12)
    made = [message for piece in [small, *pieces(5, ops, 777), after] for message in pushed.add(piece)]
    assert made + pushed.close() == whole
    result, last = unpack_stream(whole, 0, DEFAULT_MAX_SIZE)
    assert [t.commit for t in result] == [2, 5, 9] and last == 12
    assert values_identical(result[1].ops, tuple(ops))


def test_a_group_is_read_part_by_part():
    """read_group decodes a part only when the operations before it are used."""
    from codec.payloads import read_group

    ops = large_ops(30_000)
    messages = pack([Transaction(5, "hq", tuple(ops))])
    decoded = [decode_message(m.data, source=m.name, keyring=KEYRING, recipient="field1") for m in messages]
    taken = []

    def parts():
        for message in decoded:
            taken.append(message.header.seq)
            yield message

    transaction = read_group(parts())
    assert (transaction.commit, transaction.origin) == (5, "hq") and taken == [0]
    first = next(transaction.ops)
    assert first == tuple(ops[0]) and len(taken) < 3
    assert values_identical((first, *transaction.ops), tuple(ops)) and len(taken) == len(decoded)


def test_pieces_that_stop_before_their_last_are_refused():
    ops = large_ops(50)
    with pytest.raises(InvalidValue, match="handed over in pieces"):
        pack(pieces(5, ops, 20)[:-1])
    with pytest.raises(InvalidValue, match="handed over in pieces"):
        pack([*pieces(5, ops, 20)[:-1], Transaction(6, "hq", ops[:1])])
