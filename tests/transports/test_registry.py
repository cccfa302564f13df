"""The transport registry: built-ins, register(), entry points, wrapper specs."""

from __future__ import annotations

import logging
import subprocess
import re
import sys
import textwrap
from importlib.metadata import EntryPoint
from importlib.metadata import entry_points as real_entry_points
from pathlib import Path
from types import MappingProxyType

import pytest

import transports.registry as registry_module
from transports import (
    BadTransportOptions,
    RegistryError,
    Transport,
    TransportError,
    TransportNameTaken,
    TransportNotInstalled,
    TransportWrapper,
    UnknownTransport,
    available_transports,
    create_transport,
    get_transport_class,
    check_transport_spec,
    parse_transport_spec,
    refresh_entry_points,
    register,
)
from transports.folder import FolderTransport
from transports.registry import ENTRY_POINT_GROUP, TransportSpec, registry

from .conformance import message_name, received

REPO_ROOT = Path(__file__).resolve().parents[2]


class DummyTransport(FolderTransport):
    """A third-party transport, as an entry point or register() would name it."""


class TapWrapper(TransportWrapper):
    """A wrapper that records what passes through it."""

    def __init__(self, inner: Transport, *, label: str = "tap") -> None:
        super().__init__(inner)
        self.label = label
        self.sent: list[str] = []

    async def _send(self, address: str, name: str, data: bytes) -> None:
        self.sent.append(name)
        await super()._send(address, name, data)


NOT_A_TRANSPORT = object()


@pytest.fixture(autouse=True)
def isolated_registry(monkeypatch):
    """Each test starts from the built-ins, with no third-party entry points."""
    saved_registry = dict(registry_module._registry)
    saved_loaded = dict(registry_module._loaded)
    monkeypatch.setattr(registry_module, "_entry_points_scanned", False)
    monkeypatch.setattr(registry_module, "entry_points", lambda group: [])
    yield
    registry_module._registry.clear()
    registry_module._registry.update(saved_registry)
    registry_module._loaded.clear()
    registry_module._loaded.update(saved_loaded)


def fake_entry_points(*points: EntryPoint):
    calls = []

    def entry_points(group):
        calls.append(group)
        return [point for point in points if point.group == group]

    entry_points.calls = calls
    return entry_points


# -- built-ins ---------------------------------------------------------------


def test_builtins_are_listed_by_dotted_path() -> None:
    assert {"folder", "sftp", "email"} <= set(available_transports())
    assert registry["folder"].target == "transports.folder:FolderTransport"
    assert registry["sftp"].install_hint == "pip install paramiko"
    assert registry["email"].install_hint == "pip install aiosmtplib aioimaplib"


def test_the_registry_view_is_read_only() -> None:
    assert isinstance(registry, MappingProxyType)
    with pytest.raises(TypeError):
        registry["mine"] = registry["folder"]  # type: ignore[index]


def test_builtins_are_imported_only_when_asked_for() -> None:
    script = textwrap.dedent("""
        import sys
        import transports
        from transports import available_transports, get_transport_class
        assert "folder" in available_transports()
        assert "transports.folder" not in sys.modules, "imported too early"
        cls = get_transport_class("folder")
        assert "transports.folder" in sys.modules and cls.__name__ == "FolderTransport"
    """)
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO_ROOT, capture_output=True, timeout=60)
    assert result.returncode == 0, result.stderr.decode()


def test_folder_is_found_and_built_with_options() -> None:
    assert get_transport_class("folder") is FolderTransport
    transport = create_transport("folder", min_age=5)
    assert isinstance(transport, FolderTransport) and transport.min_age == 5


@pytest.mark.parametrize("name, dependency, hint", [
    ("sftp", "paramiko", "pip install paramiko"),
    ("email", "aioimaplib", "pip install aiosmtplib aioimaplib"),
])
def test_a_builtin_whose_imports_fail_says_what_to_install(monkeypatch, name, dependency, hint) -> None:
    # Whether or not the plugin module exists yet, a missing dependency must
    # surface as TransportNotInstalled with the hint.
    monkeypatch.setitem(sys.modules, dependency, None)
    monkeypatch.delitem(sys.modules, f"transports.{name}", raising=False)
    # Forget a class an earlier test loaded, so this lookup imports afresh.
    monkeypatch.setattr(registry_module, "_loaded", {k: v for k, v in registry_module._loaded.items() if k != name})
    with pytest.raises(TransportNotInstalled) as caught:
        get_transport_class(name)
    assert isinstance(caught.value, UnknownTransport) and isinstance(caught.value, ImportError)
    message = str(caught.value)
    assert hint in message and repr(name) in message and "\n" not in message
    with pytest.raises(TransportNotInstalled):
        create_transport(name)


