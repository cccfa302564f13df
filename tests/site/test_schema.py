"""Site identity and fieldsync's own tables (agent.site.sqlite.schema)."""

from __future__ import annotations

import contextlib
import sqlite3
from pathlib import Path

import pytest

from agent.site import (
    AlreadyASite,
    InvalidSetting,
    NotASite,
    Role,
    SecretInDatabase,
    SiteDatabase,
    UnsupportedSiteVersion,
)
from agent.site.sqlite.schema import SCHEMA_VERSION
from tests.old_layouts import back_to_layout, back_to_layout_3


def test_init_new_file_makes_a_site_in_wal_mode(tmp_path):
    site = SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated", address="hq@example.org",
                             transport="email", public_key="fieldsync-public hq AAAA BBBB")
    identity = site.identity
    assert identity.name == "hq"
    assert identity.role is Role.CONSOLIDATED
    assert type(identity.incarnation) is bytes and len(identity.incarnation) == 16
    assert identity.incarnation_uuid.version == 4
    assert identity.address == "hq@example.org"
    assert identity.transport == "email"
    assert site.connection.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    site.close()
    # WAL mode is a property of the file: a fresh plain connection sees it.
    assert sqlite3.connect(tmp_path / "hq.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_own_tables_are_prefixed_and_user_data_is_kept(tmp_path):
    path = tmp_path / "shop.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE remote (id INTEGER PRIMARY KEY, x TEXT)")  # names fieldsync might have used
    conn.execute("CREATE TABLE log (id INTEGER PRIMARY KEY)")
    conn.execute("INSERT INTO remote VALUES (1, 'kept')")
    conn.commit()
    conn.close()
    site = SiteDatabase.init(path, name="shop", role="remote")
    names = {row[0] for row in site.connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"remote", "log"} <= names
    assert all(name.startswith("fieldsync_") for name in names - {"remote", "log"})
    assert site.connection.execute("SELECT x FROM remote").fetchall() == [("kept",)]
    site.close()


def test_each_init_gets_a_new_incarnation(tmp_path):
    first = SiteDatabase.init(tmp_path / "a.db", name="a", role="remote")
    second = SiteDatabase.init(tmp_path / "b.db", name="a", role="remote")
    assert first.identity.incarnation != second.identity.incarnation
    first.close()
    second.close()


def test_identity_survives_reopening(tmp_path):
    site = SiteDatabase.init(tmp_path / "r.db", name="r-7", role="remote", address="/mnt/usb/r7")
    identity = site.identity
    site.close()
    with SiteDatabase.open(tmp_path / "r.db") as reopened:
        assert reopened.identity == identity


def test_init_twice_is_refused(tmp_path):
    SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated").close()
    with pytest.raises(AlreadyASite, match="already the fieldsync site 'hq'"):
        SiteDatabase.init(tmp_path / "hq.db", name="other", role="consolidated")


@pytest.mark.parametrize("name", ["", "has space", "../etc", "a/b", "x" * 49, 7])
def test_bad_site_names_are_refused(tmp_path, name):
    with pytest.raises(InvalidSetting):
        SiteDatabase.init(tmp_path / "x.db", name=name, role="remote")


def test_bad_role_is_refused(tmp_path):
    with pytest.raises(InvalidSetting, match="consolidated' or 'remote"):
        SiteDatabase.init(tmp_path / "x.db", name="x", role="hub")


def test_open_refuses_what_is_not_a_site(tmp_path):
    with pytest.raises(NotASite, match="no such database file"):
        SiteDatabase.open(tmp_path / "missing.db")
    assert not (tmp_path / "missing.db").exists()
    plain = tmp_path / "plain.db"
    sqlite3.connect(plain).execute("CREATE TABLE t (x)").connection.close()
    with pytest.raises(NotASite, match="not a fieldsync site"):
        SiteDatabase.open(plain)
    garbage = tmp_path / "garbage.db"
    garbage.write_bytes(b"this is not sqlite at all" * 100)
    with pytest.raises(NotASite):
        SiteDatabase.open(garbage)
    with pytest.raises(NotASite):
        SiteDatabase.init(garbage, name="g", role="remote")


