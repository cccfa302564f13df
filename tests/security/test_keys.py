"""Where a site's secret key lives: in ``<db>.agent/keys/site.key`` (0600, in
a 0700 folder), never in the site database, which keeps the mode the umask
gives it so the applications can open it.

The issue's finding: `agent init` stored the secret key text in
``fieldsync_site.secret``, so every user an application let read the
database could sign as the site, and `agent extract` made the new database
0600 so the remote's applications could not open it.
"""

from __future__ import annotations

import base64
import os
import pwd
import shutil
import sqlite3
import stat
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from agent.admin import extract_site
from agent.keyfiles import (SiteKeyError, agent_directory, check_no_key_file, key_path, load_site_keys, new_site_keys,
                            open_site_database, save_site_keys)
from agent.site import SiteDatabase
from agent.site.sqlite.schema import SCHEMA_VERSION
from codec.keys import SiteKeys
from tests.cli.conftest import World, agent, make_world  # noqa: F401 - agent is a fixture
from tests.old_layouts import back_to_layout_3


@pytest.fixture
def umask_022() -> Iterator[None]:
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def world(tmp_path: Path, agent, umask_022: None) -> World:  # type: ignore[no-untyped-def]
    return make_world(tmp_path, agent)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def secret_pieces(keys: SiteKeys) -> list[bytes]:
    """Every form the secret key could take in a file: the key file's text,
    its base64 lines, and the raw 32-byte seeds."""
    text = keys.to_text()
    lines = [line.split(": ", 1)[1] for line in text.splitlines() if line.startswith(("sign: ", "seal: "))]
    return [text.encode(), *(line.encode() for line in lines), *(base64.b64decode(line) for line in lines)]


def database_bytes(database: Path) -> dict[str, bytes]:
    return {suffix: Path(f"{database}{suffix}").read_bytes() for suffix in ("", "-wal", "-shm")
            if Path(f"{database}{suffix}").exists()}


def assert_no_secret_in(database: Path, keys: SiteKeys) -> None:
    for suffix, data in database_bytes(database).items():
        for piece in secret_pieces(keys):
            assert piece not in data, f"a piece of the secret key is in {database}{suffix}"


def keys_of(database: Path) -> SiteKeys:
    with SiteDatabase.open(database) as site:
        return load_site_keys(site)


# -- init and extract -----------------------------------------------------------------


def test_init_writes_the_key_file_and_keeps_the_database_mode(tmp_path: Path, agent, umask_022: None) -> None:
    database = tmp_path / "a.db"
    result = agent("init", database, "--name", "a", "--role", "consolidated", "--address", tmp_path)
    assert result.code == 0, result.err
    key = tmp_path / "a.db.agent" / "keys" / "site.key"
    assert mode(database) == 0o644  # as the umask made it: applications open it
    assert mode(key) == 0o600 and mode(key.parent) == 0o700
    assert key_path(database) == key
    assert f"Secret key: {key}" in result.out
    keys = SiteKeys.load(key)
    assert agent("key", database).out.strip() == keys.public.to_line()
    # No secret bytes in the database, even while an application holds it
    # open (its WAL is then not merged away at close).
    application = sqlite3.connect(database)
    with SiteDatabase.open(database) as site:
        site.add_remote("b")
        assert_no_secret_in(database, keys)
    application.close()
    assert_no_secret_in(database, keys)


def test_extract_writes_the_remotes_key_file_beside_its_database(world: World, agent) -> None:
    n3 = world.root / "n3.db"
    assert agent("remote", "add", world.hq, "n3", "--address", world.root, "--subscribe", "territory=n1").code == 0
    result = agent("extract", world.hq, "n3", n3)
    assert result.code == 0, result.err
    key = world.root / "n3.db.agent" / "keys" / "site.key"
    assert f"{key} holds n3's secret key" in result.out and "n3.db.agent to the field site" in result.out
    assert mode(n3) == 0o644 and mode(key) == 0o600 and mode(key.parent) == 0o700
    keys = SiteKeys.load(key)
    with SiteDatabase.open(world.hq) as hq:
        assert hq.remote("n3").public_key == keys.public.to_line()
    assert keys_of(n3).public == keys.public
    for database in (n3, world.hq, world.n1):
        assert_no_secret_in(database, keys)
    assert_no_secret_in(world.hq, keys_of(world.hq))


def test_moving_a_database_with_its_folder_moves_the_site(world: World, agent, tmp_path: Path) -> None:
    elsewhere = tmp_path / "field"
    elsewhere.mkdir()
    before = keys_of(world.n1)
    world.n1.rename(elsewhere / "n1.db")
    agent_directory(world.n1).rename(elsewhere / "n1.db.agent")
    assert keys_of(elsewhere / "n1.db").public == before.public


