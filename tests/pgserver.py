"""A real PostgreSQL 15 server for the tests, in a temporary folder on 127.0.0.1.

Rules of this file:
* The server is Debian's PostgreSQL 15 (``/usr/lib/postgresql/15/bin``):
  ``initdb`` makes a cluster of its own in a fresh temporary folder and
  ``pg_ctl`` starts it listening on 127.0.0.1 only, on a free port, with its
  unix socket in that folder.  Nothing outside the folder is written, except
  the system user ``fieldsync-pg`` (below).
* PostgreSQL refuses to run as root: when the tests run as root, the
  cluster belongs to a system user made for it (``useradd --system``, once
  per machine) and the folder is given to that user.
* Authentication: the superuser ``fieldsync_admin`` is trusted (socket and
  127.0.0.1), so tests and the helpers below need no password for it; every
  other role logs in over TCP with SCRAM, its password coming from a pgpass
  file the test writes (:func:`write_pgpass`), as a user's would.
* A server that does not come up raises ``ServerFailed`` with the tail of
  its log, having removed its folder; nothing here skips.  ``close()``
  stops a running one and removes the folder.
* The cluster runs without fsync (test data only).  ``durable=True`` keeps
  PostgreSQL's defaults, for measurements.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg
from psycopg import sql

from tests.sysusers import SystemUserFailed, system_user
from tests.transports.servers import ServerFailed, _tail, free_port

__all__ = ["PostgresServer", "ServerFailed", "write_pgpass"]

BINARIES = Path("/usr/lib/postgresql/15/bin")
OS_USER = "fieldsync-pg"
SUPERUSER = "fieldsync_admin"
START_TIMEOUT = 30

# Settings for a throwaway test cluster: no durability, small, quiet.
_FAST = ("fsync=off", "synchronous_commit=off", "full_page_writes=off")


def _os_user() -> pwd.struct_passwd | None:
    """The user the server runs as: None for the current one, the system
    user ``fieldsync-pg`` (made when missing) when running as root."""
    if os.geteuid() != 0:
        return None
    try:
        return system_user(OS_USER, "--no-create-home", "--home-dir", "/nonexistent", "--shell", "/usr/sbin/nologin")
    except SystemUserFailed as error:
        raise ServerFailed(f"cannot create the system user {OS_USER} for PostgreSQL: {error}") from None


def write_pgpass(path: Path, entries: list[tuple[str, int, str, str, str]]) -> Path:
    """Write a pgpass file of ``(host, port, database, user, password)``
    lines, readable by its owner only (libpq ignores any other)."""
    def field(value: object) -> str:
        return str(value).replace("\\", "\\\\").replace(":", "\\:")
    path.write_text("".join(":".join(map(field, entry)) + "\n" for entry in entries))
    path.chmod(0o600)
    return path


class PostgresServer:
    """One PostgreSQL cluster of the test session.

    ``uri(database, user)`` names a database the way the agent is given it;
    ``admin(database)`` is a superuser connection (autocommit) for setting
    tests up; ``create_role`` and ``create_database`` make what a test needs,
    with fresh names from ``new_name``.
    """

    def __init__(self, base: Path | None = None, *, durable: bool = False) -> None:
        self.base = Path(base or tempfile.mkdtemp(prefix="fieldsync-pg-"))
        self.data = self.base / "data"
        self.socket_dir = self.base / "socket"
        self.log = self.base / "postgres.log"
        self.port = free_port()
        self.host = "127.0.0.1"
        self.durable = durable
        self._owner = _os_user()
        self._names = itertools.count(1)
        self._running = False
        self.socket_dir.mkdir(parents=True, exist_ok=True)
        self.log.touch()
        if self._owner is not None:
            for path in (self.base, self.socket_dir, self.log):
                os.chown(path, self._owner.pw_uid, self._owner.pw_gid)
            self.base.chmod(0o755)  # the tests (root) read the log; the data folder stays 0700

    # -- running PostgreSQL's programs -----------------------------------------

    def _run(self, program: str, *arguments: str) -> subprocess.CompletedProcess:
        command = [str(BINARIES / program), *arguments]
        user = {} if self._owner is None else {"user": self._owner.pw_uid, "group": self._owner.pw_gid,
                                               "extra_groups": []}
        environment = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8",
                       "HOME": str(self.base)}
        try:
            return subprocess.run(command, capture_output=True, text=True, env=environment, cwd=self.base,
                                  timeout=START_TIMEOUT + 30, **user)
        except FileNotFoundError:
            raise ServerFailed(f"cannot run {command[0]}: run scripts/setup to install postgresql-15") from None
        except subprocess.TimeoutExpired:
            raise ServerFailed(f"{program} did not finish within {START_TIMEOUT + 30} s:\n{_tail(self.log)}") from None

    def start(self) -> "PostgresServer":
        """Run the server (initdb first if need be); on failure, close it and
        raise ServerFailed with the reason."""
        if self._running:
            return self
        try:
            self._start()
        except ServerFailed:
            self.close()
            raise
        self._running = True
        return self

    def _start(self) -> None:
        if not self.data.exists():
            made = self._run("initdb", "-D", str(self.data), "-U", SUPERUSER, "--auth-local=trust",
                             "--auth-host=scram-sha-256", "--encoding=UTF8", "--locale=C", "--no-sync")
            if made.returncode != 0:
                raise ServerFailed(f"initdb failed with status {made.returncode}:\n{made.stdout}{made.stderr}")
            # Only 127.0.0.1 and the folder's socket; the superuser needs no password.
            (self.data / "pg_hba.conf").write_text(
                f"local all all trust\n"
                f"host all {SUPERUSER} 127.0.0.1/32 trust\n"
                f"host all all 127.0.0.1/32 scram-sha-256\n")
        settings = [f"port={self.port}", f"listen_addresses={self.host}",
                    f"unix_socket_directories={self.socket_dir}", "max_connections=60",
                    *(() if self.durable else _FAST)]
        options = " ".join(f"-c {setting}" for setting in settings)
        started = self._run("pg_ctl", "start", "-w", "-t", str(START_TIMEOUT), "-D", str(self.data),
                            "-l", str(self.log), "-o", options)
        if started.returncode != 0:
            raise ServerFailed(f"PostgreSQL did not start on {self.host}:{self.port} "
                               f"(pg_ctl status {started.returncode}: {started.stderr.strip()}):\n{_tail(self.log)}")

    def stop(self) -> None:
        """Stop the server (every connection drops); ``start`` runs it again."""
        if (self.data / "postmaster.pid").exists():
            self._run("pg_ctl", "stop", "-w", "-m", "fast", "-D", str(self.data))
        self._running = False

    def close(self) -> None:
        self.stop()
        shutil.rmtree(self.base, ignore_errors=True)

    # -- names and connections ---------------------------------------------------

    def new_name(self, prefix: str) -> str:
        return f"{prefix}_{next(self._names)}"

    def uri(self, database: str, user: str = SUPERUSER, **parameters: str) -> str:
        query = "&".join(f"{key}={value}" for key, value in parameters.items())
        return f"postgresql://{user}@{self.host}:{self.port}/{database}" + (f"?{query}" if query else "")

    def admin(self, database: str = "postgres") -> psycopg.Connection:
        """A superuser connection over the folder's socket, in autocommit mode."""
        return psycopg.connect(host=str(self.socket_dir), port=self.port, dbname=database, user=SUPERUSER,
                               autocommit=True)

    def create_role(self, name: str | None = None, *, password: str | None = None, login: bool = True,
                    createdb: bool = False) -> str:
        """A plain role (never a superuser); returns its name."""
        name = name or self.new_name("role")
        options = sql.SQL(" ").join(sql.SQL(option) for option in (
            "LOGIN" if login else "NOLOGIN", "CREATEDB" if createdb else "NOCREATEDB"))
        with self.admin() as conn:
            conn.execute(sql.SQL("CREATE ROLE {} {}").format(sql.Identifier(name), options))
            if password is not None:
                conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(name),
                                                                          sql.Literal(password)))
        return name

    def create_database(self, name: str | None = None, *, owner: str | None = None) -> str:
        """A new empty database (owned by ``owner`` when given); returns its name."""
        name = name or self.new_name("db")
        statement = sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name))
        if owner is not None:
            statement = sql.SQL("{} OWNER {}").format(statement, sql.Identifier(owner))
        with self.admin() as conn:
            conn.execute(statement)
        return name

    def drop_database(self, name: str) -> None:
        with self.admin() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