def test_newer_layout_is_refused(tmp_path):
    SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated").close()
    conn = sqlite3.connect(tmp_path / "hq.db")
    conn.execute("UPDATE fieldsync_site SET schema_version = 99")
    conn.commit()
    conn.close()
    with pytest.raises(UnsupportedSiteVersion, match="upgrade fieldsync"):
        SiteDatabase.open(tmp_path / "hq.db")


def test_layout_2_gains_the_table_of_replaced_copies_when_opened(tmp_path):
    site = SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated")
    site.add_remote("r1")
    site.close()
    conn = sqlite3.connect(tmp_path / "hq.db")
    conn.execute("DROP TABLE fieldsync_replaced_copy")
    conn.execute("UPDATE fieldsync_site SET schema_version = 2")
    conn.commit()
    conn.close()
    with SiteDatabase.open(tmp_path / "hq.db") as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        assert site.replaced_incarnations("r1") == frozenset()
        first = site.extract("r1", tmp_path / "a.db").incarnation
        second = site.extract("r1", tmp_path / "b.db").incarnation
        assert site.replaced_incarnations("r1") == frozenset({first})
        site.extract("r1", tmp_path / "c.db")
        assert site.replaced_incarnations("r1") == frozenset({first, second})


def test_identity_is_frozen_and_holds_no_secret(tmp_path):
    site = SiteDatabase.init(tmp_path / "r.db", name="r", role="remote")
    assert not hasattr(site.identity, "secret")
    assert "secret" not in {row[1] for row in site.connection.execute("PRAGMA table_info(fieldsync_site)")}
    with pytest.raises(AttributeError):
        site.identity.name = "other"  # type: ignore[misc]
    site.close()


SECRET = b"fieldsync-secret-key v1\nsite: r\nsign: c2VjcmV0IHNpZ24ga2V5IG9mIHRoZSBzaXRlIHIgISE=\n"


def make_layout_3(path, secret: bytes | None) -> None:
    """A site of layout 3 whose row kept the secret key, in a file with free
    pages, as one whose rows were deleted has."""
    SiteDatabase.init(path, name="r", role="remote", public_key="fieldsync-public-key v1 r " + "A" * 90).close()
    back_to_layout_3(path, secret)
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("CREATE TABLE scratch (x)")
    conn.executemany("INSERT INTO scratch VALUES (?)", [(bytes(3000),)] * 20)
    conn.execute("DROP TABLE scratch")
    conn.close()


def test_layout_3_hands_its_secret_to_the_store_and_forgets_it(tmp_path):
    path = tmp_path / "r.db"
    make_layout_3(path, SECRET)
    stored = []
    application = sqlite3.connect(path)  # open all along: closing the site does not checkpoint
    application.execute("SELECT count(*) FROM sqlite_master").fetchone()
    with SiteDatabase.open(path, store_secret=lambda where, secret: stored.append((where, secret))) as site:
        assert stored == [(str(path), SECRET)]
        columns = [row[1] for row in site.connection.execute("PRAGMA table_info(fieldsync_site)")]
        assert "secret" not in columns
        assert site.connection.execute("SELECT schema_version, name, role FROM fieldsync_site").fetchone() == (
            SCHEMA_VERSION, "r", "remote")
        assert site.identity.name == "r"
        for suffix in ("", "-wal", "-shm"):  # not in a free page, nor in the WAL
            if (tmp_path / f"r.db{suffix}").exists():
                assert b"c2VjcmV0IHNpZ24" not in (tmp_path / f"r.db{suffix}").read_bytes(), suffix
    application.close()
    with SiteDatabase.open(path, store_secret=lambda *_: stored.append("again")):
        assert len(stored) == 1  # once


def test_layout_3_with_a_secret_needs_a_store_and_a_failing_store_changes_nothing(tmp_path):
    path = tmp_path / "r.db"
    make_layout_3(path, SECRET)
    with pytest.raises(SecretInDatabase, match="still holds its site's secret key .*agent key"):
        SiteDatabase.open(path)

    def refuse(where, secret):
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        SiteDatabase.open(path, store_secret=refuse)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT schema_version, secret FROM fieldsync_site").fetchone() == (3, SECRET)
    conn.close()


def test_layout_3_without_a_secret_opens_without_a_store(tmp_path):
    path = tmp_path / "r.db"
    make_layout_3(path, None)
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION


