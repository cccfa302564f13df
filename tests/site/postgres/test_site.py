"""PostgresSite (agent.site.postgres.site): its life cycle, identity and
home folder, the refusals of init and open, and the log's bookkeeping
(scan, log_end, log_start, change_marker, truncate_log)."""

from __future__ import annotations

import os
import stat
import threading
from datetime import datetime, timezone
from pathlib import Path

import pytest

from agent.site import (AlreadyASite, Article, InvalidSetting, NotASite, Role, SiteError, UnsupportedSiteVersion,
                        WrongRole)
from agent.site.postgres.connect import connect
from agent.site.postgres.schema import SCHEMA_VERSION, schema_installed
from agent.site.postgres.site import PostgresSite

from ..facade_checks import check_calls_from_two_threads_are_serialised

NOW = datetime(2026, 3, 1, 12, 0, tzinfo=timezone.utc)


def _init(target, home, **extra):  # type: ignore[no-untyped-def]
    return PostgresSite.init(target, name=extra.pop("name", "hq"), role=extra.pop("role", "consolidated"),
                             home=home, **extra)


# --- init and open -------------------------------------------------------------------

def test_init_makes_a_consolidated_site_and_open_reads_it_back(target, tmp_path):
    home = tmp_path / "agents" / "hq"
    with _init(target, home, address="inbox/hq", transport="folder", public_key="fieldsync-public hq A B",
               now=NOW) as site:
        identity = site.identity
        assert (identity.name, identity.role, identity.address, identity.transport) == (
            "hq", Role.CONSOLIDATED, "inbox/hq", "folder")
        assert identity.public_key == "fieldsync-public hq A B" and identity.reply_address is None
        assert identity.created_at == NOW and identity.created_at.tzinfo == timezone.utc
        assert len(identity.incarnation) == 16
        assert site.home == home and home.is_dir()
        assert stat.S_IMODE(home.stat().st_mode) == 0o700
        layout = site.connection.execute("SELECT schema_version FROM fieldsync.site").fetchone()[0]
        assert layout == SCHEMA_VERSION == 12
    with PostgresSite.open(target.uri) as again:
        assert again.identity == identity and again.home == home


def test_a_second_init_on_the_same_database_is_refused(hq, target, tmp_path):
    with pytest.raises(AlreadyASite, match="already the fieldsync site 'hq'; open it instead"):
        _init(target, tmp_path / "other", name="hq2")
    assert not (tmp_path / "other").exists()
    with PostgresSite.open(target) as site:
        assert site.identity == hq.identity


def test_two_inits_at_once_make_one_site(target, tmp_path):
    outcomes: list[object] = []
    barrier = threading.Barrier(2)

    def init(name: str) -> None:
        barrier.wait()
        try:
            outcomes.append(_init(target, tmp_path / name, name=name))
        except SiteError as error:
            outcomes.append(error)

    threads = [threading.Thread(target=init, args=(name,)) for name in ("hq1", "hq2")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    sites = [outcome for outcome in outcomes if isinstance(outcome, PostgresSite)]
    refused = [outcome for outcome in outcomes if isinstance(outcome, AlreadyASite)]
    assert len(sites) == len(refused) == 1
    sites[0].close()


@pytest.mark.parametrize("role, error, words", [
    ("remote", WrongRole, "cannot be a remote site: a PostgreSQL database is only ever the consolidated"),
    ("hub", InvalidSetting, "site role must be 'consolidated' or 'remote'"),
])
def test_only_the_consolidated_role_is_taken(target, tmp_path, role, error, words):
    with pytest.raises(error, match=words):
        _init(target, tmp_path / "home", role=role)
    assert not (tmp_path / "home").exists()
    conn = connect(target)
    assert not schema_installed(conn)
    conn.close()


def test_bad_names_and_texts_are_refused(target, tmp_path):
    with pytest.raises(InvalidSetting, match="site name"):
        _init(target, tmp_path / "home", name="no spaces")
    with pytest.raises(InvalidSetting, match="site address must be text"):
        _init(target, tmp_path / "home", address=7)
    with pytest.raises(InvalidSetting, match="no time zone"):
        _init(target, tmp_path / "home", now=datetime(2026, 3, 1))


def test_the_home_folder_must_be_an_absolute_writable_folder(target, tmp_path):
    with pytest.raises(InvalidSetting, match="relative path; give an absolute one"):
        _init(target, "agents/hq")
    a_file = tmp_path / "a-file"
    a_file.write_text("not a folder")
    with pytest.raises(InvalidSetting, match="exists and is not a folder"):
        _init(target, a_file)
    with pytest.raises(InvalidSetting, match="cannot make the agent's home folder"):
        _init(target, a_file / "below")
    with pytest.raises(InvalidSetting, match="must be a path"):
        _init(target, 7)
    with pytest.raises(NotASite):  # none of them made a site
        PostgresSite.open(target)


def test_a_folder_the_user_cannot_write_is_refused(target, tmp_path, monkeypatch):
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o500)
    if os.geteuid() == 0:  # root may write any folder: the check is asked as another user would be answered
        monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked)
    with pytest.raises(InvalidSetting, match="not writable by this user"):
        _init(target, locked)


