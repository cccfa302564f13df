"""One agent per consolidated: a PostgreSQL advisory lock held while it runs.

Rules of this file:
* The lock is a session-level advisory lock on one fixed key (the first 8
  bytes of the SHA-256 of :data:`LOCK_NAMESPACE`), taken with
  ``pg_try_advisory_lock`` on a connection of its own.  Advisory locks are
  per database, so the key needs no database name: two agents on one
  database collide wherever they run; agents on two databases never do.
* It never waits: a lock that is taken is refused at once with one line
  naming the database and the holder (its server process, application and
  address, as far as the role may see them).
* The lock lasts as long as its connection: ``release()`` (or the end of the
  agent's process, or a dropped connection) frees it.  ``check()`` tells
  the holder when its connection, and with it the lock, is gone.
"""

from __future__ import annotations

import hashlib

import psycopg

from .connect import connect, translate
from .errors import AgentRunning, NotReachable
from .uri import PgTarget, parse_uri

LOCK_NAMESPACE = b"fieldsync: one agent per consolidated database"
LOCK_KEY = int.from_bytes(hashlib.sha256(LOCK_NAMESPACE).digest()[:8], "big", signed=True)

# pg_locks shows a bigint advisory key as two 32-bit halves, objsubid 1.
_HOLDER = """
SELECT l.pid, a.application_name, a.client_addr::text, a.backend_start
  FROM pg_locks l LEFT JOIN pg_stat_activity a ON a.pid = l.pid
 WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
   AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
   AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid
"""


class AgentLock:
    """The advisory lock of one consolidated; a context manager.

    ``acquire()`` takes it or raises AgentRunning; ``release()`` is
    idempotent.
    """

    def __init__(self, target: PgTarget | str) -> None:
        self.target = parse_uri(target) if isinstance(target, str) else target
        self._conn: psycopg.Connection | None = None

    @property
    def held(self) -> bool:
        return self._conn is not None and not self._conn.closed

    def acquire(self) -> "AgentLock":
        if self.held:
            return self
        conn = connect(self.target)
        try:
            taken = conn.execute("SELECT pg_try_advisory_lock(%s)", (LOCK_KEY,)).fetchone()
            if not (taken and taken[0]):
                raise AgentRunning(f"another fieldsync agent is running on {self.target.where} "
                                   f"({self._holder(conn)}): one agent per consolidated; stop it first")
        except psycopg.Error as error:
            conn.close()
            raise translate(error, self.target, "taking the agent's lock") from None
        except BaseException:
            conn.close()
            raise
        self._conn = conn
        return self

    @staticmethod
    def _holder(conn: psycopg.Connection) -> str:
        high, low = (LOCK_KEY >> 32) & 0xFFFFFFFF, LOCK_KEY & 0xFFFFFFFF
        found = conn.execute(_HOLDER, (high, low)).fetchone()
        if found is None:
            return "its holder just left: try again"
        pid, application, address, started = found
        parts = [f"server process {pid}"]
        if application:
            parts.append(f"application {application}")
        if address:
            parts.append(f"from {address}")
        if started is not None:
            parts.append(f"since {started:%Y-%m-%d %H:%M:%S %Z}".rstrip())
        return ", ".join(parts)

    def check(self) -> None:
        """Raise NotReachable when the lock's connection is gone (the lock
        went with it: another agent may hold it now)."""
        if self._conn is None:
            raise NotReachable(f"the agent's lock on {self.target.where} is not held")
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error as error:
            self.release()
            raise NotReachable(f"lost the connection holding the agent's lock on {self.target.where}: "
                               f"{str(error).strip().splitlines()[0] if str(error).strip() else error!r}; "
                               "stop and start the agent again") from None

    def release(self) -> None:
        conn, self._conn = self._conn, None
        if conn is None or conn.closed:
            return
        try:
            # Unlocked before the session ends: closing alone frees the lock
            # only once the server process has gone, so an agent started
            # right after this one stopped could still find it held.
            conn.execute("SELECT pg_advisory_unlock(%s)", (LOCK_KEY,))
        except psycopg.Error:
            pass  # the session is gone already, and its lock with it
        finally:
            conn.close()

    def __enter__(self) -> "AgentLock":
        return self.acquire()

    def __exit__(self, *exc_info: object) -> None:
        self.release()
