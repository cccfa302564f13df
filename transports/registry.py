"""Which transport a name means: built-ins, registrations, entry points.

Rules of this file:
* ``registry`` is a read-only view of one private dict; only ``register``
  and the entry-point scan change it.
* Built-ins are listed by dotted path and imported on first use, so a site
  that only uses ``folder`` never needs paramiko or aioimaplib installed.
* Third-party packages add transports through the entry-point group
  ``fieldsync.transports``.  Built-ins and explicit ``register`` calls win
  over entry points; a clash is logged, never silently resolved.
* A spec ``wrapper+...+inner`` names wrappers (``faults``) around one inner
  transport; every part is looked up in this same registry.
"""

from __future__ import annotations

import importlib
import inspect
import logging
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass
from importlib.metadata import entry_points
from types import MappingProxyType
from typing import Any

from .base import Transport
from .errors import (
    BadTransportOptions,
    RegistryError,
    TransportError,
    TransportNameTaken,
    TransportNotInstalled,
    UnknownTransport,
)
from .options import read_text_options

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "fieldsync.transports"

_NAME = re.compile(r"[a-z][a-z0-9_-]{0,31}\Z")
_DOTTED = re.compile(r"[A-Za-z_][\w.]*(?::[A-Za-z_][\w.]*)?\Z")


@dataclass(frozen=True, slots=True)
class RegistryEntry:
    """What a transport name refers to.

    ``target`` is the class itself or a dotted path ``"package.module:Class"``
    imported on first use; ``origin`` says where the entry came from
    (``"built-in"``, ``"register()"``, ``"entry point of <distribution>"``).
    """

    name: str
    target: type[Transport] | str
    origin: str
    install_hint: str | None = None


_BUILTINS: tuple[RegistryEntry, ...] = (
    RegistryEntry("folder", "transports.folder:FolderTransport", "built-in"),
    RegistryEntry("sftp", "transports.sftp:SftpTransport", "built-in", "pip install paramiko"),
    RegistryEntry("email", "transports.email:EmailTransport", "built-in", "pip install aiosmtplib aioimaplib"),
    RegistryEntry("faults", "transports.faults:FaultsTransport", "built-in"),
)

_lock = threading.RLock()
_registry: dict[str, RegistryEntry] = {entry.name: entry for entry in _BUILTINS}
_loaded: dict[str, type[Transport]] = {}
_entry_points_scanned = False

#: Read-only view: transport name -> RegistryEntry.  Scan entry points first
#: (``available_transports()`` does) to see third-party transports here.
registry: Mapping[str, RegistryEntry] = MappingProxyType(_registry)


@dataclass(frozen=True, slots=True)
class TransportSpec:
    """A parsed ``--transport`` value: ``faults+folder`` -> wrappers ("faults",), inner "folder"."""

    wrappers: tuple[str, ...]
    inner: str

    def __str__(self) -> str:
        return "+".join((*self.wrappers, self.inner))


def _check_name(name: str) -> str:
    if type(name) is not str or not _NAME.match(name):
        raise RegistryError(
            f"invalid transport name {name!r}: use 1-32 lowercase letters, digits, '_' or '-', "
            "starting with a letter ('+' joins a wrapper to a transport, as in faults+folder)")
    return name


def parse_transport_spec(spec: str) -> TransportSpec:
    """Split ``"wrapper+...+inner"``; raise RegistryError if any part is not a valid name."""
    if type(spec) is not str or not spec:
        raise RegistryError(f"transport must be a name such as 'folder' or 'faults+folder', got {spec!r}")
    parts = spec.split("+")
    for part in parts:
        if not part:
            raise RegistryError(f"transport {spec!r} has an empty part; write it like 'faults+folder'")
        try:
            _check_name(part)
        except RegistryError:
            raise RegistryError(
                f"transport {spec!r}: {part!r} is not a transport name "
                "(lowercase letters, digits, '_' or '-', starting with a letter)") from None
    return TransportSpec(tuple(parts[:-1]), parts[-1])