def test_an_existing_home_folder_is_kept_as_it_is(target, tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o750)
    (home / "spool").mkdir()
    with _init(target, str(home)) as site:
        assert site.home == home and (home / "spool").is_dir()
    assert stat.S_IMODE(home.stat().st_mode) == 0o750


def test_a_failed_init_removes_the_home_folder_it_made(target, tmp_path, postgres, database):
    admin = postgres.admin(database)
    admin.execute("CREATE SCHEMA fieldsync")  # in the way: creating the schema fails
    admin.close()
    with pytest.raises(SiteError):
        _init(target, tmp_path / "made")
    assert not (tmp_path / "made").exists()


def test_open_refuses_what_is_no_site(target, site):
    with pytest.raises(NotASite, match="no site identity; initialise it"):
        PostgresSite.open(target)  # the schema without an identity
    site.execute("UPDATE fieldsync.site SET schema_version = %s", (SCHEMA_VERSION + 1,))
    with pytest.raises(UnsupportedSiteVersion, match=f"layout {SCHEMA_VERSION + 1}; this fieldsync reads up to"):
        PostgresSite.open(target)


def test_open_refuses_a_database_without_the_schema(target):
    with pytest.raises(NotASite, match="holds no fieldsync site"):
        PostgresSite.open(target)


def test_init_upgrades_the_layout_1_schema(target, site, tmp_path):
    """A database holding the foundation's schema (layout 1) gets the
    bookkeeping tables when it is made a site."""
    _back_to_layout_2(site)
    for table in ("identity", "article", "subscription", "publication", "remote", "transport_option",
                  "replaced_copy", "conflict", "apply_error"):
        site.execute(f"DROP TABLE fieldsync.{table}")
    site.execute("UPDATE fieldsync.site SET schema_version = 1")
    with _init(target, tmp_path / "home") as made:
        assert made.remotes() == ()
        assert made.connection.execute("SELECT schema_version FROM fieldsync.site").fetchone()[0] == SCHEMA_VERSION


def _back_to_layout_2(conn) -> None:  # type: ignore[no-untyped-def]
    conn.execute("ALTER TABLE fieldsync.remote DROP COLUMN peer_schema_version")  # layout 4's
    for table in ("conflict_policy", "returned"):
        conn.execute(f"DROP TABLE fieldsync.{table}")
    conn.execute("DROP INDEX fieldsync.log_txn_txid")
    for (name,) in conn.execute("SELECT indexname FROM pg_indexes WHERE schemaname = 'fieldsync'"
                                " AND indexname ~ '^capture_(key|moved)_'").fetchall():
        conn.execute(f"DROP INDEX fieldsync.{name}")
    conn.execute("UPDATE fieldsync.site SET schema_version = 2")


def test_open_upgrades_layout_2_with_the_key_indexes_of_every_shape(hq, target):
    """Layout 3 adds what an apply needs: the conflict policies, the rows
    written back, and two key indexes per shape made before it."""
    hq.close()
    old = connect(target)
    _back_to_layout_2(old)
    old.close()
    with PostgresSite.open(target) as site:
        conn = site.connection
        assert conn.execute("SELECT schema_version FROM fieldsync.site").fetchone()[0] == SCHEMA_VERSION
        (shape,) = [row[0] for row in conn.execute("SELECT id FROM fieldsync.shape")]
        indexes = dict(conn.execute("SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = 'fieldsync'"
                                    " AND indexname ~ '^capture_(key|moved)_'").fetchall())
        # customer (id, name, region, balance, photo): its key is column 1, and v[6] in an UPDATE's new row.
        assert indexes[f"capture_key_{shape}"].endswith(f"((v[1]), seq) WHERE (shape = {shape})")
        assert indexes[f"capture_moved_{shape}"].endswith(f"((v[6]), seq) WHERE ((shape = {shape}) AND (kind = 2))")
        assert site.conflicts() == () and site.apply_errors() == ()