def test_extract_keeping_the_devices_keys_writes_them_to_the_key_file(world: World) -> None:
    kept = keys_of(world.n1)
    for suffix in ("", "-wal", "-shm"):
        Path(f"{world.n1}{suffix}").unlink(missing_ok=True)
    key_path(world.n1).unlink()
    with SiteDatabase.open(world.hq) as hq:
        extract_site(hq, "n1", world.n1, keys=kept)
    assert SiteKeys.load(key_path(world.n1)).to_text() == kept.to_text()
    assert_no_secret_in(world.n1, kept)


def test_a_key_file_in_the_way_is_never_written_over(world: World, agent, tmp_path: Path) -> None:
    stray = SiteKeys.generate("n3")
    save_site_keys(world.root / "n3.db", stray)  # a key whose database is gone
    assert agent("remote", "add", world.hq, "n3", "--address", world.root).code == 0
    result = agent("extract", world.hq, "n3", world.root / "n3.db")
    assert result.code == 1 and result.err_lines == [
        f"agent: {key_path(world.root / 'n3.db')} exists already (a site's secret key whose database is gone, or an "
        f"interrupted init or extract); move the folder {world.root / 'n3.db.agent'} aside or choose another path"]
    assert not (world.root / "n3.db").exists()
    assert SiteKeys.load(key_path(world.root / "n3.db")).to_text() == stray.to_text()
    result = agent("init", world.root / "n3.db", "--name", "n3", "--role", "remote", "--address", tmp_path)
    assert result.code == 1 and "exists already" in result.err and len(result.err_lines) == 1
    assert SiteKeys.load(key_path(world.root / "n3.db")).to_text() == stray.to_text()


def test_a_failed_init_leaves_no_key_file(tmp_path: Path, agent) -> None:
    garbage = tmp_path / "notes.txt"
    garbage.write_text("shopping list\n" * 100)
    result = agent("init", garbage, "--name", "x", "--role", "remote", "--address", tmp_path)
    assert result.code == 1
    assert not agent_directory(garbage).exists()
    database = tmp_path / "hq.db"
    assert agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path).code == 0
    key = key_path(database)
    key.rename(tmp_path / "saved.key")  # init again: refused, and the key it made is taken back
    result = agent("init", database, "--name", "hq", "--role", "consolidated", "--address", tmp_path)
    assert result.code == 1 and "already" in result.err
    assert not key.exists()


# -- checks at every load -----------------------------------------------------------


def test_a_group_readable_key_file_stops_the_agent_with_one_line(world: World, agent) -> None:
    key = key_path(world.hq)
    os.chmod(key, 0o640)
    result = agent("run", world.hq, "--once")
    assert result.code == 1 and result.err_lines == [
        f"agent: {key}: secret key file is open to group or others (mode 640); run: chmod 600 {key}"]
    os.chmod(key, 0o600)
    assert agent("run", world.hq, "--once").code == 0


def test_a_key_file_of_another_user_is_refused(world: World, agent, monkeypatch: pytest.MonkeyPatch) -> None:
    key = key_path(world.hq)
    owner = key.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # as if another user ran the agent
    try:
        runner = pwd.getpwuid(owner + 1).pw_name
    except KeyError:
        runner = str(owner + 1)
    result = agent("run", world.hq, "--once")
    assert result.code == 1 and result.err_lines == [
        f"agent: {key}: secret key file belongs to uid {owner}, not to {runner} who runs fieldsync; run fieldsync "
        f"as its owner, or as root: chown {runner} {key}"]


def test_a_missing_or_foreign_key_file_is_one_line(world: World, agent) -> None:
    key = key_path(world.n1)
    key.rename(world.root / "n1.key")
    result = agent("run", world.n1, "--once")
    assert result.code == 1 and result.err_lines == [
        f"agent: {key}: no secret key file for site n1; it is made by `agent init` or `agent extract` and moves "
        f"with the database: bring back the folder {agent_directory(world.n1)}"]
    key.write_bytes(key_path(world.n2).read_bytes())  # n2's key given to n1
    os.chmod(key, 0o600)
    result = agent("run", world.n1, "--once")
    assert result.code == 1 and result.err_lines == [
        f"agent: {key} holds the keys of site n2, but {world.n1} is site n1; put back n1's key file"]
    (world.root / "n1.key").replace(key)
    save_site_keys(world.root / "other.db", SiteKeys.generate("n1"))  # another copy of n1's keys
    key.write_bytes(key_path(world.root / "other.db").read_bytes())
    result = agent("run", world.n1, "--once")
    assert result.code == 1 and len(result.err_lines) == 1
    assert result.err_lines[0].startswith(f"agent: {key} holds other keys (")
    assert "it belongs to another copy of site n1" in result.err