def test_an_unknown_name_lists_what_is_available() -> None:
    with pytest.raises(UnknownTransport) as caught:
        get_transport_class("carrier-pigeon")
    message = str(caught.value)
    assert "'carrier-pigeon'" in message and "email, faults, folder, sftp" in message and ENTRY_POINT_GROUP in message


@pytest.mark.parametrize("name", ["", "Folder", "fol der", "a.b", "9lives", "x" * 33, None])
def test_invalid_names_are_refused(name) -> None:
    with pytest.raises(RegistryError):
        get_transport_class(name)
    with pytest.raises(RegistryError):
        register(name, DummyTransport)


# -- register() ----------------------------------------------------------------


def test_register_a_class_and_a_dotted_path() -> None:
    register("dummy", DummyTransport)
    register("lazy-dummy", "tests.transports.test_registry:DummyTransport")
    assert get_transport_class("dummy") is DummyTransport
    assert get_transport_class("lazy-dummy") is DummyTransport
    assert registry["lazy-dummy"].origin == "register()"
    assert {"dummy", "lazy-dummy"} <= set(available_transports())


def test_register_a_taken_name_fails_unless_replacing() -> None:
    with pytest.raises(TransportNameTaken, match="replace=True"):
        register("folder", DummyTransport)
    assert get_transport_class("folder") is FolderTransport
    register("dummy", DummyTransport)
    with pytest.raises(TransportNameTaken):
        register("dummy", "tests.transports.test_registry:DummyTransport")
    register("folder", DummyTransport, replace=True)
    assert get_transport_class("folder") is DummyTransport


def test_replacing_drops_the_loaded_class() -> None:
    register("dummy", DummyTransport)
    assert get_transport_class("dummy") is DummyTransport
    register("dummy", FolderTransport, replace=True)
    assert get_transport_class("dummy") is FolderTransport


@pytest.mark.parametrize("target", [object, NOT_A_TRANSPORT, "not a path!", "", 42])
def test_register_refuses_what_is_not_a_transport(target) -> None:
    with pytest.raises(RegistryError):
        register("dummy", target)
    assert "dummy" not in registry


@pytest.mark.parametrize("target, problem", [
    ("tests.transports.test_registry:NoSuchClass", "does not exist"),
    ("tests.transports.test_registry:NOT_A_TRANSPORT", "not a transports.base.Transport subclass"),
])
def test_a_dotted_path_is_checked_when_first_used(target, problem) -> None:
    register("dummy", target)
    with pytest.raises(RegistryError, match=problem):
        get_transport_class("dummy")


def test_a_dotted_path_to_a_missing_module_is_not_installed() -> None:
    register("dummy", "fieldsync_no_such_module:Transport")
    with pytest.raises(TransportNotInstalled, match="fieldsync_no_such_module"):
        get_transport_class("dummy")


# -- entry points ----------------------------------------------------------------


def test_entry_points_add_transports_lazily(monkeypatch) -> None:
    points = fake_entry_points(
        EntryPoint("memory", "tests.transports.test_registry:DummyTransport", ENTRY_POINT_GROUP),
        EntryPoint("elsewhere", "tests.transports.test_registry:DummyTransport", "another.group"),
    )
    monkeypatch.setattr(registry_module, "entry_points", points)
    assert "memory" in available_transports()
    assert "elsewhere" not in available_transports()
    assert registry["memory"].origin.startswith("entry point")
    assert get_transport_class("memory") is DummyTransport
    assert points.calls == [ENTRY_POINT_GROUP]  # scanned once, on first use


def test_entry_points_never_override_builtins_or_registrations(monkeypatch, caplog) -> None:
    register("mine", DummyTransport)
    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points(
        EntryPoint("folder", "evil_plugin:Folder", ENTRY_POINT_GROUP),
        EntryPoint("mine", "evil_plugin:Mine", ENTRY_POINT_GROUP),
        EntryPoint("Bad Name", "evil_plugin:Bad", ENTRY_POINT_GROUP),
    ))
    with caplog.at_level(logging.WARNING, logger="transports.registry"):
        refresh_entry_points()
    assert get_transport_class("folder") is FolderTransport
    assert get_transport_class("mine") is DummyTransport
    assert "Bad Name" not in registry
    warnings = " ".join(record.getMessage() for record in caplog.records)
    assert "'folder'" in warnings and "'mine'" in warnings and "Bad Name" in warnings


def test_register_cannot_silently_take_an_entry_point_name(monkeypatch) -> None:
    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points(
        EntryPoint("memory", "tests.transports.test_registry:DummyTransport", ENTRY_POINT_GROUP)))
    with pytest.raises(TransportNameTaken, match="entry point"):
        register("memory", FolderTransport)


