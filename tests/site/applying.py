"""Helpers of the apply tests: operations, transactions and two sites."""

from __future__ import annotations

import pytest

from agent.site import Article
from codec.ops import Operation, Transaction

from .conftest import CUSTOMER, LINE, decoded, make_site


def ins(row_id, **values):
    return Operation.insert("customer", (row_id,), {"id": row_id, **values})


def upd(row_id, before, after):
    return Operation.update("customer", (row_id,), before, after)


def txn(commit, *ops, origin="r1"):
    # _trusted: as the message decoder builds them (ops may be plain tuples,
    # or runs: see conftest.decoded).
    return decoded(Transaction._trusted(commit, origin, ops))


@pytest.fixture
def hq(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, LINE)
    site.create_publication("sales", [Article("customer", subscribe_by="region"), Article("line")])
    for remote, region in (("r1", "north"), ("r2", "north")):
        site.add_remote(remote)
        site.subscribe(remote, "sales", region)
    yield site
    site.close()


@pytest.fixture
def remote(tmp_path):
    site = make_site(tmp_path, "r1", "remote", CUSTOMER, LINE)
    site.create_publication("sales", [Article("customer"), Article("line")])
    site.add_remote("hq")
    yield site
    site.close()
