"""Pieces shared by the transports that talk to servers (``sftp``, ``email``).

Rules of this file:
* Secrets come from a file or an environment variable, read when a
  connection is made (so a rotated password is picked up), never from an
  option value or an address.
* Retries back off exponentially and are bounded; every delay is computed
  here, the sleeping is done by the caller (``asyncio.sleep``).
* Nothing here does network I/O.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Iterator
from dataclasses import dataclass

from codec.errors import BadFileName
from codec.names import MessageName

from .errors import BadTransportOptions, TransportRefused

log = logging.getLogger(__name__)

MAX_RETRY_DELAY = 30.0
MAX_RETRIES = 100
#: Longest connect or command timeout: beyond a day a socket's timeout
#: overflows on some platforms, and no server answer is worth the wait.
MAX_TIMEOUT = 86400.0

# The temp-file rules of the folder transport, which sftp shares: a sender
# writes ``.<name>.<16 hex>.tmp``; readers skip every dot-name and other
# tools' partial-file suffixes.
OWN_TEMP = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}\.tmp\Z")
TEMP_SUFFIXES = (".tmp", ".part", ".partial", ".filepart", ".crdownload", "~")


def is_temporary(name: str) -> bool:
    return name.startswith(".") or name.endswith(TEMP_SUFFIXES)


def is_own_temp(name: str) -> bool:
    match = OWN_TEMP.match(name)
    if match is None:
        return False
    try:
        MessageName.parse(match["name"])
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
class Backoff:
    """How often and how patiently a call reconnects: ``retries`` more tries after
    the first, waiting ``first_delay``, then twice as long each time, at most
    ``MAX_RETRY_DELAY`` seconds."""

    retries: int
    first_delay: float

    def __post_init__(self) -> None:
        if type(self.retries) is not int or not 0 <= self.retries <= MAX_RETRIES:
            raise BadTransportOptions(f"retries must be a whole number 0..{MAX_RETRIES}, got {self.retries!r}")
        if isinstance(self.first_delay, bool) or not isinstance(self.first_delay, (int, float)) or not 0 <= self.first_delay <= MAX_RETRY_DELAY:
            raise BadTransportOptions(f"retry_delay must be 0..{MAX_RETRY_DELAY:.0f} seconds, got {self.first_delay!r}")

    def delays(self) -> Iterator[float]:
        """The waits before the second, third, ... attempt."""
        delay = float(self.first_delay)
        for _ in range(self.retries):
            yield delay
            delay = min(delay * 2, MAX_RETRY_DELAY)


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
