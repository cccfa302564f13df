"""agent.site.postgres.connect: connections find their password the way
libpq does, and each way a connection fails is one line naming the role,
database and server."""

from __future__ import annotations

import psycopg
import pytest

from agent.site.postgres.connect import connect, translate
from agent.site.postgres.errors import (
    AuthenticationFailed,
    MissingPrivilege,
    NotReachable,
    PostgresDatabaseError,
    UnsupportedDatabase,
)
from agent.site.postgres.schema import install_schema, schema_installed
from agent.site.postgres.uri import parse_uri
from tests.pgserver import write_pgpass
from tests.transports.servers import free_port

PASSWORD = "right horse battery"


@pytest.fixture
def app_role(postgres, database):
    """A plain role with a password, allowed to connect to the database."""
    role = postgres.create_role(password=PASSWORD)
    with postgres.admin(database) as conn:
        conn.execute(f'GRANT CONNECT ON DATABASE "{database}" TO "{role}"')
    return role


def _one_line(error: Exception) -> str:
    message = str(error)
    assert "\n" not in message and PASSWORD not in message
    return message


def test_a_server_that_is_not_there_is_not_reachable():
    port = free_port()
    with pytest.raises(NotReachable) as caught:
        connect(f"postgresql://app@127.0.0.1:{port}/sales?connect_timeout=3")
    message = _one_line(caught.value)
    assert f"127.0.0.1:{port}" in message and "database sales" in message
    assert "refused" in message.lower()


def test_a_missing_database_is_named(postgres):
    with pytest.raises(NotReachable) as caught:
        connect(postgres.uri("no_such_db"))
    assert "no_such_db" in _one_line(caught.value) and "createdb" in str(caught.value)


def test_sessions_run_without_jit_and_keep_the_uris_options(postgres, database):
    # JIT compiled a page of the log read for longer than it ran (connect.SESSION_OPTIONS).
    with connect(postgres.uri(database)) as conn:
        assert conn.execute("SHOW jit").fetchone() == ("off",)
    uri = postgres.uri(database) + "?options=-c%20jit%3Don%20-c%20work_mem%3D8MB"
    with connect(uri) as conn:
        assert conn.execute("SELECT current_setting('jit'), current_setting('work_mem')").fetchone() == ("on", "8MB")


def test_the_password_comes_from_pgpassfile(postgres, database, app_role, tmp_path, monkeypatch):
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "pgpass",
                                                      [("127.0.0.1", postgres.port, database, app_role, PASSWORD)])))
    conn = connect(postgres.uri(database, app_role))
    try:
        assert conn.execute("SELECT current_user").fetchone() == (app_role,)
    finally:
        conn.close()


def test_the_password_comes_from_a_service_file(postgres, database, app_role, tmp_path, monkeypatch):
    services = tmp_path / "pg_service.conf"
    services.write_text(f"[hq]\nhost=127.0.0.1\nport={postgres.port}\nuser={app_role}\n")
    monkeypatch.setenv("PGSERVICEFILE", str(services))
    monkeypatch.setenv("PGPASSFILE", str(write_pgpass(tmp_path / "pgpass",
                                                      [("127.0.0.1", postgres.port, "*", app_role, PASSWORD)])))
    conn = connect(f"postgresql:///{database}?service=hq")
    try:
        assert conn.execute("SELECT current_user, current_database()").fetchone() == (app_role, database)
    finally:
        conn.close()


def test_a_wrong_password_in_the_pgpass_file_is_refused(postgres, database, app_role, tmp_path):
    passfile = write_pgpass(tmp_path / "pgpass", [("127.0.0.1", postgres.port, "*", app_role, "wrong")])
    with pytest.raises(AuthenticationFailed) as caught:
        connect(postgres.uri(database, app_role, passfile=str(passfile)))
    message = _one_line(caught.value)
    assert f"role {app_role}" in message and database in message and f"127.0.0.1:{postgres.port}" in message
    assert "password authentication failed" in message and "wrong" not in message.split(":")[-1]


def test_no_password_found_says_where_to_put_it(postgres, database, app_role, tmp_path):
    with pytest.raises(AuthenticationFailed) as caught:
        connect(postgres.uri(database, app_role, passfile=str(tmp_path / "missing")))
    message = _one_line(caught.value)
    assert "no password found" in message and "pgpass" in message and f"role {app_role}" in message


def test_a_role_without_connect_privilege_is_refused(postgres, database, tmp_path):
    role = postgres.create_role(password=PASSWORD)
    with postgres.admin(database) as conn:
        conn.execute(f'REVOKE CONNECT ON DATABASE "{database}" FROM PUBLIC')
    passfile = write_pgpass(tmp_path / "pgpass", [("127.0.0.1", postgres.port, "*", role, PASSWORD)])
    with pytest.raises(MissingPrivilege) as caught:
        connect(postgres.uri(database, role, passfile=str(passfile)))
    message = _one_line(caught.value)
    assert f"role {role}" in message and database in message and "GRANT CONNECT" in message


def test_a_role_without_create_cannot_install_the_schema_and_nothing_changes(postgres, database, app_role,
                                                                               tmp_path):
    passfile = write_pgpass(tmp_path / "pgpass", [("127.0.0.1", postgres.port, "*", app_role, PASSWORD)])
    target = parse_uri(postgres.uri(database, app_role, passfile=str(passfile)))
    conn = connect(target)
    try:
        with pytest.raises(MissingPrivilege) as caught:
            install_schema(conn, target)
        message = _one_line(caught.value)
        assert f"role {app_role}" in message and f"database {database}" in message
        assert "creating the fieldsync schema" in message and "Privileges" in message
        assert not schema_installed(conn)
    finally:
        conn.close()


def test_a_role_with_create_installs_the_schema_without_superuser(postgres, database, app_role, tmp_path):
    with postgres.admin(database) as conn:
        conn.execute(f'GRANT CREATE ON DATABASE "{database}" TO "{app_role}"')
    passfile = write_pgpass(tmp_path / "pgpass", [("127.0.0.1", postgres.port, "*", app_role, PASSWORD)])
    target = parse_uri(postgres.uri(database, app_role, passfile=str(passfile)))
    conn = connect(target)
    try:
        install_schema(conn, target)
        install_schema(conn, target)  # a second time changes nothing
        assert conn.execute("SELECT nspowner::regrole::text FROM pg_namespace WHERE nspname = 'fieldsync'"
                            ).fetchone() == (app_role,)
    finally:
        conn.close()


def test_a_database_in_another_encoding_is_refused(postgres):
    name = postgres.new_name("latin1")
    with postgres.admin() as conn:
        conn.execute(f"CREATE DATABASE {name} ENCODING 'LATIN1' LC_COLLATE 'C' LC_CTYPE 'C' TEMPLATE template0")
    try:
        with pytest.raises(UnsupportedDatabase) as caught:
            connect(postgres.uri(name))
        assert "LATIN1" in _one_line(caught.value) and "UTF8" in str(caught.value)
    finally:
        postgres.drop_database(name)


def test_translate_keeps_unexpected_errors_with_their_cause(site, target):
    try:
        site.execute("SELECT 1/0")
    except psycopg.Error as error:
        translated = translate(error, target, "dividing")
    assert isinstance(translated, PostgresDatabaseError)
    assert "division by zero" in _one_line(translated) and "while dividing" in str(translated)
    assert isinstance(translated.__cause__, psycopg.errors.DivisionByZero)