def _scan_entry_points() -> None:
    global _entry_points_scanned
    with _lock:
        if _entry_points_scanned:
            return
        _entry_points_scanned = True
        for point in entry_points(group=ENTRY_POINT_GROUP):
            distribution = getattr(getattr(point, "dist", None), "name", None) or "an unknown distribution"
            origin = f"entry point of {distribution}"
            try:
                _check_name(point.name)
            except RegistryError as error:
                log.warning("ignoring transport %s (%s): %s", point.name, origin, error)
                continue
            if not _DOTTED.match(point.value):
                log.warning("ignoring transport %s (%s): %r is not 'module:Class'", point.name, origin, point.value)
                continue
            existing = _registry.get(point.name)
            if existing is not None:
                if existing.target != point.value:
                    log.warning("transport %r from %s is ignored: the name is taken by %s (%s)",
                                point.name, origin, existing.origin, existing.target)
                continue
            _registry[point.name] = RegistryEntry(point.name, point.value, origin)


def refresh_entry_points() -> None:
    """Scan the ``fieldsync.transports`` entry points again (after installing a plugin).

    Entries added by an earlier scan stay; names taken by built-ins or by
    ``register`` are never overridden by an entry point.
    """
    global _entry_points_scanned
    with _lock:
        _entry_points_scanned = False
        _scan_entry_points()


def register(name: str, cls_or_dotted_path: type[Transport] | str, replace: bool = False) -> None:
    """Register a transport class (or ``"module:Class"`` path, imported on first use).

    Raises TransportNameTaken if ``name`` is in use and ``replace`` is false.
    """
    _check_name(name)
    target = cls_or_dotted_path
    if isinstance(target, str):
        if not _DOTTED.match(target):
            raise RegistryError(f"transport {name!r}: {target!r} is not a dotted path like 'package.module:Class'")
    elif not (isinstance(target, type) and issubclass(target, Transport)):
        raise RegistryError(f"transport {name!r}: {target!r} is not a Transport subclass or a dotted path")
    with _lock:
        _scan_entry_points()
        existing = _registry.get(name)
        if existing is not None and not replace:
            raise TransportNameTaken(
                f"transport name {name!r} is taken by {existing.origin} ({_describe(existing.target)}); "
                "pass replace=True to replace it")
        _registry[name] = RegistryEntry(name, target, "register()")
        _loaded.pop(name, None)


def _describe(target: type | str) -> str:
    return target if isinstance(target, str) else f"{target.__module__}:{target.__qualname__}"


def _import(dotted: str) -> Any:
    module_name, _, attribute_path = dotted.partition(":")
    if not attribute_path:
        module_name, _, attribute_path = dotted.rpartition(".")
    value: Any = importlib.import_module(module_name)
    for attribute in attribute_path.split("."):
        value = getattr(value, attribute)
    return value


def get_transport_class(name: str) -> type[Transport]:
    """The class registered as ``name`` (a single name, not a ``wrapper+inner`` spec).

    Raises UnknownTransport, or TransportNotInstalled (with the install hint)
    if its module or a package it needs cannot be imported.
    """
    if isinstance(name, str) and "+" in name:
        raise RegistryError(f"{name!r} is a wrapped transport spec; use create_transport({name!r}, ...)")
    _check_name(name)
    with _lock:
        _scan_entry_points()
        cached = _loaded.get(name)
        if cached is not None:
            return cached
        entry = _registry.get(name)
        if entry is None:
            raise UnknownTransport(
                f"unknown transport {name!r}; available: {', '.join(sorted(_registry))}. "
                f"Third-party transports are installed as packages with a {ENTRY_POINT_GROUP!r} entry point")
        if isinstance(entry.target, str):
            try:
                cls = _import(entry.target)
            except ImportError as error:
                hint = f"; install what it needs with: {entry.install_hint}" if entry.install_hint else ""
                raise TransportNotInstalled(
                    f"transport {name!r} ({entry.origin}) cannot be loaded from {entry.target}: {error}{hint}"
                ) from error
            except AttributeError as error:
                raise RegistryError(
                    f"transport {name!r} ({entry.origin}): {entry.target} does not exist: {error}") from None
        else:
            cls = entry.target
        if not (isinstance(cls, type) and issubclass(cls, Transport)):
            raise RegistryError(
                f"transport {name!r} ({entry.origin}): {entry.target} is not a transports.base.Transport subclass")
        _loaded[name] = cls
        return cls


def available_transports() -> tuple[str, ...]:
    """Sorted names of every known transport, loadable or not (built-ins, registered, entry points)."""
    with _lock:
        _scan_entry_points()
        return tuple(sorted(_registry))


