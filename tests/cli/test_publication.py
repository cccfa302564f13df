"""agent publication create | add | list, and the article syntax."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from agent.cli.publication import article_text, parse_article
from agent.site import Article, SiteDatabase
from tests.sqlfiles import connected

from .conftest import Agent


@pytest.mark.parametrize("text, article", [
    ("product", Article("product")),
    ("customer@region", Article("customer", None, "region")),
    ("customer:id,name,region@region", Article("customer", ("id", "name", "region"), "region")),
    ("customer:name", Article("customer", ("name",))),
])
def test_parse_article(text: str, article: Article) -> None:
    assert parse_article(text) == article
    assert article_text(article) == text


@pytest.mark.parametrize("text", ["", "customer:", "customer@", "@region", "customer:a,,b", "a@b@c", "a:b:c",
                                  "two words", ":id"])
def test_parse_article_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="bad article"):
        parse_article(text)


@pytest.fixture
def site(tmp_path: Path, agent: Agent) -> Path:
    database = tmp_path / "hq.db"
    agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path / "hq-inbox")
    with connected(database) as conn:
        conn.execute("CREATE TABLE customer (id INTEGER PRIMARY KEY, region TEXT, name TEXT, secret TEXT)")
        conn.execute("CREATE TABLE product (sku TEXT PRIMARY KEY, price REAL)")
        conn.execute("CREATE TABLE visit (id INTEGER PRIMARY KEY, region TEXT)")
    return database


def test_create_add_and_list(site: Path, agent: Agent) -> None:
    result = agent("publication", "create", site, "territory", "customer:id,region,name@region")
    assert result.code == 0, result.err
    assert "territory: customer:id,region,name@region" in result.out
    assert agent("publication", "create", site, "catalogue", "product").code == 0
    assert agent("publication", "add", site, "territory", "visit@region").code == 0
    with SiteDatabase.open(site) as opened:
        publications = {item.name: item.articles for item in opened.publications()}
    assert publications == {
        "catalogue": (Article("product"),),
        "territory": (Article("customer", ("id", "region", "name"), "region"), Article("visit", None, "region")),
    }
    listing = agent("publication", "list", site)
    assert listing.code == 0
    for text in ("territory", "catalogue", "customer", "id, region, name", "visit", "region"):
        assert text in listing.out


def test_list_counts_subscribers_and_lists_them_when_asked(site: Path, agent: Agent, tmp_path: Path) -> None:
    """A fleet's subscribers would fill one table cell: the list counts them;
    --subscribers and --json give them with their values."""
    agent("publication", "create", site, "territory", "customer@region")
    agent("publication", "create", site, "catalogue", "product")
    fleet = tmp_path / "fleet.csv"
    fleet.write_text("name,address,subscribe\n" + "".join(
        f"r{n:03d},{tmp_path / f'r{n}'},territory=r{n:03d}\n" for n in range(150)))
    assert agent("remote", "add", site, "--from", fleet).code == 0, "fleet"
    agent("remote", "subscribe", site, "r000", "territory=spare")
    listing = agent("publication", "list", site)
    assert listing.code == 0 and "150 remotes (151 subscriptions)" in listing.out
    assert "r001" not in listing.out and len(listing.out) < 2000
    assert "r007=r007" in agent("publication", "list", site, "--subscribers").out
    document = json.loads(agent("publication", "list", site, "--json").out)
    assert document["format"] == "fieldsync.publications/1"
    territory = {item["name"]: item for item in document["publications"]}["territory"]
    assert territory["articles"] == [{"table": "customer", "columns": None, "subscribe_by": "region", "follows": None,
                                      "follow_columns": None}]
    assert len(territory["subscribers"]) == 151 and {"remote": "r000", "value": "spare"} in territory["subscribers"]
    assert {item["name"]: item for item in document["publications"]}["catalogue"]["subscribers"] == []


def test_list_of_a_site_without_publications(site: Path, agent: Agent) -> None:
    result = agent("publication", "list", site)
    assert result.code == 0 and "no publications" in result.out


def test_bad_article_is_a_usage_error_on_one_line(site: Path, agent: Agent) -> None:
    result = agent("publication", "create", site, "territory", "customer:@region")
    assert result.code == 2
    assert len(result.err_lines) == 1
    assert result.err_lines[0].startswith("agent: ") and "bad article 'customer:@region'" in result.err
    with SiteDatabase.open(site) as opened:
        assert opened.publications() == ()


def test_unknown_table_or_column_is_an_error(site: Path, agent: Agent) -> None:
    result = agent("publication", "create", site, "p", "nosuchtable")
    assert result.code == 1 and len(result.err_lines) == 1 and "nosuchtable" in result.err
    result = agent("publication", "create", site, "q", "customer@nosuchcolumn")
    assert result.code == 1 and len(result.err_lines) == 1 and "nosuchcolumn" in result.err


def test_articles_are_required(site: Path, agent: Agent) -> None:
    result = agent("publication", "create", site, "empty")
    assert result.code == 2 and len(result.err_lines) == 1


def _capture_rows(site: Path) -> int:
    with connected(site) as conn:
        return conn.execute("SELECT count(*) FROM fieldsync_capture").fetchone()[0]


def test_remove_and_drop_stop_capturing(site: Path, agent: Agent) -> None:
    assert agent("publication", "create", site, "territory", "customer@region", "visit@region").code == 0
    assert agent("publication", "create", site, "catalogue", "product").code == 0
    refused = agent("publication", "remove", site, "visit", "nosuch")
    assert refused.code == 1 and refused.err_lines == [
        f"agent: not published in {site}: 'nosuch'; nothing was changed (`agent publication list` shows what is)"]
    result = agent("publication", "remove", site, "visit")
    assert result.code == 0 and "Stopped publishing: visit" in result.out
    assert agent("publication", "drop", site, "catalogue").code == 0
    with SiteDatabase.open(site) as opened:
        assert {item.name: item.articles for item in opened.publications()} == {
            "territory": (Article("customer", None, "region"),)}
    before = _capture_rows(site)
    with connected(site) as conn:
        conn.execute("INSERT INTO visit VALUES (1, 'north')")
        conn.execute("INSERT INTO product VALUES ('P-1', 2.5)")
    assert _capture_rows(site) == before  # neither is captured any more
    with connected(site) as conn:
        conn.execute("INSERT INTO customer VALUES (1, 'north', 'A', 's')")
    assert _capture_rows(site) == before + 1
    missing = agent("publication", "drop", site, "catalogue")
    assert missing.code == 1 and "no publication named 'catalogue'" in missing.err


def test_a_published_table_renamed_away_is_named_by_run_and_status(site: Path, agent: Agent) -> None:
    (site.parent / "hq-inbox").mkdir()
    assert agent("publication", "create", site, "catalogue", "product").code == 0
    with connected(site) as conn:
        conn.execute("ALTER TABLE product RENAME TO article")
    run = agent("run", site, "--once")
    assert run.code == 0, run.err
    says = "published table 'product' is no longer in"
    assert [line for line in run.err_lines if says in line] == [
        next(line for line in run.err_lines if says in line)]
    assert f"stop publishing it with `agent publication remove {site} product`" in run.err
    status = agent("status", site)
    assert says.replace(" in", " in the database") in status.out
    assert agent("status", site, "--json").out.count('"product"') == 1
    assert agent("publication", "remove", site, "product").code == 0
    assert says not in agent("run", site, "--once").err
    assert '"missing_tables": []' in agent("status", site, "--json").out
