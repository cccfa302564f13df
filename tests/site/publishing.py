"""Helpers of the publication, selection and folding tests."""

from __future__ import annotations

import pytest

from agent.site import Article

from .conftest import CUSTOMER, LINE, make_site


def read_ops(site, remote, after=0):
    return [op for t in site.read_log(remote, after, site.scan()) for op in t.ops]


@pytest.fixture
def hq(tmp_path):
    site = make_site(tmp_path, "hq", "consolidated", CUSTOMER, LINE)
    site.create_publication("sales", [Article("customer", columns=["name", "region"], subscribe_by="region"),
                                      Article("line")])
    for remote, region in (("north1", "north"), ("south1", "south"), ("idle", None)):
        site.add_remote(remote)
    site.subscribe("north1", "sales", "north")
    site.subscribe("south1", "sales", "south")
    yield site
    site.close()
