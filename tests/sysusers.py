"""System users the tests make when they run as root: ``fieldsync-pg``,
who owns the test PostgreSQL clusters (tests/pgserver.py), and
``fieldsync-worker``, who runs the Spark worker (tests/spark/test_cluster.py).

Each is made once per machine, by whichever test process needs it first.
With pytest-xdist two workers can need it at the same moment: the one whose
``useradd`` loses finds the user made ("already exists"), or finds
/etc/passwd locked by the other and tries again.
"""

from __future__ import annotations

import pwd
import subprocess
import time

__all__ = ["SystemUserFailed", "system_user"]

LOCK_WAIT = 30.0


class SystemUserFailed(RuntimeError):
    """``useradd`` could not make the user (its error is the message)."""


def system_user(name: str, *options: str) -> pwd.struct_passwd:
    """The user ``name``, made with ``useradd --system OPTIONS NAME`` when missing."""
    deadline = time.monotonic() + LOCK_WAIT
    while True:
        try:
            return pwd.getpwnam(name)
        except KeyError:
            pass
        made = subprocess.run(["useradd", "--system", *options, name], capture_output=True, text=True)
        if made.returncode == 0 or "already exists" in made.stderr:
            return pwd.getpwnam(name)
        # shadow's useradd gives up at once when another one holds the lock:
        # "useradd: cannot lock /etc/passwd; try again later."
        if "lock" not in made.stderr or time.monotonic() > deadline:
            raise SystemUserFailed(made.stderr.strip() or f"useradd exited with status {made.returncode}")
        time.sleep(0.1)
