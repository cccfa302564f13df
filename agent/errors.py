"""The agent's error tree, and the one function that words any error for users."""

from __future__ import annotations


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
        return f"{error.strerror or error} ({error.filename})" if error.filename else str(error)
    return f"internal error: {type(error).__name__}: {error} (rerun with --debug for the traceback)"
