"""Validation and storage encoding of values (agent.site.values)."""

from __future__ import annotations

import math

import pytest

from agent.site.values import as_operation, operation_problem, pack, unpack, value_problem
from codec.ops import Operation, values_identical


@pytest.mark.parametrize("value", [None, 0, -(2**63), 2**63 - 1, 0.0, -0.0, math.nan, math.inf, "", "x", b"", b"\0"])
def test_sqlite_values_pass_and_survive_packing(value):
    assert value_problem(value) is None
    assert values_identical(unpack(pack(value)), value)


@pytest.mark.parametrize("value, problem", [
    (2**63, "outside SQLite's 64-bit range"),
    (-(2**63) - 1, "outside"),
    (True, "bool is not a SQLite value"),
    ([1], "list is not"),
    ({"a": 1}, "dict is not"),
])
def test_other_values_are_named(value, problem):
    assert problem in value_problem(value)


@pytest.mark.parametrize("op, problem", [
    (("t", 1, (1,), None, {"id": 1}), None),
    (("t", 2, (1,), {"a": 1}, {"a": 2}), None),
    (("t", 3, (1,), {"id": 1}, None), None),
    (("t", 1, (1,)), "5-tuple"),
    (["t", 1, (1,), None, {}], "5-tuple"),
    (("", 1, (1,), None, {"id": 1}), "table"),
    (("t", 4, (1,), None, {"id": 1}), "unknown operation kind"),
    (("t", True, (1,), None, {"id": 1}), "unknown operation kind"),
    (("t", 1, (), None, {"id": 1}), "key"),
    (("t", 1, (1,), {"id": 1}, {"id": 1}), "INSERT must not carry a before-image"),
    (("t", 3, (1,), {"id": 1}, {"id": 1}), "DELETE must not carry an after-image"),
    (("t", 2, (1,), None, {"a": 2}), "before must be a dict"),
    (("t", 1, (1,), None, {1: 2}), "column name"),
    (("t", 1, (1,), None, {"id": 2**64}), "after.id: integer"),
    (("t", 1, (1.5j,), None, {"id": 1}), "key: complex"),
])
def test_operation_problems(op, problem):
    found = operation_problem(op)
    if problem is None:
        assert found is None
    else:
        assert found is not None and problem in found


def test_as_operation_gives_the_named_form_without_copying_values():
    plain = ("t", 1, (1,), None, {"id": 1})
    op = as_operation(plain)
    assert isinstance(op, Operation) and op == plain and op.after is plain[4]
