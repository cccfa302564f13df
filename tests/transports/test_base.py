"""The Transport base class: checks every transport gets, closing, wrappers."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest

from codec.names import MessageName
from transports import (
    BadAddress,
    Incoming,
    InvalidMessageName,
    RegistryError,
    Transport,
    TransportClosed,
    TransportError,
    TransportRefused,
    TransportUnavailable,
    TransportWrapper,
    check_message_name,
)
from transports.folder import FolderTransport

from . import test_folder
from .conformance import message_name


class RecordingTransport(Transport):
    """Records which hooks ran; the graceful close can be made to hang or fail."""

    close_timeout = 0.05

    def __init__(self, *, close_behaviour: str = "ok") -> None:
        super().__init__()
        self.calls: list[tuple] = []
        self.close_behaviour = close_behaviour

    async def _send(self, address: str, name: str, data: bytes) -> None:
        self.calls.append(("send", address, name, data))

    async def _receive(self, address: str, wanted) -> AsyncIterator[Incoming]:
        self.calls.append(("receive", address))
        yield Incoming(message_name(1), b"x", token=1)

    async def _ack(self, incoming: Incoming) -> None:
        self.calls.append(("ack", incoming.name))

    async def _aclose(self) -> None:
        self.calls.append(("aclose",))
        if self.close_behaviour == "hang":
            await asyncio.sleep(3600)
        if self.close_behaviour == "fail":
            raise TransportUnavailable("goodbye failed")

    def _release(self) -> None:
        self.calls.append(("release",))


class TestPassThroughWrapperConformance(test_folder.TestFolderConformance):
    """A wrapper that changes nothing must pass the whole suite (faults with no faults)."""

    @pytest.fixture
    def make_transport(self):
        return lambda: TransportWrapper(FolderTransport())


# -- Incoming and names --------------------------------------------------------------


def test_incoming_checks_its_fields() -> None:
    with pytest.raises(TypeError):
        Incoming(b"name", b"x", None)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        Incoming("name", "text", None)  # type: ignore[arg-type]
    incoming = Incoming("name", b"s" * 10_000, token=None)
    assert repr(incoming) == "Incoming(name='name', size=10000)"


def test_check_message_name() -> None:
    assert check_message_name(message_name(7)) == MessageName.parse(message_name(7))
    with pytest.raises(InvalidMessageName, match="refusing to send") as caught:
        check_message_name("../../etc/passwd")
    assert isinstance(caught.value, ValueError) and isinstance(caught.value, TransportError)


def test_the_error_tree() -> None:
    for error in (TransportUnavailable, TransportRefused, BadAddress, InvalidMessageName, TransportClosed,
                  RegistryError):
        assert issubclass(error, TransportError)
    assert TransportUnavailable.retryable
    assert not TransportRefused.retryable and not BadAddress.retryable


def test_a_transport_must_implement_the_hooks() -> None:
    class Incomplete(Transport):
        async def _send(self, address, name, data):
            pass

    with pytest.raises(TypeError):
        Incomplete()  # type: ignore[abstract]


# -- what the public methods check ------------------------------------------------------


async def test_hooks_see_only_checked_names_and_addresses() -> None:
    transport = RecordingTransport()
    with pytest.raises(InvalidMessageName):
        await transport.send("inbox", "x/y.fsm", b"data")
    with pytest.raises(BadAddress):
        await transport.send("", message_name(1), b"data")
    with pytest.raises(TypeError):
        await transport.send("inbox", message_name(1), "text")  # type: ignore[arg-type]
    assert transport.calls == []
    await transport.send("inbox", message_name(1), bytearray(b"data"))
    assert transport.calls == [("send", "inbox", message_name(1), b"data")]
    assert type(transport.calls[0][3]) is bytes


async def test_receive_and_ack_reach_the_hooks() -> None:
    async with RecordingTransport() as transport:
        got = [incoming async for incoming in transport.receive("inbox")]
        await transport.ack(got[0])
        assert transport.calls == [("receive", "inbox"), ("ack", message_name(1))]


async def test_default_wait_incoming_sleeps_for_the_timeout() -> None:
    async with RecordingTransport() as transport:
        started = time.monotonic()
        await transport.wait_incoming("inbox", 0.1)
        assert time.monotonic() - started >= 0.09
        with pytest.raises(ValueError):
            await transport.wait_incoming("inbox", float("nan"))
        with pytest.raises(BadAddress):
            await transport.wait_incoming("", 0)


# -- closing ---------------------------------------------------------------------------


async def test_aclose_runs_the_hooks_once() -> None:
    transport = RecordingTransport()
    await transport.aclose()
    await transport.aclose()
    assert transport.calls == [("aclose",), ("release",)]
    with pytest.raises(TransportClosed):
        await transport.wait_incoming("inbox", 0)


async def test_a_hanging_graceful_close_is_bounded_and_still_releases(caplog) -> None:
    transport = RecordingTransport(close_behaviour="hang")
    with caplog.at_level(logging.WARNING, logger="transports.base"):
        async with asyncio.timeout(5):
            await transport.aclose()
    assert transport.calls == [("aclose",), ("release",)]
    assert "closing anyway" in caplog.text


async def test_a_failing_graceful_close_still_releases() -> None:
    transport = RecordingTransport(close_behaviour="fail")
    with pytest.raises(TransportUnavailable):
        await transport.aclose()
    assert transport.calls == [("aclose",), ("release",)] and transport.closed


async def test_a_cancelled_close_releases_and_propagates_the_cancellation() -> None:
    transport = RecordingTransport(close_behaviour="hang")
    transport.close_timeout = 60
    task = asyncio.create_task(transport.aclose())
    await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert transport.calls == [("aclose",), ("release",)]


# -- wrappers ---------------------------------------------------------------------------


def test_a_wrapper_needs_a_transport() -> None:
    with pytest.raises(TypeError):
        TransportWrapper("folder")  # type: ignore[arg-type]


async def test_closing_a_wrapper_closes_the_inner_transport() -> None:
    inner = RecordingTransport()
    async with TransportWrapper(inner) as wrapper:
        await wrapper.send("inbox", message_name(1), b"x")
    assert inner.closed and inner.calls[-2:] == [("aclose",), ("release",)]