def _back_to_layout(site, target, layout: int, *statements: str) -> None:  # type: ignore[no-untyped-def]
    """Close ``site`` and make its database one of ``layout`` again by ``statements``."""
    site.close()
    with connect(target) as old:
        for statement in statements:
            old.execute(statement)
        old.execute("UPDATE fieldsync.site SET schema_version = %s", (layout,))


def _layout(site) -> int:  # type: ignore[no-untyped-def]
    return site.connection.execute("SELECT schema_version FROM fieldsync.site").fetchone()[0]


def test_open_upgrades_layout_3_with_the_peers_schema_versions(hq, target):
    """Layout 4 adds the schema version each remote reported (none yet)."""
    hq.add_remote("r1")
    _back_to_layout(hq, target, 3, "ALTER TABLE fieldsync.remote DROP COLUMN peer_schema_version")
    with PostgresSite.open(target) as site:
        assert _layout(site) == SCHEMA_VERSION
        assert site.remote("r1").peer_schema_version is None and site.schema_version() is None
        site.update_remotes({"r1": {"peer_schema_version": 2741}})
        assert site.remote("r1").peer_schema_version == 2741


def test_open_upgrades_layout_4_dropping_the_foreign_key_of_the_rows_written_back(hq, target):
    """Layout 5: ``fieldsync.returned`` keeps no foreign key to the capture
    table (truncation deletes its rows itself: test_apply.py)."""
    _back_to_layout(hq, target, 4, "ALTER TABLE fieldsync.returned ADD FOREIGN KEY (txid, seq) REFERENCES"
                    " fieldsync.capture (txid, seq) ON DELETE CASCADE")
    with PostgresSite.open(target) as site:
        conn = site.connection
        assert _layout(site) == SCHEMA_VERSION
        assert conn.execute("SELECT count(*) FROM pg_constraint WHERE conrelid = 'fieldsync.returned'::regclass"
                            " AND contype = 'f'").fetchone()[0] == 0


def test_open_upgrades_layout_6_keying_articles_by_table_and_publication(hq, target):
    """Layout 7: an article is keyed by its table and its publication (a
    table may be in several); the articles of layout 6 stay as they were."""
    _back_to_layout(hq, target, 6, "ALTER TABLE fieldsync.article DROP CONSTRAINT article_pkey",
                    "ALTER TABLE fieldsync.article ADD PRIMARY KEY (table_schema, table_name)")
    with PostgresSite.open(target) as site:
        conn = site.connection
        assert _layout(site) == SCHEMA_VERSION
        assert conn.execute("SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'article_pkey'"
                            ).fetchone()[0] == "PRIMARY KEY (table_schema, table_name, publication)"
        site.create_publication("ledger", ["customer"])
        assert [(item.name, [article.table for article in item.articles]) for item in site.publications()] == [
            ("ledger", ["customer"]), ("p", ["customer"])]


def test_open_upgrades_layout_7_with_what_applies_wrote_back(hq, target):
    """Layout 8: ``fieldsync.applied``, what an apply that wrote rows back
    had applied of its peer (none before)."""
    _back_to_layout(hq, target, 7, "DROP TABLE fieldsync.applied")
    with PostgresSite.open(target) as site:
        assert _layout(site) == SCHEMA_VERSION
        assert site.connection.execute("SELECT count(*) FROM fieldsync.applied").fetchone() == (0,)
        assert site.log_applied(site.scan()) is None


# --- the object's life ---------------------------------------------------------------

def test_close_is_idempotent_and_closed_sites_refuse_work(hq):
    hq.close()
    hq.close()
    with pytest.raises(SiteError, match="closed"):
        hq.scan()
    with pytest.raises(SiteError, match="closed"):
        hq.remotes()