def test_key_path_and_check(world: World, agent) -> None:
    key = key_path(world.hq)
    assert agent("key", world.hq, "--path").out.strip() == str(key)
    result = agent("key", world.hq, "--check")
    fingerprint = keys_of(world.hq).public.fingerprint
    assert result.code == 0 and result.out.strip() == (
        f"{key}: ok: the secret key of site hq (fingerprint {fingerprint}), mode 600, owned by this user")
    os.chmod(key, 0o604)
    result = agent("key", world.hq, "--check")
    assert result.code == 1 and result.err_lines == [
        f"agent: {key}: secret key file is open to group or others (mode 604); run: chmod 600 {key}"]
    result = agent("key", world.hq, "--check", "--path")
    assert result.code == 2 and "exclude each other" in result.err


# -- moving the secret out of an older database ---------------------------------------

def old_site(database: Path) -> SiteKeys:
    """Make ``database`` what fieldsync before layout 4 left: the secret key
    text in the site row, no key file.  Returns the keys."""
    keys = keys_of(database)
    shutil.rmtree(agent_directory(database) / "keys")
    back_to_layout_3(database, keys.to_text().encode("ascii"))
    assert any(keys.to_text().encode() in data for data in database_bytes(database).values())
    return keys


def layout_and_secret(database: Path) -> tuple[int, bytes | None]:
    conn = sqlite3.connect(database)
    try:
        columns = {row[1] for row in conn.execute("PRAGMA table_info(fieldsync_site)")}
        query = "SELECT schema_version, secret" if "secret" in columns else "SELECT schema_version, NULL"
        return conn.execute(f"{query} FROM fieldsync_site").fetchone()
    finally:
        conn.close()


def test_an_older_site_has_its_secret_moved_out_when_opened(world: World, agent) -> None:
    keys = old_site(world.n1)
    application = sqlite3.connect(world.n1)  # an application has it open all along
    application.execute("SELECT count(*) FROM customer").fetchone()
    result = agent("status", world.n1)
    assert result.code == 0, result.err
    key = key_path(world.n1)
    assert mode(key) == 0o600 and mode(key.parent) == 0o700
    assert SiteKeys.load(key).to_text() == keys.to_text()
    assert layout_and_secret(world.n1) == (SCHEMA_VERSION, None)
    assert_no_secret_in(world.n1, keys)
    application.close()
    assert_no_secret_in(world.n1, keys)
    assert agent("run", world.n1, "--once").code == 0


def test_an_interrupted_move_is_finished_by_the_next_open(world: World, agent) -> None:
    keys = old_site(world.n1)
    # The process dies right after the key file is written, before the
    # database forgets the secret.
    crash = ("import os, sys\n"
             "from agent.keyfiles import migrate_secret\n"
             "from agent.site import SiteDatabase\n"
             "def store(path, secret):\n"
             "    migrate_secret(path, secret)\n"
             "    os._exit(9)\n"
             "SiteDatabase.open(sys.argv[1], store_secret=store)\n")
    done = subprocess.run([sys.executable, "-c", crash, str(world.n1)], cwd=Path(__file__).parents[2])
    assert done.returncode == 9
    assert SiteKeys.load(key_path(world.n1)).to_text() == keys.to_text()
    assert layout_and_secret(world.n1) == (3, keys.to_text().encode())
    result = agent("key", world.n1, "--check")
    assert result.code == 0, result.err
    assert layout_and_secret(world.n1) == (SCHEMA_VERSION, None)
    assert SiteKeys.load(key_path(world.n1)).to_text() == keys.to_text()
    assert_no_secret_in(world.n1, keys)


def test_a_key_file_with_other_keys_than_the_database_is_refused(world: World, agent) -> None:
    keys = old_site(world.n1)
    other = SiteKeys.generate("n1")
    save_site_keys(world.n1, other)
    result = agent("run", world.n1, "--once")
    key = key_path(world.n1)
    assert result.code == 1 and result.err_lines == [
        f"agent: {key} holds other keys than the secret key kept in {world.n1}; move the key file aside (or put "
        "back this database's own) and open the site again"]
    assert SiteKeys.load(key).to_text() == other.to_text()  # never written over
    assert layout_and_secret(world.n1) == (3, keys.to_text().encode())  # the database as it was
    key.unlink()
    with open_site_database(world.n1) as site:
        assert load_site_keys(site).to_text() == keys.to_text()