def _bind_options(cls: type[Transport], label: str, args: tuple[Any, ...], options: Mapping[str, Any]) -> None:
    signature = inspect.signature(cls)
    parameters = signature.parameters
    takes_any = any(parameter.kind is parameter.VAR_KEYWORD for parameter in parameters.values())
    known = [name for name, parameter in parameters.items()
             if parameter.kind in (parameter.KEYWORD_ONLY, parameter.POSITIONAL_OR_KEYWORD)][len(args):]
    unknown = [name for name in options if name not in known]
    if unknown and not takes_any:
        raise BadTransportOptions(f"transport {label!r} has no option {', '.join(map(repr, unknown))}; "
                                  f"its options: {', '.join(known) or 'none'}")
    try:
        signature.bind(*args, **options)
    except TypeError as error:
        raise BadTransportOptions(f"transport {label!r} does not accept these options: {error}") from None


def create_transport(spec: str, /, *, wrapper_options: Mapping[str, Mapping[str, Any]] | None = None,
                     **options: Any) -> Transport:
    """Build the transport ``spec`` names (``"folder"``, ``"faults+folder"``).

    ``options`` go to the inner transport; ``wrapper_options`` maps a
    wrapper's name to the options for that wrapper (``{"faults": {"seed": 7}}``).
    A value given as text (``timeout="90s"``, as a command line gives it) is
    read by the type of the parameter it goes to (transports.options).
    """
    parsed = parse_transport_spec(spec)
    wrapper_options = dict(wrapper_options or {})
    unused = set(wrapper_options) - set(parsed.wrappers)
    if unused:
        raise BadTransportOptions(f"wrapper_options for {sorted(unused)} but transport {spec!r} has no such wrapper")
    wrapper_classes, inner_cls = _classes(spec, parsed)
    _bind_options(inner_cls, parsed.inner, (), options)
    options = read_text_options(inner_cls, parsed.inner, options)
    for wrapper, cls in wrapper_classes:
        _bind_options(cls, wrapper, (None,), wrapper_options.get(wrapper, {}))
        wrapper_options[wrapper] = read_text_options(cls, wrapper, wrapper_options.get(wrapper, {}))
    transport: Transport = _build(parsed.inner, inner_cls, options)
    for wrapper, cls in reversed(wrapper_classes):
        transport = _build(wrapper, cls, wrapper_options[wrapper], transport)
    return transport


def _build(name: str, cls: type[Transport], options: Mapping[str, Any], *inner: Transport) -> Transport:
    """``cls(*inner, **options)``; a value the class refuses (its own check,
    or a plugin's ValueError/TypeError) is BadTransportOptions naming the
    transport."""
    try:
        return cls(*inner, **options)
    except TransportError as error:
        if not isinstance(error, BadTransportOptions) or str(error).startswith(f"{name}: "):
            raise
        raise BadTransportOptions(f"transport {name!r}: {error}") from None
    except (TypeError, ValueError) as error:
        raise BadTransportOptions(f"transport {name!r}: {error}") from None


def check_transport_spec(spec: str, /) -> TransportSpec:
    """Check that ``spec`` names transports that exist and fit together
    (wrappers around one transport), without building anything: for
    settings stored now and used later (a site's or a remote's transport).
    Raises what :func:`create_transport` raises for the name."""
    parsed = parse_transport_spec(spec)
    _classes(spec, parsed)
    return parsed


def _classes(spec: str, parsed: TransportSpec) -> tuple[list[tuple[str, type[Transport]]], type[Transport]]:
    wrapper_classes = []
    for wrapper in parsed.wrappers:
        try:
            cls = get_transport_class(wrapper)
        except TransportNotInstalled:
            raise
        except UnknownTransport:
            raise UnknownTransport(
                f"unknown transport wrapper {wrapper!r} in {spec!r}; available: "
                f"{', '.join(available_transports())}. Wrappers such as 'faults' are registered "
                "like any transport") from None
        if not cls.is_wrapper:
            raise RegistryError(f"transport {wrapper!r} in {spec!r} is not a wrapper, so it cannot wrap another")
        wrapper_classes.append((wrapper, cls))
    inner_cls = get_transport_class(parsed.inner)
    if inner_cls.is_wrapper:
        raise RegistryError(
            f"transport {parsed.inner!r} is a wrapper; name the transport it wraps, as in '{parsed.inner}+folder'")
    return wrapper_classes, inner_cls
