"""Transport options given as text are read by the type of their parameter
(transports/options.py; docs/transports.md, "Options as text")."""

from __future__ import annotations

import enum
import os
from pathlib import Path
from typing import TYPE_CHECKING, Literal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from transports import Transport, create_transport, register
from transports.errors import BadTransportOptions
from transports.options import (
    ByteCount,
    FileMode,
    Seconds,
    parse_byte_count,
    parse_file_mode,
    parse_seconds,
    read_text_options,
)

if TYPE_CHECKING:  # as plugins do: a name only type checkers see
    from ssl import SSLContext


class Plugin(Transport):
    """A third-party transport's constructor, as a plugin would write it."""

    def __init__(self, *, host: str = "localhost", port: int = 22, verify: bool = True, ratio: float = 0.5,
                 timeout: Seconds = 30.0, limit: ByteCount | None = None, mode: FileMode | None = None,
                 cert: str | os.PathLike[str] | None = None, points: tuple[int, ...] = ()) -> None:
        super().__init__()
        self.settings = dict(host=host, port=port, verify=verify, ratio=ratio, timeout=timeout, limit=limit,
                             mode=mode, cert=cert, points=points)

    async def _send(self, address, name, data): ...
    async def _receive(self, address, wanted):
        return
        yield

    async def _ack(self, incoming): ...


@pytest.mark.parametrize(("text", "seconds"), [
    ("90", 90.0), ("1.5", 1.5), ("90s", 90.0), ("250ms", 0.25), ("5m", 300.0), ("1h", 3600.0),
    ("1h30m", 5400.0), (" 2M ", 120.0), (".5s", 0.5), ("1e3", 1000.0), ("1 m 30 s", 90.0)])
def test_seconds(text, seconds):
    assert parse_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "s", "1x", "1m1h5", "1s1s", "inf", "nan", "1e400", "9" * 400, "-5", "5 m 3", "5 m s", "1 0", "30s30m", "1m1h",
                                  "1_0", "1e3s"])
def test_not_seconds(text):
    with pytest.raises(ValueError):
        parse_seconds(text)


@pytest.mark.parametrize(("text", "size"), [
    ("50000", 50000), ("48k", 48 << 10), ("64m", 64 << 20), ("1g", 1 << 30), ("64MiB", 64 << 20), ("2kb", 2048),
    ("64b", 64)])
def test_byte_counts(text, size):
    assert parse_byte_count(text) == size


@pytest.mark.parametrize("text", ["", "k", "1.5m", "-1", "1t", "64 mb x", "64ib", "1_000", "\u0661"])
def test_not_byte_counts(text):
    with pytest.raises(ValueError):
        parse_byte_count(text)


@pytest.mark.parametrize(("text", "mode"), [("640", 0o640), ("0640", 0o640), ("0o600", 0o600), ("7", 0o7)])
def test_file_modes_are_octal(text, mode):
    assert parse_file_mode(text) == mode


@pytest.mark.parametrize("text", ["", "0o", "968", "rw-r--r--", "0x1ff"])
def test_not_file_modes(text):
    with pytest.raises(ValueError):
        parse_file_mode(text)


@given(st.integers(min_value=0, max_value=0o777))
def test_a_mode_written_as_chmod_writes_it_reads_back(mode):
    assert parse_file_mode(f"{mode:o}") == parse_file_mode(f"0o{mode:o}") == mode


def test_each_text_is_read_by_its_parameters_annotation():
    read = read_text_options(Plugin, "plugin", {
        "host": "1001", "port": "2222", "verify": "off", "ratio": "0.25", "timeout": "2m", "limit": "1m",
        "mode": "600", "cert": "123"})
    assert read == {"host": "1001", "port": 2222, "verify": False, "ratio": 0.25, "timeout": 120.0,
                    "limit": 1 << 20, "mode": 0o600, "cert": "123"}
    # Values that are not text are a program's, passed on as they are.
    assert read_text_options(Plugin, "plugin", {"port": 7, "verify": True}) == {"port": 7, "verify": True}
    # Names the class does not take are left for the caller to refuse.
    assert read_text_options(Plugin, "plugin", {"nosuch": "1"}) == {"nosuch": "1"}


