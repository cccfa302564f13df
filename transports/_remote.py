"""Pieces shared by the transports that talk to servers (``sftp``, ``email``),
and the temp-file rule ``sftp`` shares with ``folder``.

Rules of this file:
* Secrets come from a file or an environment variable, read when a
  connection is made (so a rotated password is picked up), never from an
  option value or an address.
* Retries back off exponentially and are bounded (transports.backoff
  computes every delay); the sleeping is done by the caller (``asyncio.sleep``).
* Nothing here does network I/O.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from dataclasses import dataclass

from codec.errors import BadFileName
from codec.fsutil import is_temporary, temporary_target  # noqa: F401 (is_temporary: for sftp)
from codec.names import MessageName

from .backoff import MAX_RETRIES, MAX_RETRY_DELAY, Backoff  # noqa: F401 (the transports' import of it)
from .errors import BadTransportOptions, TransportRefused

log = logging.getLogger(__name__)

#: Longest connect or command timeout: beyond a day a socket's timeout
#: overflows on some platforms, and no server answer is worth the wait.
MAX_TIMEOUT = 86400.0

# The temp-file rules of the folder and sftp transports: a sender writes
# ``codec.fsutil.temporary_name(name)``; readers skip every name
# ``codec.fsutil.is_temporary`` (re-exported here) calls temporary.


def is_own_temp(name: str) -> bool:
    """A temporary file a sender of ours left: only these are ever cleaned up."""
    target = temporary_target(name)
    if target is None:
        return False
    try:
        MessageName.parse(target)
    except BadFileName:
        return False
    return True


def check_timeouts(**timeouts: object) -> None:
    """Each must be a number of seconds, more than 0 and at most a day."""
    for option, value in timeouts.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
            raise BadTransportOptions(f"{option} must be a number of seconds > 0 and at most {MAX_TIMEOUT:.0f} (a day), "
                             f"got {value!r}")


@dataclass(frozen=True, slots=True)
class SecretSource:
    """Where a password comes from: ``<what>_file`` or ``<what>_env``, not both."""

    what: str
    file: str | None = None
    env: str | None = None

    def __post_init__(self) -> None:
        if self.file is not None and self.env is not None:
            raise BadTransportOptions(f"give {self.what}_file or {self.what}_env, not both")
        if self.file is not None and (type(self.file) is not str or not self.file):
            raise BadTransportOptions(f"{self.what}_file must be a path, got {self.file!r}")
        if self.env is not None and (type(self.env) is not str or not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.env)):
            raise BadTransportOptions(f"{self.what}_env must be an environment variable name, got {self.env!r}")

    @property
    def configured(self) -> bool:
        return self.file is not None or self.env is not None

    def describe(self) -> str:
        if self.file is not None:
            return f"{self.what}_file {self.file}"
        if self.env is not None:
            return f"{self.what}_env {self.env}"
        return f"no {self.what}"

    def read(self) -> str | None:
        """The secret, or None if none is configured.  Blocking: call it in a thread.

        Raises TransportRefused when the file or variable is missing: an
        operator has to fix that, retrying will not.
        """
        if self.env is not None:
            value = os.environ.get(self.env)
            if value is None:
                raise TransportRefused(f"{self.what}_env names ${self.env}, which is not set in the agent's environment")
            return value
        if self.file is None:
            return None
        path = os.path.expanduser(self.file)
        try:
            with open(path, "rb") as secret_file:
                mode = os.fstat(secret_file.fileno()).st_mode
                raw = secret_file.read(64 * 1024)
        except OSError as error:
            raise TransportRefused(f"cannot read {self.what}_file {path}: {error.strerror}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            log.warning("%s_file %s can be read by other users; chmod 600 it", self.what, path)
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            raise TransportRefused(f"{self.what}_file {path} is not UTF-8 text") from None
        # Editors end files with a newline; a password never does.
        return text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text


def one_line(text: object) -> str:
    """``text`` on one line, for error messages that quote a server."""
    return " ".join(str(text).split())