def test_layout_4_gains_the_quiet_columns_of_the_remote_user_table_when_opened(tmp_path):
    """Layout 5 adds log_read, heartbeat and control_sent_at to each remote's
    row; a remote of layout 4 starts with log_read 0 (meaning log_sent) and
    no control message sent, so its first run sends it a heartbeat."""
    path = tmp_path / "hq.db"
    with SiteDatabase.init(path, name="hq", role="consolidated") as site:
        site.add_remote("r1")
    conn = sqlite3.connect(path)
    for column in ("log_read", "heartbeat", "control_sent_at"):
        conn.execute(f"ALTER TABLE fieldsync_remote DROP COLUMN {column}")
    conn.execute("UPDATE fieldsync_site SET schema_version = 4")
    conn.commit()
    conn.close()
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        row = site.remote("r1")
        assert (row.log_read, row.heartbeat, row.control_sent_at) == (0, None, None)
        assert row.read_through == row.log_sent
        site.update_remote("r1", heartbeat=3600)
        assert site.remote("r1").heartbeat == 3600


def test_init_while_another_connection_holds_the_lock_says_busy(tmp_path):
    from agent.site import SiteBusy

    path = tmp_path / "busy.db"
    blocker = sqlite3.connect(path, isolation_level=None)
    blocker.execute("CREATE TABLE t (x)")
    blocker.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(SiteBusy, match="locked by another connection"):
            SiteDatabase.init(path, name="b", role="remote", busy_timeout=0.2)
    finally:
        blocker.execute("ROLLBACK")
        blocker.close()
    SiteDatabase.init(path, name="b", role="remote").close()


def test_layout_5_gains_the_stored_transport_settings_when_opened(tmp_path):
    """Layout 6 adds the site's reply address, each remote's own inbox and
    the stored transport options; a site of layout 5 starts with none."""
    path = tmp_path / "hq.db"
    with SiteDatabase.init(path, name="hq", role="consolidated", address="imaps://hq@mail.example.com/INBOX",
                           transport="email") as site:
        site.add_remote("r1", address="mailto:r1@example.com", transport="email")
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE fieldsync_site DROP COLUMN reply_address")
    conn.execute("ALTER TABLE fieldsync_remote DROP COLUMN inbox")
    conn.execute("DROP TABLE fieldsync_transport_option")
    conn.execute("UPDATE fieldsync_site SET schema_version = 5")
    conn.commit()
    conn.close()
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        assert site.identity.reply_address is None and site.remote("r1").inbox is None
        assert site.all_transport_options() == {}
        site.set_transport(reply_address="mailto:hq@example.com", options={"smtp_host": "mail.example.com"})
        site.set_transport(peer="r1", inbox="imaps://r1@mail.example.com/INBOX", options={"timeout": "90s"})
    with SiteDatabase.open(path) as site:
        assert site.identity.send_address == "mailto:hq@example.com"
        assert site.remote("r1").inbox == "imaps://r1@mail.example.com/INBOX"
        assert site.all_transport_options() == {"": {"smtp_host": "mail.example.com"}, "r1": {"timeout": "90s"}}


def test_a_stored_transport_option_never_holds_a_secret(tmp_path):
    with SiteDatabase.init(tmp_path / "hq.db", name="hq", role="consolidated") as site:
        for name in ("password", "smtp_password", "sftp.key_passphrase"):
            with pytest.raises(InvalidSetting, match="would hold a secret"):
                site.set_transport(options={name: "hunter2"})
        site.set_transport(options={"password_file": "/etc/fieldsync/mail-password", "password_env": "PW"})
        assert site.transport_options() == {"password_env": "PW", "password_file": "/etc/fieldsync/mail-password"}


def test_layout_6_gains_heard_at_when_opened(tmp_path):
    """Layout 7 adds when a message of each peer last arrived; a site of
    layout 6 starts with none heard (status and the metrics then go by the
    last data message, or the row's creation)."""
    path = tmp_path / "hq.db"
    with SiteDatabase.init(path, name="hq", role="consolidated") as site:
        site.add_remote("r1")
    conn = sqlite3.connect(path)
    conn.execute("ALTER TABLE fieldsync_remote DROP COLUMN heard_at")
    conn.execute("UPDATE fieldsync_site SET schema_version = 6")
    conn.commit()
    conn.close()
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        assert site.remote("r1").heard_at is None
        site.update_remote("r1", heard_at=1_795_000_000.5)
        with pytest.raises(InvalidSetting, match="heard_at must be a number of seconds"):
            site.update_remote("r1", heard_at="yesterday")
    with SiteDatabase.open(path) as site:
        assert site.remote("r1").heard_at == 1_795_000_000.5