@pytest.mark.parametrize(("option", "line"), [
    ("port=22.5", "transport 'plugin': port='22.5' is not a whole number"),
    ("verify=maybe", "transport 'plugin': verify='maybe' is not true or false"),
    ("ratio=inf", "transport 'plugin': ratio='inf' is not a finite number"),
    ("ratio=nan", "transport 'plugin': ratio='nan' is not a finite number"),
    ("timeout=soon", "transport 'plugin': timeout='soon' is not a number of seconds such as 30, 90s, 5m or 1h"),
    ("timeout=\u0663\u0660", "transport 'plugin': timeout='\u0663\u0660' is not a number of seconds such as 30, 90s, "
                             "5m or 1h"),
    ("ratio=\uff10.5", "transport 'plugin': ratio='\uff10.5' is not a finite number"),
    ("limit=lots", "transport 'plugin': limit='lots' is not a byte count such as 50000, 48k, 64m or 1g"),
    ("mode=777x", "transport 'plugin': mode='777x' is not permission bits in octal such as 640 or 0o640"),
    ("points=1,2", "transport 'plugin': option points cannot be given as text (got points='1,2')"),
    ("host=a\nb", "transport 'plugin': host='a\\nb' has a control character"),
])
def test_a_text_that_does_not_read_is_one_line(option, line):
    name, _, text = option.partition("=")
    with pytest.raises(BadTransportOptions) as caught:
        read_text_options(Plugin, "plugin", {name: text})
    assert str(caught.value) == line


@pytest.fixture
def plugin_registered(monkeypatch):
    import transports.registry as registry_module
    monkeypatch.setattr(registry_module, "_registry", dict(registry_module._registry))
    monkeypatch.setattr(registry_module, "_loaded", dict(registry_module._loaded))
    register("textplugin", Plugin)


def test_create_transport_reads_texts_for_the_transport_and_its_wrappers(plugin_registered):
    transport = create_transport("textplugin", port="2022", timeout="1h")
    assert (transport.settings["port"], transport.settings["timeout"]) == (2022, 3600.0)
    wrapped = create_transport("faults+folder", wrapper_options={"faults": {"seed": "7", "drop": "0.5"}},
                               min_age="2s", file_mode="0o600", max_file_size="16k")
    assert (wrapped.seed, wrapped.rates.drop) == (7, 0.5)
    assert (wrapped.inner.min_age, wrapped.inner.file_mode, wrapped.inner.max_file_size) == (2.0, 0o600, 16384)
    with pytest.raises(BadTransportOptions, match=r"^transport 'textplugin' has no option 'prot'; its options: "
                                                  r"host, port, verify"):
        create_transport("textplugin", prot="22")


class Level(enum.Enum):
    LOW = 1
    HIGH = 2


class Loose(Transport):
    """A plugin with unannotated, unresolvable, path, literal, enum and
    union parameters and a ``**options`` catch-all."""

    def __init__(self, *, plain=None, context: SSLContext | None = None, port: int = 22, cert: Path | None = None,
                 mode: Literal["fast", "safe"] = "safe", level: Level = Level.LOW, ratio: int | float = 1,
                 **more: float) -> None:
        super().__init__()
        self.settings = dict(plain=plain, context=context, port=port, cert=cert, mode=mode, level=level,
                             ratio=ratio, **more)

    async def _send(self, address, name, data): ...
    async def _receive(self, address, wanted):
        return
        yield

    async def _ack(self, incoming): ...


def test_what_an_annotation_does_not_say_is_read_as_it_looks():
    """An annotation its module cannot resolve spoils no other parameter."""
    read = read_text_options(Loose, "loose", {
        "plain": "false", "context": "7", "port": "2022", "cert": "/etc/x.pem", "mode": "fast", "level": "HIGH",
        "ratio": "1.5", "extra": "0.25"})
    assert read == {"plain": False, "context": 7, "port": 2022, "cert": Path("/etc/x.pem"), "mode": "fast",
                    "level": Level.HIGH, "ratio": 1.5, "extra": 0.25}
    again = read_text_options(Loose, "loose", {"plain": "1001x", "level": "2", "ratio": "2"})
    assert again == {"plain": "1001x", "level": Level.HIGH, "ratio": 2}
    assert type(again["ratio"]) is int


@pytest.mark.parametrize(("name", "text", "line"), [
    ("mode", "quick", "transport 'loose': mode='quick' is not one of fast, safe"),
    ("level", "MEDIUM", "transport 'loose': level='MEDIUM' is not one of 1, 2"),
    ("ratio", "lots", "transport 'loose': ratio='lots' is not a whole number or a finite number"),
    ("extra", "x", "transport 'loose': extra='x' is not a finite number"),
    ("extra", "a\u2028b", "transport 'loose': extra='a\\u2028b' has a control character"),
    ("other", "a\x85b", "transport 'loose': other='a\\x85b' has a control character"),
])
def test_a_loose_text_that_does_not_read_is_one_line(name, text, line):
    with pytest.raises(BadTransportOptions) as caught:
        read_text_options(Loose, "loose", {name: text})
    assert str(caught.value) == line
