"""Property tests: round trips for arbitrary content, and every damaged file rejected."""

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from codec.errors import MessageError
from codec.header import Header
from codec.message import ControlState, decode_message, encode_control_message, encode_data_message
from codec.ops import INT64_MAX, INT64_MIN, Operation, Transaction, values_identical
from codec.packing import pack_messages

from .helpers import FIELD, HQ, INCARNATION, KEYRING, sample_transactions

values = st.one_of(
    st.none(), st.integers(INT64_MIN, INT64_MAX), st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=50), st.binary(max_size=50),
)
columns = st.text(min_size=1, max_size=12)
images = st.dictionaries(columns, values, min_size=1, max_size=6)
keys = st.lists(values, min_size=1, max_size=3).map(tuple)
tables = st.text(min_size=1, max_size=20)
operations = st.one_of(
    st.builds(Operation.insert, tables, keys, images),
    st.builds(Operation.update, tables, keys, images, images),
    st.builds(Operation.delete, tables, keys, images),
)
sites = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,20}", fullmatch=True)


@st.composite
def transaction_lists(draw):
    gaps = draw(st.lists(st.integers(1, 2**40), max_size=6))
    commit = 0
    result = []
    for gap in gaps:
        commit += gap
        result.append(Transaction(commit, draw(sites), tuple(draw(st.lists(operations, max_size=8)))))
    return result


def decode(data, **options):
    return decode_message(data, source="p.fsm", keyring=KEYRING, recipient="field1", **options)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(transaction_lists(), st.booleans())
def test_round_trip_of_arbitrary_transactions(transactions, sealed):
    last = (transactions[-1].commit if transactions else 0) + 1
    encoded = encode_data_message(transactions, Header(0, 0, last), keys=HQ, recipient="field1",
                                  incarnation=INCARNATION, seal_to=FIELD.public if sealed else None)
    message = decode(encoded.data, recipient_keys=FIELD)
    assert values_identical(message.transactions, tuple(transactions))


def _samples():
    data = encode_data_message(sample_transactions(), Header(0, 100, 200), keys=HQ, recipient="field1",
                               incarnation=INCARNATION).data
    sealed = encode_data_message(sample_transactions(), Header(0, 100, 200), keys=HQ, recipient="field1",
                                 incarnation=INCARNATION, seal_to=FIELD.public).data
    control = encode_control_message(ControlState(5, 1, 7, 0), keys=HQ, recipient="field1",
                                     incarnation=INCARNATION).data
    return {"data": data, "sealed": sealed, "control": control}


SAMPLES = _samples()


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_every_single_bit_flip_is_rejected(kind):
    original = SAMPLES[kind]
    for bit in range(len(original) * 8):
        damaged = bytearray(original)
        damaged[bit // 8] ^= 1 << (bit % 8)
        with pytest.raises(MessageError):
            decode(bytes(damaged), recipient_keys=FIELD)


@pytest.mark.parametrize("kind", sorted(SAMPLES))
def test_every_truncation_is_rejected(kind):
    original = SAMPLES[kind]
    for length in range(len(original)):
        with pytest.raises(MessageError):
            decode(original[:length], recipient_keys=FIELD)


@settings(max_examples=200, deadline=None)
@given(st.sampled_from(sorted(SAMPLES)), st.binary(min_size=1, max_size=300))
def test_appended_garbage_is_rejected(kind, garbage):
    with pytest.raises(MessageError):
        decode(SAMPLES[kind] + garbage, recipient_keys=FIELD)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_damage_to_packed_multi_part_files_is_rejected(data):
    big = Transaction(50, "hq", tuple(Operation.insert("b", (i,), {"id": i, "x": bytes([i % 256]) * 900 + bytes(range(256)) * 4})
                                      for i in range(40)))
    files = list(pack_messages([big], keys=HQ, recipient="field1", incarnation=INCARNATION, resend_count=0,
                               start=0, max_size=10_000))
    target = data.draw(st.sampled_from(files)).data
    mode = data.draw(st.sampled_from(["flip", "truncate", "append", "splice"]))
    if mode == "flip":
        bit = data.draw(st.integers(0, len(target) * 8 - 1))
        damaged = bytearray(target)
        damaged[bit // 8] ^= 1 << (bit % 8)
        damaged = bytes(damaged)
    elif mode == "truncate":
        damaged = target[:data.draw(st.integers(0, len(target) - 1))]
    elif mode == "append":
        damaged = target + data.draw(st.binary(min_size=1, max_size=64))
    else:
        cut = data.draw(st.integers(1, len(target) - 1))
        damaged = target[:cut] + data.draw(st.binary(min_size=1, max_size=64)) + target[cut:]
    with pytest.raises(MessageError):
        decode(damaged)


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=400))
def test_random_bytes_never_escape_the_error_tree(garbage):
    with pytest.raises(MessageError):
        decode(garbage, recipient_keys=FIELD)
    with pytest.raises(MessageError):
        decode(b"FSMF\x01" + garbage, recipient_keys=FIELD)