def test_context_manager_closes(hq, target):
    hq.close()
    with PostgresSite.open(target) as site:
        assert site.remotes() == ()
    with pytest.raises(SiteError):
        site.remotes()


def test_concurrent_calls_from_two_threads_are_serialised(hq):
    hq.add_remote("r1")
    check_calls_from_two_threads_are_serialised(hq, "r1", rounds=20)


# --- the log ------------------------------------------------------------------------

def test_scan_cuts_what_finished_and_log_end_and_start_say_where_the_log_is(hq, app):
    assert (hq.scan(), hq.log_end(), hq.log_start()) == (0, 0, 0)
    app.execute("INSERT INTO customer (name) VALUES ('a')")
    app.execute("BEGIN")
    app.execute("INSERT INTO customer (name) VALUES ('still open')")
    assert hq.scan() == hq.log_end() == 1
    assert hq.scan() == 1  # nothing more has finished
    app.execute("COMMIT")
    assert hq.scan() == 2
    rows = hq.connection.execute("SELECT origin FROM fieldsync.log ORDER BY commit_offset").fetchall()
    assert rows == [("hq",), ("hq",)]  # the applications' writes are the site's own


def test_the_change_marker_moves_with_every_commit_and_only_then(hq, app, target):
    first = hq.change_marker()
    assert hq.change_marker() == first  # nothing committed
    hq.remotes()
    assert hq.change_marker() == first  # reading commits nothing
    hq.add_remote("r1")
    second = hq.change_marker()
    assert second != first
    # A transaction that took its id before the marker was read and
    # commits after it moves the marker too.
    app.execute("BEGIN")
    app.execute("UPDATE fieldsync.remote SET send_every = 60 WHERE name = 'r1'")
    before_commit = hq.change_marker()
    app.execute("COMMIT")
    assert hq.change_marker() != before_commit
    settled = hq.change_marker()
    app.execute("BEGIN")
    app.execute("SELECT 1")
    app.execute("ROLLBACK")
    assert hq.change_marker() == settled


def _log_transactions(hq, app, count: int) -> list[int]:  # type: ignore[no-untyped-def]
    offsets = []
    for number in range(count):
        app.execute("INSERT INTO customer (name) VALUES (%s)", (f"row {number}",))
        offsets.append(hq.scan())
    return offsets


def test_truncation_keeps_what_some_remote_may_still_need(hq, app):
    offsets = _log_transactions(hq, app, 4)
    assert hq.truncate_log() == 0  # no remote: nothing is deleted
    hq.add_remote("r1", start=0)
    hq.add_remote("r2", start=0)
    hq.record_send("r1", log_sent=offsets[3])
    hq.update_remote("r1", confirm_sent=offsets[2])
    hq.record_send("r2", log_sent=offsets[1])
    hq.update_remote("r2", confirm_sent=offsets[1], log_read=offsets[3])
    # r1 has not confirmed all it was sent: its horizon is what it confirmed;
    # r2 confirmed all: everything read for it (agent.site.remote_rules.horizon).
    assert (hq.remote("r1").horizon, hq.remote("r2").horizon) == (offsets[2], offsets[3])
    assert hq.truncate_log() == offsets[2] == hq.log_start()
    assert hq.log_end() == offsets[3]
    kept = hq.connection.execute("SELECT commit_offset FROM fieldsync.log ORDER BY 1").fetchall()
    assert kept == [(offsets[3],)]
    assert hq.truncate_log() == offsets[2]  # nothing new to delete
    hq.remove_remote("r1")
    assert hq.truncate_log() == offsets[3]
    assert hq.log_end() == offsets[3]  # the log end never goes back


def test_truncation_forgets_subscription_offsets_below_it(hq, app):
    offsets = _log_transactions(hq, app, 3)
    hq.add_remote("r1", start=0)
    hq.subscribe("r1", "p", "north")
    hq.subscribe("r1", "p", "south")
    hq.subscribe("r1", "p", "east")
    conn = hq.connection
    conn.execute("UPDATE fieldsync.subscription SET until = %s WHERE value_text = 'north'", (offsets[1],))
    conn.execute("UPDATE fieldsync.subscription SET since = %s WHERE value_text = 'south'", (offsets[0],))
    conn.execute("UPDATE fieldsync.subscription SET since = %s WHERE value_text = 'east'", (offsets[2],))
    hq.record_send("r1", log_sent=offsets[1])
    hq.update_remote("r1", confirm_sent=offsets[1])
    assert hq.truncate_log() == offsets[1]
    held = conn.execute("SELECT value_text, since, until FROM fieldsync.subscription ORDER BY id").fetchall()
    assert held == [("south", 0, None), ("east", offsets[2], None)]
    assert [item.value for item in hq.subscriptions("r1")] == ["south", "east"]

