import pytest
from hypothesis import given, strategies as st

from codec.errors import InvalidValue
from codec.header import COUNT_MAX, Header
from codec.ops import OFFSET_MAX


def test_text_form_matches_dbremote():
    assert str(Header(0, 942712, 1119170, 3)) == "(0-0000942712-0001119170-3)"
    assert str(Header(1, 942712, 1119170, 0)) == "(1-0000942712-0001119170-0)"


def test_wide_offsets_print_wider_never_truncated():
    header = Header(0, 12_345_678_901, 98_765_432_109_876, 0)
    assert str(header) == "(0-12345678901-98765432109876-0)"
    assert Header.parse(str(header)) == header


@pytest.mark.parametrize("text", [
    "(0-0000923200-0000923357-0)",
    "(0-0000942712-0000942712-0)",
    "(0-0000942712-0000942712-2)",
    "(0-0000942712-0001119170-3)",
    "(1-0000942712-0001119170-0)",
])
def test_seed_examples_round_trip(text):
    assert str(Header.parse(text)) == text


@given(st.integers(0, COUNT_MAX), st.integers(0, OFFSET_MAX), st.integers(0, OFFSET_MAX), st.integers(0, COUNT_MAX))
def test_parse_format_round_trip(resend_count, a, b, seq):
    header = Header(resend_count, min(a, b), max(a, b), seq)
    assert Header.parse(str(header)) == header


@pytest.mark.parametrize("args", [(0, 5, 4, 0), (-1, 0, 0, 0), (0, -1, 0, 0), (0, 0, 0, -1),
                                  (0, 0, OFFSET_MAX + 1, 0), (COUNT_MAX + 1, 0, 1, 0), (0, 0, 1.5, 0),
                                  (True, 0, 1, 0)])
def test_invalid_headers_are_refused(args):
    with pytest.raises(InvalidValue):
        Header(*args)


@pytest.mark.parametrize("text", ["", "(0-1-2-3)", "0-0000942712-0001119170-3", "(00-0000942712-0001119170-3)",
                                  "(0-00000942712-0001119170-3)", "(0-0001119170-0000942712-0)",
                                  "(0-0000942712-0001119170-03)", "(0-0000942712-0001119170-3) "])
def test_malformed_text_is_refused(text):
    with pytest.raises(InvalidValue):
        Header.parse(text)


def test_part_classification_follows_the_seed():
    parts = [Header.parse(t) for t in ("(0-0000942712-0000942712-0)", "(0-0000942712-0000942712-1)",
                                       "(0-0000942712-0000942712-2)", "(0-0000942712-0001119170-3)")]
    assert all(p.is_part for p in parts)
    assert [p.is_final_part for p in parts] == [False, False, False, True]
    single = Header.parse("(0-0000923200-0000923357-0)")
    assert not single.is_part and single.is_final_part


def test_headers_order_like_the_stream():
    texts = ["(0-0000942712-0001119170-3)", "(0-0000942712-0000942712-0)", "(0-0000923357-0000942712-0)",
             "(0-0000942712-0000942712-2)", "(0-0000942712-0000942712-1)"]
    ordered = sorted(Header.parse(t) for t in texts)
    assert [str(h) for h in ordered] == ["(0-0000923357-0000942712-0)", "(0-0000942712-0000942712-0)",
                                         "(0-0000942712-0000942712-1)", "(0-0000942712-0000942712-2)",
                                         "(0-0000942712-0001119170-3)"]
