"""Transports move message files between site inboxes: the interface, the
registry of plugins (``folder``, ``sftp``, ``email``, third-party entry
points) and the typed errors they raise.  Plugins are imported on first use."""

from .base import (Incoming, NameFilter, Refusal, RefusalSink, Screen, Transport, TransportWrapper, check_message_name,
                   every_name)
from .errors import (
    BadAddress,
    BadTransportOptions,
    InvalidMessageName,
    RegistryError,
    TransportClosed,
    TransportError,
    TransportNameTaken,
    TransportNotInstalled,
    TransportRefused,
    TransportUnavailable,
    UnknownTransport,
)
from .registry import (
    ENTRY_POINT_GROUP,
    RegistryEntry,
    TransportSpec,
    available_transports,
    check_transport_spec,
    create_transport,
    get_transport_class,
    parse_transport_spec,
    refresh_entry_points,
    register,
)

# The read-only view is ``transports.registry.registry``; it is not re-exported
# here so that ``transports.registry`` stays the module.

__all__ = [
    "Incoming", "NameFilter", "Refusal", "RefusalSink", "Screen", "Transport", "TransportWrapper", "check_message_name", "every_name",
    "BadAddress", "BadTransportOptions", "InvalidMessageName", "RegistryError", "TransportClosed",
    "TransportError", "TransportNameTaken", "TransportNotInstalled", "TransportRefused",
    "TransportUnavailable", "UnknownTransport",
    "ENTRY_POINT_GROUP", "RegistryEntry", "TransportSpec", "available_transports", "check_transport_spec",
    "create_transport",
    "get_transport_class", "parse_transport_spec", "refresh_entry_points", "register",
]
