"""The agent's error tree, and the one function that words any error for users."""

from __future__ import annotations

import errno


class AgentError(Exception):
    """Base of the errors the agent raises on purpose; the text is for users."""


class UsageError(AgentError):
    """The user asked for something that cannot be done as asked."""


def describe_error(error: BaseException) -> str:
    """One line saying what went wrong; internal errors say so and ask for --debug."""
    from codec.errors import CodecError
    from transports.errors import TransportError

    from .site.errors import SiteError

    if isinstance(error, (AgentError, CodecError, SiteError, TransportError)):
        return str(error)
    if isinstance(error, OSError):
        if not error.filename:
            return str(error)
        where = error.filename
        if isinstance(error, FileExistsError):
            return f"{where} is in the way: it exists and is not the folder the agent needs there; move it aside"
        if isinstance(error, NotADirectoryError):
            return f"{where}: a part of this path is a file where a folder is needed; move it aside"
        if isinstance(error, IsADirectoryError):
            return f"{where} is a folder where a file is needed; move it aside"
        if error.errno == errno.ENAMETOOLONG:
            return f"a path is too long for the file system: {str(where)[:80]}..."
        return f"{error.strerror or error} ({where})"
    return f"internal error: {type(error).__name__}: {error} (rerun with --debug for the traceback)"
