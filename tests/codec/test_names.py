import random

import pytest
from hypothesis import given, strategies as st

from codec.errors import BadFileName, InvalidValue
from codec.header import COUNT_MAX, Header
from codec.names import NAME_MAX_BYTES, Kind, MessageName, check_site_name
from codec.ops import OFFSET_MAX

sites = st.from_regex(r"[A-Za-z0-9][A-Za-z0-9_-]{0,47}", fullmatch=True)


@given(sites, sites, st.integers(0, COUNT_MAX), st.integers(0, OFFSET_MAX), st.integers(0, OFFSET_MAX),
       st.integers(0, COUNT_MAX))
def test_round_trip(sender, recipient, rc, a, b, seq):
    name = MessageName(sender, recipient, Kind.DATA, Header(rc, min(a, b), max(a, b), seq))
    text = str(name)
    assert MessageName.parse(text) == name
    assert len(text.encode()) <= NAME_MAX_BYTES


def test_control_names_carry_a_digest():
    name = MessageName("hq", "field1", Kind.CONTROL, Header(2, 0, 77, 0), "0123456789abcdef")
    assert str(name) == "hq.field1.c.0000000002-0000000000000000000-0000000000000000077-0000000000.0123456789abcdef.fsm"
    assert MessageName.parse(str(name)) == name
    with pytest.raises(InvalidValue):
        MessageName("hq", "field1", Kind.CONTROL, Header(0, 0, 1, 0))
    with pytest.raises(InvalidValue):
        MessageName("hq", "field1", Kind.DATA, Header(0, 0, 1, 0), "0123456789abcdef")


def test_sorted_listing_orders_one_senders_stream():
    # A stream with epochs and offsets of very different widths, and a multi-part group.
    headers = [Header(0, 0, 9, 0), Header(0, 9, 9_999_999_999, 0), Header(0, 9_999_999_999, 10**12, 0),
               Header(0, 10**12, 10**12, 0)] + [Header(0, 10**12, 10**12, s) for s in range(1, 12)] + [
        Header(0, 10**12, 10**15, 12), Header(1, 10**15, 10**15 + 5, 0), Header(2, 5, 6, 0), Header(10, 1, 2, 0)]
    names = [str(MessageName("hq", "f1", Kind.DATA, h)) for h in headers]
    shuffled = names[:]
    random.Random(3).shuffle(shuffled)
    assert sorted(shuffled) == names
    assert [MessageName.parse(n).header for n in sorted(shuffled)] == sorted(headers)


@pytest.mark.parametrize("name", [
    "", "hq", "../hq.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq/x.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq.f1/../x.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm/",
    "hq\\x.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm\n",
    "h\x00q.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq.f1.x.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq.f1.d.0000000000-0000000000000000002-0000000000000000001-0000000000.fsm",  # prev > last
    "hq.f1.d.0000000000-9999999999999999999-9999999999999999999-0000000000.fsm",  # over 2**63-1
    "hq.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.txt",
    "..",
    "hq.f1.c.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",  # control without digest
    "x" * 60 + ".f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "é" * 150,
    "ｈq.f1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
])
def test_bad_names_are_refused_with_a_typed_error(name):
    with pytest.raises(BadFileName) as raised:
        MessageName.parse(name)
    assert str(raised.value)


def test_non_text_name_is_refused():
    with pytest.raises(BadFileName):
        MessageName.parse(b"hq")  # type: ignore[arg-type]


@pytest.mark.parametrize("site", ["", "-hq", "h.q", "h/q", "a" * 49, "hé", "h q", None])
def test_bad_site_names(site):
    with pytest.raises(InvalidValue):
        check_site_name(site)