def test_a_broken_entry_point_fails_only_when_used(monkeypatch) -> None:
    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points(
        EntryPoint("broken", "fieldsync_no_such_plugin:Transport", ENTRY_POINT_GROUP)))
    assert "broken" in available_transports()
    assert get_transport_class("folder") is FolderTransport
    with pytest.raises(TransportNotInstalled, match="fieldsync_no_such_plugin"):
        get_transport_class("broken")


def test_refresh_finds_a_plugin_installed_later(monkeypatch) -> None:
    assert "late" not in available_transports()
    monkeypatch.setattr(registry_module, "entry_points", fake_entry_points(
        EntryPoint("late", "tests.transports.test_registry:DummyTransport", ENTRY_POINT_GROUP)))
    assert "late" not in available_transports()  # the scan is cached
    refresh_entry_points()
    assert get_transport_class("late") is DummyTransport


async def test_an_installed_distribution_is_found_through_its_entry_point(monkeypatch, tmp_path: Path) -> None:
    """End to end with importlib.metadata: a package with a pyproject entry point."""
    site = tmp_path / "site-packages"
    dist_info = site / "fieldsync_demo_transport-1.0.dist-info"
    dist_info.mkdir(parents=True)
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: fieldsync-demo-transport\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        f"[{ENTRY_POINT_GROUP}]\ndemo = fieldsync_demo_transport:DemoTransport\n")
    (site / "fieldsync_demo_transport.py").write_text(
        "from transports.folder import FolderTransport\n\n"
        "class DemoTransport(FolderTransport):\n    pass\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(registry_module, "entry_points", real_entry_points)
    try:
        assert "demo" in available_transports()
        assert registry["demo"].origin == "entry point of fieldsync-demo-transport"
        inbox = tmp_path / "inbox"
        inbox.mkdir()
        async with create_transport("demo") as transport:
            assert type(transport).__name__ == "DemoTransport"
            await transport.send(str(inbox), message_name(1), b"via plugin")
            assert await received(transport, str(inbox)) == {message_name(1): b"via plugin"}
    finally:
        sys.modules.pop("fieldsync_demo_transport", None)


# -- wrapper specs -------------------------------------------------------------------


@pytest.mark.parametrize("spec, parsed", [
    ("folder", TransportSpec((), "folder")),
    ("faults+folder", TransportSpec(("faults",), "folder")),
    ("faults+tap+sftp", TransportSpec(("faults", "tap"), "sftp")),
])
def test_specs_parse(spec, parsed) -> None:
    assert parse_transport_spec(spec) == parsed
    assert str(parsed) == spec


@pytest.mark.parametrize("spec", ["", "+folder", "faults+", "faults++folder", "Faults+folder",
                                  "faults+fol der", "faults+folder/x", None])
def test_malformed_specs_are_refused(spec) -> None:
    with pytest.raises(RegistryError):
        parse_transport_spec(spec)
    with pytest.raises(RegistryError):
        create_transport(spec)


@pytest.mark.parametrize("spec, problem", [
    ("nosuch", "unknown transport 'nosuch'"),
    ("faults+nosuch", "unknown transport 'nosuch'"),
    ("nosuch+folder", "unknown transport wrapper 'nosuch'"),
    ("folder+folder", "'folder' in 'folder+folder' is not a wrapper"),
    ("faults", "'faults' is a wrapper; name the transport it wraps"),
    ("faults+", "empty part"),
])
def test_check_transport_spec_refuses_what_create_would_without_building(spec, problem) -> None:
    with pytest.raises(RegistryError, match=re.escape(problem)):
        check_transport_spec(spec)
    with pytest.raises(RegistryError, match=re.escape(problem)):
        create_transport(spec)
    assert check_transport_spec("faults+folder") == TransportSpec(("faults",), "folder")


def test_an_unknown_wrapper_is_a_clear_error() -> None:
    with pytest.raises(UnknownTransport) as caught:
        create_transport("jitter+folder")
    assert "wrapper 'jitter'" in str(caught.value) and "'jitter+folder'" in str(caught.value)


def test_the_faults_wrapper_is_built_in() -> None:
    transport = create_transport("faults+folder", wrapper_options={"faults": {"seed": 3, "drop": 0.5}})
    assert type(transport).__name__ == "FaultsTransport" and transport.rates.drop == 0.5
    assert type(transport.inner).__name__ == "FolderTransport"


def test_an_unknown_inner_transport_is_a_clear_error() -> None:
    register("tap", TapWrapper)
    with pytest.raises(UnknownTransport, match="'carrier-pigeon'"):
        create_transport("tap+carrier-pigeon")


def test_get_transport_class_points_a_spec_to_create_transport() -> None:
    with pytest.raises(RegistryError, match="create_transport"):
        get_transport_class("faults+folder")


async def test_a_registered_wrapper_wraps_the_inner_transport(tmp_path: Path) -> None:
    register("tap", TapWrapper)
    transport = create_transport("tap+folder", wrapper_options={"tap": {"label": "outer"}}, min_age=0)
    assert isinstance(transport, TapWrapper) and transport.label == "outer"
    assert isinstance(transport.inner, FolderTransport)
    async with transport:
        await transport.send(str(tmp_path), message_name(1), b"wrapped")
        assert await received(transport, str(tmp_path)) == {message_name(1): b"wrapped"}
    assert transport.sent == [message_name(1)]
    assert transport.inner.closed


def test_wrappers_nest_outermost_first() -> None:
    register("tap", TapWrapper)
    transport = create_transport("tap+tap+folder")
    assert isinstance(transport, TapWrapper) and isinstance(transport.inner, TapWrapper)
    assert isinstance(transport.inner.inner, FolderTransport)


def test_only_wrappers_wrap_and_wrappers_need_an_inner_transport() -> None:
    register("tap", TapWrapper)
    with pytest.raises(RegistryError, match="not a wrapper"):
        create_transport("folder+folder")
    with pytest.raises(RegistryError, match="is a wrapper"):
        create_transport("tap")


def test_options_are_checked_before_anything_is_built() -> None:
    register("tap", TapWrapper)
    with pytest.raises(BadTransportOptions, match="bogus"):
        create_transport("folder", bogus=1)
    with pytest.raises(BadTransportOptions, match="colour"):
        create_transport("tap+folder", wrapper_options={"tap": {"colour": "red"}})
    with pytest.raises(BadTransportOptions, match="faults"):
        create_transport("tap+folder", wrapper_options={"faults": {}})


def test_every_registry_error_is_a_transport_error() -> None:
    for error in (RegistryError, UnknownTransport, TransportNotInstalled, TransportNameTaken, BadTransportOptions):
        assert issubclass(error, TransportError) and not error.retryable


# -- values a transport refuses ------------------------------------------------------


class PickyTransport(FolderTransport):
    """A plugin whose constructor checks a value with a plain ValueError."""

    def __init__(self, *, colour: str = "red") -> None:
        if colour not in ("red", "blue"):
            raise ValueError(f"colour must be red or blue, got {colour!r}")
        super().__init__()


@pytest.mark.parametrize(("spec", "options", "says"), [
    ("folder", {"min_age": -1}, "transport 'folder': min_age must be a number of seconds >= 0, got -1"),
    ("folder", {"max_file_size": 9999}, "transport 'folder': max_file_size must be a byte count of at least 10000"),
    ("sftp", {"channels": 99}, "transport 'sftp': channels must be 1..32, got 99"),
    ("email", {"smtp_tls": "bogus"}, "transport 'email': smtp_tls must be one of starttls, tls, none, got 'bogus'"),
    ("email", {"password_file": "p", "password_env": "P"},
     "transport 'email': give password_file or password_env, not both"),
    ("picky", {"colour": "green"}, "transport 'picky': colour must be red or blue, got 'green'"),
    ("faults+folder", {"drop": 2}, "faults: rate drop must be between 0 and 1, got 2"),
    ("faults+folder", {"rates": {"drop": 2}}, "faults: rate drop must be between 0 and 1, got 2"),
    ("faults+folder", {"rates": {"lose": 0.1}}, "faults: rates must have keys among drop, corrupt"),
    ("faults+folder", {"rates": 0.1}, "faults: rates must be FaultRates or a mapping of rates, got 0.1"),
])
def test_a_value_a_transport_refuses_is_bad_transport_options(spec, options, says) -> None:
    """Only TransportErrors leave the package: a constructor's own check
    (or a plugin's ValueError) names the transport, once."""
    register("picky", PickyTransport)
    wrappers = {"faults": options} if spec.startswith("faults") else None
    with pytest.raises(BadTransportOptions) as caught:
        create_transport(spec, wrapper_options=wrappers, **({} if wrappers else options))
    assert str(caught.value).startswith(says), str(caught.value)
    assert isinstance(caught.value, TransportError) and isinstance(caught.value, ValueError)


def test_fault_rates_may_be_given_as_a_mapping() -> None:
    transport = create_transport("faults+folder", wrapper_options={"faults": {"rates": {"drop": 0.25}}})
    assert transport.rates.drop == 0.25 and transport.rates.corrupt == 0.0  # type: ignore[attr-defined]
