"""The transport package's error tree.

Every failure a transport or the registry reports is one of these; any other
exception escaping :mod:`transports` is a bug.  Messages say what went wrong,
with what (the address, the name), and what to do next, on one line.

``retryable`` tells the agent whether trying the same call again later can
succeed without an operator changing anything.
"""

from __future__ import annotations


class TransportError(Exception):
    """Base of every error raised by :mod:`transports`."""

    retryable: bool = False


class TransportUnavailable(TransportError):
    """The transport cannot be reached now: server down, network gone, folder
    missing or not mounted, disk full.  Retry later."""

    retryable = True


class TransportRefused(TransportError):
    """The other side said no: authentication failed, permission denied,
    host key mismatch.  Retrying will not help until an operator fixes it."""


class BadAddress(TransportError, ValueError):
    """An address is not a valid address for this transport."""


class InvalidMessageName(TransportError, ValueError):
    """``send`` was given a name that is not a fieldsync message file name.

    Raised before the transport touches its file system or server, so a name
    never becomes an unchecked path component."""


class TransportClosed(TransportError):
    """The transport was used after ``aclose()``."""


class RegistryError(TransportError):
    """A transport name, spec, registration or option set is invalid."""


class UnknownTransport(RegistryError, LookupError):
    """No transport is registered under that name."""


class TransportNotInstalled(UnknownTransport, ImportError):
    """A transport is registered but its module (or a package it needs)
    cannot be imported; the message carries the install hint."""


class TransportNameTaken(RegistryError):
    """``register`` was asked to take a name already in use (pass
    ``replace=True`` to replace it)."""


class BadTransportOptions(RegistryError, TypeError, ValueError):
    """A transport was given options it does not accept (an unknown name, a
    value of the wrong type or out of range): from ``create_transport`` and
    from the transports' constructors."""
