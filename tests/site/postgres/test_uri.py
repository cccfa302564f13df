"""agent.site.postgres.uri: which URIs name a site, and that a password in
one is refused without ever being shown."""

from __future__ import annotations

import pytest

from agent.site.errors import InvalidSetting, SiteError
from agent.site.postgres.errors import InvalidUri, PasswordInUri
from agent.site.postgres.uri import PgTarget, is_postgres_uri, parse_uri, redact

SECRET = "s3cr3t-Pa55"


@pytest.mark.parametrize("uri, dbname, where", [
    ("postgresql://app@127.0.0.1:5432/sales", "sales", "database sales on 127.0.0.1:5432"),
    ("postgres://app@db.example.org/sales", "sales", "database sales on db.example.org"),
    ("postgresql:///sales?service=hq", "sales", "database sales on service hq"),
    ("postgresql://%2Fvar%2Frun%2Fpostgresql/sales", "sales", "database sales on /var/run/postgresql"),
    ("postgresql://app@[::1]:5433/sales?connect_timeout=3&passfile=/home/app/.pgpass", "sales",
     "database sales on ::1:5433"),
    ("postgresql://", None, "the default database on the default server"),
])
def test_uris_libpq_takes_are_accepted(uri, dbname, where):
    target = parse_uri(uri)
    assert target.uri == uri
    assert target.dbname == dbname
    assert target.where == where
    assert is_postgres_uri(uri)


@pytest.mark.parametrize("uri, place", [
    (f"postgresql://app:{SECRET}@127.0.0.1:5432/sales", "its user part"),
    ("postgresql://app:@127.0.0.1/sales", "its user part"),
    (f"postgres://app:{SECRET}@127.0.0.1/sales?service=hq", "its user part"),
    (f"postgresql://app@127.0.0.1/sales?password={SECRET}", "a password= parameter"),
    (f"postgresql:///sales?service=hq&password={SECRET}", "a password= parameter"),
    (f"postgresql://app@127.0.0.1/sales?sslpassword={SECRET}&sslmode=require", "a sslpassword= parameter"),
    # Refused even where libpq would refuse the URI for another reason.
    (f"postgresql://app:{SECRET}@127.0.0.1/sales?nonsense=1", "its user part"),
])
def test_a_uri_with_a_password_is_refused_without_showing_it(uri, place):
    with pytest.raises(PasswordInUri) as caught:
        parse_uri(uri)
    message = str(caught.value)
    assert place in message
    assert SECRET not in message
    assert "\n" not in message
    assert "pgpass" in message and "service file" in message
    assert isinstance(caught.value, InvalidSetting) and isinstance(caught.value, SiteError)


def test_a_target_cannot_be_built_with_a_password():
    with pytest.raises(PasswordInUri) as caught:
        PgTarget("postgresql://app@h/db", (("dbname", "db"), ("password", SECRET)))
    assert SECRET not in str(caught.value)


def test_redact_removes_every_password():
    assert redact(f"postgresql://app:{SECRET}@h:5/db?password={SECRET}&sslmode=require") == \
        "postgresql://app@h:5/db?sslmode=require"
    assert redact("postgresql://app@h/db") == "postgresql://app@h/db"


@pytest.mark.parametrize("text", ["sales.db", "/srv/fieldsync/hq.db", "host=127.0.0.1 dbname=sales",
                                  "mysql://app@h/db", "POSTGRESQL://app@h/db", None, 5])
def test_what_is_not_a_postgres_uri_is_refused(text):
    assert not is_postgres_uri(text)
    with pytest.raises(InvalidUri) as caught:
        parse_uri(text)
    assert "\n" not in str(caught.value)


def test_libpq_s_own_reason_is_given_for_a_malformed_uri():
    with pytest.raises(InvalidUri) as caught:
        parse_uri("postgresql://app@127.0.0.1/sales?colour=blue")
    assert not isinstance(caught.value, PasswordInUri)
    assert "colour" in str(caught.value) and "\n" not in str(caught.value)