def test_open_upgrades_layout_10_with_the_removed_articles(hq, target):
    """Layout 11: ``fieldsync.removed_article`` (none kept before), a
    subscription's publication no longer a foreign key (a dropped
    publication's subscriptions end), and ``subscription_change`` keyed by
    transaction and subscription (a drop ends several in one)."""
    hq.create_publication("sales", [Article("customer")])
    hq.add_remote("r1")
    hq.subscribe("r1", "sales")
    _back_to_layout(hq, target, 10, "DROP TABLE fieldsync.removed_article",
                    "ALTER TABLE fieldsync.subscription ADD CONSTRAINT subscription_publication_fkey"
                    " FOREIGN KEY (publication) REFERENCES fieldsync.publication (name)",
                    "ALTER TABLE fieldsync.subscription_change DROP CONSTRAINT subscription_change_pkey",
                    "ALTER TABLE fieldsync.subscription_change ADD PRIMARY KEY (txid)")
    with PostgresSite.open(target) as site:
        assert _layout(site) == SCHEMA_VERSION
        assert site.removed_articles() == []
        keys = site.connection.execute(
            "SELECT conname, pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid IN"
            " ('fieldsync.subscription'::regclass, 'fieldsync.subscription_change'::regclass)"
            " AND contype IN ('f', 'p') ORDER BY conname").fetchall()
        assert keys == [("subscription_change_pkey", "PRIMARY KEY (txid, ends)"),
                        ("subscription_pkey", "PRIMARY KEY (id)")]


def test_open_upgrades_layout_11_with_the_common_read_position(hq, target):
    """Layout 12: the common read position (0), which no remote follows yet:
    each keeps its own positions."""
    hq.add_remote("r1")
    hq.update_remote("r1", log_read=0)
    _back_to_layout(hq, target, 11, "ALTER TABLE fieldsync.remote DROP COLUMN follows_common",
                    "ALTER TABLE fieldsync.site DROP COLUMN common_read")
    with PostgresSite.open(target) as site:
        assert _layout(site) == SCHEMA_VERSION
        assert site.connection.execute("SELECT common_read FROM fieldsync.site").fetchone()[0] == 0
        assert site.connection.execute("SELECT follows_common FROM fieldsync.remote").fetchall() == [(False,)]
        assert site.remote("r1").log_read == 0


# The methods are held to the Site interface's, with SiteDatabase's, by tests/site/test_interface.py.


def test_open_upgrades_layout_8_with_schema_changes(hq, target):
    """Layout 9: the capture table takes a schema change's row (kind 4) and
    ``fieldsync.schema_change`` keeps the changes (none before)."""
    _back_to_layout(hq, target, 8, "DROP TABLE fieldsync.schema_change",
                    "ALTER TABLE fieldsync.capture DROP CONSTRAINT capture_kind_check",
                    "ALTER TABLE fieldsync.capture ADD CONSTRAINT capture_kind_check CHECK (kind IN (1, 2, 3))")
    with PostgresSite.open(target) as site:
        assert _layout(site) == SCHEMA_VERSION
        assert site.schema_version() is None
        result = site.apply_schema(["ALTER TABLE customer ADD COLUMN note text"])
        assert site.schema_version() == result.offsets[0]


def test_open_upgrades_layout_9_with_the_subscription_ends_waiting_for_their_cut(hq, target):
    """Layout 10: ``fieldsync.subscription_change`` (none waits before), which
    every cut reads."""
    _back_to_layout(hq, target, 9, "DROP TABLE fieldsync.subscription_change")
    with PostgresSite.open(target) as site:
        assert _layout(site) == SCHEMA_VERSION
        assert site.connection.execute("SELECT count(*) FROM fieldsync.subscription_change").fetchone() == (0,)
        site.scan()