def test_layout_7_gains_the_outstanding_columns_when_opened(tmp_path):
    """Layout 8 adds each remote's confirm timeout and the protocol's record
    of what is outstanding (docs/protocol.md, rule 3); a site of layout 7
    starts with nothing known, so an unconfirmed stream is probed at its
    first send phase.  It also keeps the errors in force apart from their
    history: its apply errors are in force until acknowledged."""
    path = tmp_path / "hq.db"
    with SiteDatabase.init(path, name="hq", role="consolidated") as site:
        site.add_remote("r1")
        site.connection.execute("INSERT INTO fieldsync_apply_error (at, peer, peer_commit, problem)"
                                " VALUES ('2026-03-01T12:00:00+00:00', 'r1', 1, 'bad')")
    fresh = tmp_path / "fresh.db"
    SiteDatabase.init(fresh, name="hq", role="consolidated").close()
    conn = sqlite3.connect(path)
    conn.execute("DROP INDEX fieldsync_apply_error_open")
    conn.execute("ALTER TABLE fieldsync_apply_error DROP COLUMN acknowledged_at")
    for column in ("confirm_timeout", "data_sent_at", "peer_confirmed", "probes", "confirm_owed", "error_count",
                   "error_seen_at", "stream_stopped", "stream_stopped_at", "peer_schema_version", "follows_common"):
        conn.execute(f"ALTER TABLE fieldsync_remote DROP COLUMN {column}")
    conn.execute("ALTER TABLE fieldsync_site DROP COLUMN common_read")
    conn.execute("UPDATE fieldsync_site SET schema_version = 7")
    conn.commit()
    conn.close()
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
        row = site.remote("r1")
        assert (row.confirm_timeout, row.data_sent_at, row.peer_confirmed, row.probes, row.confirm_owed) == (
            None, None, 0, 0, False)
        assert (row.error_count, row.error_seen_at, row.stream_stopped, row.stream_stopped_at) == (0, None, None, None)
        # The apply error of layout 7 is in force until acknowledged.
        assert site.open_apply_errors() == {"r1": 1}
        assert site.acknowledge_apply_errors("r1") == 1 and site.open_apply_errors() == {}
        site.update_remote("r1", heartbeat=7200, confirm_timeout=600, confirm_owed=True)
        with pytest.raises(InvalidSetting, match="above its heartbeat"):
            site.update_remote("r1", confirm_timeout=7201)
        with pytest.raises(InvalidSetting, match="above its heartbeat"):
            site.update_remote("r1", heartbeat=599)
    with SiteDatabase.open(path) as site:
        row = site.remote("r1")
        assert (row.heartbeat, row.confirm_timeout, row.confirm_owed) == (7200, 600, True)
    # The upgraded layout is the layout a new site is made with.
    with contextlib.closing(sqlite3.connect(path)) as upgraded, contextlib.closing(sqlite3.connect(fresh)) as new:
        for table in ("fieldsync_remote", "fieldsync_apply_error"):
            assert (upgraded.execute(f"PRAGMA table_info({table})").fetchall()
                    == new.execute(f"PRAGMA table_info({table})").fetchall()), table
        index = "SELECT sql FROM sqlite_master WHERE name = 'fieldsync_apply_error_open'"
        assert upgraded.execute(index).fetchall() == new.execute(index).fetchall() != []