# -- a key file a killed init or extract left ------------------------------------------


def _left_by_a_killed_step(database: Path, keys: SiteKeys, *, home: Path | None = None) -> Path:
    """The key file and claim a step making a site at ``database`` leaves
    when it is killed before the site is made (its claim's lock ends with
    its process: here, with the descriptor)."""
    with pytest.raises(KeyboardInterrupt), new_site_keys(database, keys, home=home) as path:
        made = sorted(entry.name for entry in path.parent.iterdir())
        assert made == ["site.key", "site.key.making"]
        saved = path.read_bytes()
        raise KeyboardInterrupt
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)  # what the kill would have left
    path.write_bytes(saved)
    path.chmod(0o600)
    path.with_name("site.key.making").write_bytes(b"")
    return path


def test_only_a_key_file_whose_claim_no_process_holds_and_no_database_names_is_removed(tmp_path: Path) -> None:
    import fcntl

    keys = SiteKeys.generate("n3")
    database = tmp_path / "n3.db"
    path = _left_by_a_killed_step(database, keys)
    claim = path.with_name("site.key.making")
    holder = os.open(claim, os.O_RDONLY)  # a live maker holds it: kept, and making another is refused
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        with pytest.raises(SiteKeyError, match="exists already"):
            check_no_key_file(database)
        with pytest.raises(SiteKeyError, match="exists already"):
            new_site_keys(database, SiteKeys.generate("n3")).__enter__()
    finally:
        os.close(holder)
    assert SiteKeys.load(path).to_text() == keys.to_text()
    # A database that names the key (killed after the site was made, before
    # the claim went): kept.
    with sqlite3.connect(database) as conn:
        conn.execute("CREATE TABLE fieldsync_site (id INTEGER PRIMARY KEY, public_key TEXT)")
        conn.execute("INSERT INTO fieldsync_site VALUES (1, ?)", (keys.public.to_line(),))
    conn.close()
    with pytest.raises(SiteKeyError, match="exists already"):
        check_no_key_file(database)
    assert SiteKeys.load(path).to_text() == keys.to_text()
    database.unlink()  # no database: it was never a site's
    assert check_no_key_file(database) == [path, claim]
    assert not agent_directory(database).exists()


def test_a_postgresql_sites_abandoned_key_file_is_kept(tmp_path: Path) -> None:
    """Whether a PostgreSQL database names the key cannot be told from the
    folder: the key stays in the way, as before claims."""
    keys = SiteKeys.generate("hq")
    home = tmp_path / "home"
    path = _left_by_a_killed_step("postgresql://nowhere/hq", keys, home=home)
    with pytest.raises(SiteKeyError, match="exists already"):
        check_no_key_file("postgresql://nowhere/hq", home=home)
    assert SiteKeys.load(path).to_text() == keys.to_text()
    path.unlink()  # killed before it wrote the key: the claim alone goes
    with new_site_keys("postgresql://nowhere/hq", keys, home=home) as made:
        assert made == path
    assert sorted(entry.name for entry in path.parent.iterdir()) == ["site.key"]


def test_a_killed_init_is_made_again_by_the_next(tmp_path: Path, agent) -> None:
    database = tmp_path / "n3.db"
    _left_by_a_killed_step(database, SiteKeys.generate("n3"))
    result = agent("init", database, "--name", "n3", "--role", "remote", "--address", tmp_path)
    assert result.code == 0, result.err
    with SiteDatabase.open(database) as site:
        assert load_site_keys(site).public.to_line() == site.identity.public_key
    assert sorted(entry.name for entry in key_path(database).parent.iterdir()) == ["site.key"]


def test_a_claim_left_beside_a_made_site_goes_at_its_first_load(world: World, agent, tmp_path: Path) -> None:
    """Killed after the site was made and before it let go of its claim:
    the claim stays beside a key a database names.  The site's first load
    (any run) removes it, so a later extraction to the same path, once the
    database was moved away alone, finds a key in its way, never one to
    take back."""
    assert agent("remote", "add", world.hq, "n3", "--address", world.root).code == 0
    assert agent("extract", world.hq, "n3", world.root / "n3.db").code == 0
    key = key_path(world.root / "n3.db")
    claim = key.with_name("site.key.making")
    claim.write_bytes(b"")  # what the kill left: a claim no process holds
    assert agent("run", world.root / "n3.db", "--once").code == 0
    assert not claim.exists()
    saved = key.read_bytes()
    (world.root / "n3.db").rename(tmp_path / "moved.db")
    result = agent("extract", world.hq, "n3", world.root / "n3.db")
    assert result.code == 1 and "exists already" in result.err
    assert key.read_bytes() == saved