def test_a_site_of_layout_11_gains_the_peers_schema_versions_when_opened(tmp_path):
    """Layout 12: each remote's reported schema version, none yet; the
    upgraded table is the one a new site is made with."""
    path, fresh = tmp_path / "hq.db", tmp_path / "fresh.db"
    with SiteDatabase.init(path, name="hq", role="consolidated") as site:
        site.add_remote("r1")
    SiteDatabase.init(fresh, name="hq", role="consolidated").close()
    back_to_layout(path, 11, "ALTER TABLE fieldsync_remote DROP COLUMN peer_schema_version",
                   "ALTER TABLE fieldsync_remote DROP COLUMN follows_common",
                   "ALTER TABLE fieldsync_site DROP COLUMN common_read")
    with SiteDatabase.open(path) as site:
        assert site.remote("r1").peer_schema_version is None
        site.update_remotes({"r1": {"peer_schema_version": 2741}})
        assert site.remote("r1").peer_schema_version == 2741
        with pytest.raises(InvalidSetting, match="peer_schema_version must be a non-negative integer"):
            site.update_remote("r1", peer_schema_version=-1)
    same_columns(path, fresh, "fieldsync_remote")


def test_a_site_of_layout_13_gains_what_its_applies_wrote_back_when_opened(tmp_path):
    """Layout 14: fieldsync_log.applied, unknown (NULL) for the log
    transactions written before; the upgraded table is a new site's."""
    path, fresh = tmp_path / "hq.db", tmp_path / "fresh.db"
    SiteDatabase.init(path, name="hq", role="consolidated").close()
    SiteDatabase.init(fresh, name="hq", role="consolidated").close()
    back_to_layout(path, 13, "ALTER TABLE fieldsync_log DROP COLUMN applied")
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0] == SCHEMA_VERSION
    assert [row[1] for row in same_columns(path, fresh, "fieldsync_log")][-1] == "applied"


def test_a_site_of_layout_14_gains_the_removed_articles_when_opened(tmp_path):
    """Layout 15: fieldsync_removed_article, empty (no article removed
    before was kept); the upgraded table is a new site's."""
    path, fresh = tmp_path / "hq.db", tmp_path / "fresh.db"
    for made in (path, fresh):
        SiteDatabase.init(made, name="hq", role="consolidated").close()
    back_to_layout(path, 14, "DROP TABLE fieldsync_removed_article")
    with SiteDatabase.open(path) as site:
        assert (site.connection.execute("SELECT schema_version FROM fieldsync_site").fetchone()[0],
                site.removed_articles()) == (SCHEMA_VERSION, [])
    assert same_columns(path, fresh, "fieldsync_removed_article") != []


def test_a_site_of_layout_15_gains_the_common_read_position_when_opened(tmp_path):
    """Layout 16: the common read position (0) and each remote's mark of
    following it, which no remote does yet: each keeps its own positions;
    the upgraded tables are a new site's."""
    path, fresh = tmp_path / "hq.db", tmp_path / "fresh.db"
    for made in (path, fresh):
        SiteDatabase.init(made, name="hq", role="consolidated").close()
    with SiteDatabase.open(path) as site:
        site.add_remote("r1")
        site.connection.execute("CREATE TABLE t (id INTEGER PRIMARY KEY)")
        site.connection.execute("INSERT INTO t VALUES (1)")
        end = site.scan()
        site.update_remote("r1", log_read=end)
    back_to_layout(path, 15, "ALTER TABLE fieldsync_remote DROP COLUMN follows_common",
                   "ALTER TABLE fieldsync_site DROP COLUMN common_read")
    with SiteDatabase.open(path) as site:
        assert site.connection.execute("SELECT schema_version, common_read FROM fieldsync_site").fetchone() == (
            SCHEMA_VERSION, 0)
        assert site.connection.execute("SELECT follows_common FROM fieldsync_remote").fetchall() == [(0,)]
        assert site.remote("r1").log_read == end
    assert [row[1] for row in same_columns(path, fresh, "fieldsync_remote")][-1] == "follows_common"
    assert [row[1] for row in same_columns(path, fresh, "fieldsync_site")][-1] == "common_read"


def same_columns(path: Path, fresh: Path, table: str) -> list[tuple]:
    """``table``'s columns in the upgraded site ``path``, which a new site
    (``fresh``) is made with too."""
    with contextlib.closing(sqlite3.connect(path)) as upgraded, contextlib.closing(sqlite3.connect(fresh)) as new:
        columns = upgraded.execute(f"PRAGMA table_info({table})").fetchall()
        assert columns == new.execute(f"PRAGMA table_info({table})").fetchall(), table
    return columns
