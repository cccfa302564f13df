"""The behaviour every transport must have, as one reusable test class.

A transport's test module subclasses ``TransportConformance`` once and
provides the fixtures and hooks below; every test here then runs against it
(the idea of fsspec's ``tests/abstract``)::

    class TestFolderConformance(TransportConformance):
        @pytest.fixture
        def make_transport(self): ...          # () -> a new, unopened Transport
        @pytest.fixture
        def inbox(self): ...                   # a fresh, empty inbox address
        @pytest.fixture
        def peer_inbox(self): ...              # a second fresh inbox address
        async def place_raw_file(self, address, name, data): ...
        async def leave_interrupted_send(self, address, name, data): ...
        def send_address(self, inbox): ...     # optional: where to send so that
                                               # receive(inbox) sees it (default: inbox)

``make_transport`` may be called several times in one test: each call stands
for the agent after a restart, sharing the same backing store.
"""

from __future__ import annotations

import asyncio
import dataclasses
import random
from collections.abc import AsyncIterator, Callable

import pytest

from codec.header import Header
from codec.names import Kind, MessageName
from transports import Incoming, InvalidMessageName, Transport, TransportClosed


def message_name(last: int, *, sender: str = "hq", recipient: str = "field1", resend_count: int = 0,
                 prev: int | None = None, seq: int = 0) -> str:
    """A valid data message file name."""
    header = Header(resend_count, last - 1 if prev is None else prev, last, seq)
    return str(MessageName(sender, recipient, Kind.DATA, header))


def control_name(digest: str, *, sender: str = "hq", recipient: str = "field1") -> str:
    return str(MessageName(sender, recipient, Kind.CONTROL, Header(0, 0, 0, 0), digest))


async def receive_all(transport: Transport, address: str) -> list[Incoming]:
    return [incoming async for incoming in transport.receive(address)]


async def received(transport: Transport, address: str) -> dict[str, bytes]:
    return {incoming.name: incoming.data for incoming in await receive_all(transport, address)}


def record_reads(monkeypatch: pytest.MonkeyPatch, transport: Transport, method: str,
                 name_of: Callable[..., str]) -> list[str]:
    """Record the name of every file ``transport`` reads through its
    ``method`` (its own read of one file, sync or async); return the list."""
    reads: list[str] = []
    real = getattr(transport, method)

    def reading(*args: object) -> object:
        reads.append(name_of(*args))
        return real(*args)

    monkeypatch.setattr(transport, method, reading)
    return reads


async def receive_wanted(transport: Transport, address: str, wanted: str) -> list[str]:
    """The names ``receive`` yields when only ``wanted`` is wanted."""
    return [incoming.name async for incoming in transport.receive(address, wanted=lambda name: name == wanted)]


INVALID_NAMES = [
    "",
    "notes.txt",
    "../hq.field1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "sub/hq.field1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    ".hq.field1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "hq.field1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm/",
    "hq.field1.d.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm\x00",
    "hq.field1.d.0000000000-0000000000000000002-0000000000000000001-0000000000.fsm",  # prev > last
    "hq.field1.x.0000000000-0000000000000000000-0000000000000000001-0000000000.fsm",
    "..",
    "/etc/passwd",
]


class TransportConformance:
    """Subclass once per transport; see the module docstring for what to provide."""

    # -- what a subclass provides --------------------------------------------

    @pytest.fixture
    def make_transport(self) -> Callable[[], Transport]:
        raise NotImplementedError("a conformance subclass provides the make_transport fixture")

    @pytest.fixture
    def inbox(self) -> str:
        raise NotImplementedError("a conformance subclass provides the inbox fixture")

    @pytest.fixture
    def peer_inbox(self) -> str:
        raise NotImplementedError("a conformance subclass provides the peer_inbox fixture")

    async def place_raw_file(self, address: str, name: str, data: bytes) -> None:
        """Put a file in the inbox behind the transport's back (any name)."""
        raise NotImplementedError

    async def leave_interrupted_send(self, address: str, name: str, data: bytes) -> None:
        """Leave exactly what a sender killed in the middle of sending leaves."""
        raise NotImplementedError

    def send_address(self, inbox: str) -> str:
        """The address ``send`` delivers to so that ``receive(inbox)`` sees the file.

        The same address for most transports; email sends to ``mailto:`` the
        mailbox that ``receive`` reads through an ``imaps://`` URL.
        """
        return inbox

    # -- shared fixtures -----------------------------------------------------

    @pytest.fixture
    async def transport(self, make_transport: Callable[[], Transport]) -> AsyncIterator[Transport]:
        async with make_transport() as transport:
            yield transport

    # -- send and receive ----------------------------------------------------

    async def test_send_then_receive_yields_the_bytes_once(self, transport: Transport, inbox: str) -> None:
        name = message_name(10)
        data = b"\x00fieldsync\xff" * 100
        await transport.send(self.send_address(inbox), name, data)
        got = await receive_all(transport, inbox)
        assert [(incoming.name, incoming.data) for incoming in got] == [(name, data)]

    async def test_incoming_is_frozen(self, transport: Transport, inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), b"x")
        [incoming] = await receive_all(transport, inbox)
        with pytest.raises(dataclasses.FrozenInstanceError):
            incoming.data = b"y"  # type: ignore[misc]
        assert "size=1" in repr(incoming)

    async def test_empty_file_round_trips(self, transport: Transport, inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), b"")
        assert await received(transport, inbox) == {message_name(1): b""}

    async def test_bytes_like_data_is_sent_as_bytes(self, transport: Transport, inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), bytearray(b"abc"))
        await transport.send(self.send_address(inbox), message_name(2), memoryview(b"def"))
        assert await received(transport, inbox) == {message_name(1): b"abc", message_name(2): b"def"}

    async def test_empty_inbox_yields_nothing(self, transport: Transport, inbox: str) -> None:
        assert await receive_all(transport, inbox) == []

    async def test_inboxes_are_separate(self, transport: Transport, inbox: str, peer_inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), b"mine")
        await transport.send(self.send_address(peer_inbox), message_name(1, sender="field1", recipient="hq"), b"theirs")
        assert await received(transport, inbox) == {message_name(1): b"mine"}
        assert await received(transport, peer_inbox) == {message_name(1, sender="field1", recipient="hq"): b"theirs"}

    async def test_receive_removes_nothing(self, transport: Transport, inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), b"one")
        await transport.send(self.send_address(inbox), message_name(2), b"two")
        first = await received(transport, inbox)
        second = await received(transport, inbox)
        assert first == second == {message_name(1): b"one", message_name(2): b"two"}

    async def test_unacked_file_is_received_again_after_restart(
            self, make_transport: Callable[[], Transport], inbox: str) -> None:
        async with make_transport() as before_crash:
            await before_crash.send(self.send_address(inbox), message_name(5), b"payload")
            assert await received(before_crash, inbox) == {message_name(5): b"payload"}
            # The agent stops here, before storing and acking.
        async with make_transport() as after_restart:
            assert await received(after_restart, inbox) == {message_name(5): b"payload"}

    async def test_many_files_come_back_in_name_order(self, transport: Transport, inbox: str) -> None:
        names = [message_name(last, prev=last - 1) for last in (1, 2, 9, 10, 11, 99, 100, 1000, 10**12)]
        names += [message_name(10**12, resend_count=1, prev=5), message_name(7, seq=3, prev=7)]
        names += [control_name(f"{i:016x}") for i in (0, 255, 2**63)]
        names += [message_name(3, sender="field2", recipient="hq")]
        shuffled = names[:]
        random.Random(4).shuffle(shuffled)
        for index, name in enumerate(shuffled):
            await transport.send(self.send_address(inbox), name, f"file {index}".encode())
        got = await receive_all(transport, inbox)
        assert [incoming.name for incoming in got] == sorted(names)
        assert {incoming.name: incoming.data for incoming in got} == {
            name: f"file {index}".encode() for index, name in enumerate(shuffled)}

    async def test_large_file_round_trips(self, transport: Transport, inbox: str) -> None:
        data = random.Random(5).randbytes(5 * 1024 * 1024)
        await transport.send(self.send_address(inbox), message_name(1), data)
        [incoming] = await receive_all(transport, inbox)
        assert incoming.data == data

    # -- idempotent send -----------------------------------------------------

    async def test_same_name_sent_twice_leaves_one_file_with_the_latest_bytes(
            self, transport: Transport, inbox: str) -> None:
        name = message_name(3)
        await transport.send(self.send_address(inbox), name, b"first")
        await transport.send(self.send_address(inbox), name, b"second")
        got = await receive_all(transport, inbox)
        assert [(incoming.name, incoming.data) for incoming in got] == [(name, b"second")]

    async def test_concurrent_sends_of_distinct_names(self, transport: Transport, inbox: str) -> None:
        expected = {message_name(last): random.Random(last).randbytes(20_000 + last) for last in range(1, 41)}
        await asyncio.gather(*(transport.send(self.send_address(inbox), name, data) for name, data in expected.items()))
        got = await receive_all(transport, inbox)
        assert [incoming.name for incoming in got] == sorted(expected)
        assert {incoming.name: incoming.data for incoming in got} == expected

    async def test_concurrent_sends_of_one_name_leave_one_whole_copy(self, transport: Transport, inbox: str) -> None:
        name = message_name(8)
        payloads = [bytes([writer]) * 300_000 for writer in range(12)]
        await asyncio.gather(*(transport.send(self.send_address(inbox), name, data) for data in payloads))
        got = await receive_all(transport, inbox)
        assert len(got) == 1 and got[0].name == name
        assert got[0].data in payloads

    # -- ack -----------------------------------------------------------------

    async def test_ack_removes_only_that_file(self, transport: Transport, inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), b"one")
        await transport.send(self.send_address(inbox), message_name(2), b"two")
        first, _second = await receive_all(transport, inbox)
        await transport.ack(first)
        assert await received(transport, inbox) == {message_name(2): b"two"}

    async def test_ack_twice_is_not_an_error(self, transport: Transport, inbox: str) -> None:
        await transport.send(self.send_address(inbox), message_name(1), b"one")
        [incoming] = await receive_all(transport, inbox)
        await transport.ack(incoming)
        await transport.ack(incoming)
        assert await receive_all(transport, inbox) == []

    async def test_ack_of_a_file_another_instance_removed_is_not_an_error(
            self, make_transport: Callable[[], Transport], inbox: str) -> None:
        async with make_transport() as first, make_transport() as second:
            await first.send(self.send_address(inbox), message_name(1), b"one")
            [seen_by_first] = await receive_all(first, inbox)
            [seen_by_second] = await receive_all(second, inbox)
            await second.ack(seen_by_second)
            await first.ack(seen_by_first)
            assert await receive_all(first, inbox) == []

    async def test_ack_while_iterating_does_not_disturb_the_iteration(self, transport: Transport, inbox: str) -> None:
        names = [message_name(last) for last in range(1, 6)]
        for name in names:
            await transport.send(self.send_address(inbox), name, name.encode())
        seen = []
        async for incoming in transport.receive(inbox):
            assert incoming.data == incoming.name.encode()
            seen.append(incoming.name)
            await transport.ack(incoming)
        assert seen == names
        assert await receive_all(transport, inbox) == []

    async def test_ack_refuses_what_is_not_an_incoming(self, transport: Transport) -> None:
        with pytest.raises(TypeError):
            await transport.ack("hq.field1.d.x.fsm")  # type: ignore[arg-type]

    # -- names are data ------------------------------------------------------

    @pytest.mark.parametrize("bad_name", INVALID_NAMES, ids=range(len(INVALID_NAMES)))
    async def test_invalid_names_are_refused_on_send(self, transport: Transport, inbox: str, bad_name: str) -> None:
        with pytest.raises(InvalidMessageName):
            await transport.send(self.send_address(inbox), bad_name, b"data")
        assert await receive_all(transport, inbox) == []

    async def test_a_name_that_is_not_text_is_refused(self, transport: Transport, inbox: str) -> None:
        with pytest.raises(InvalidMessageName):
            await transport.send(self.send_address(inbox), b"hq.field1.fsm", b"data")  # type: ignore[arg-type]

    async def test_foreign_files_are_yielded_in_order_and_can_be_acked(self, transport: Transport, inbox: str) -> None:
        foreign = {
            "README": b"not a message",
            "hq.field1.d.garbage.fsm": b"\x00" * 10,
            "zz-\u00e9t\u00e9 report.fsm": b"accents",
        }
        for name, data in foreign.items():
            await self.place_raw_file(inbox, name, data)
        await transport.send(self.send_address(inbox), message_name(1), b"real")
        got = await receive_all(transport, inbox)
        expected = {**foreign, message_name(1): b"real"}
        assert [incoming.name for incoming in got] == sorted(expected)
        assert {incoming.name: incoming.data for incoming in got} == expected
        for incoming in got:
            await transport.ack(incoming)
        assert await receive_all(transport, inbox) == []

    async def test_a_name_wanted_refuses_is_neither_yielded_nor_removed(self, transport: Transport,
                                                                        inbox: str) -> None:
        ours, theirs = message_name(1), message_name(2, recipient="field2")
        files = {ours: b"ours", theirs: b"another site's", "README": b"not a message"}
        for name, data in files.items():
            await self.place_raw_file(inbox, name, data)
        asked: list[str] = []

        def wanted(name: str) -> bool:
            asked.append(name)
            return name == ours

        got = [incoming async for incoming in transport.receive(inbox, wanted=wanted)]
        assert [(incoming.name, incoming.data) for incoming in got] == [(ours, b"ours")]
        assert asked == sorted(files)  # each name once, in name order
        assert await received(transport, inbox) == files  # refused files stay, and no filter reads them all

    async def test_wanted_must_be_callable(self, transport: Transport, inbox: str) -> None:
        with pytest.raises(TypeError):
            transport.receive(inbox, wanted="field1")  # type: ignore[arg-type]

    # -- atomicity -----------------------------------------------------------

    async def test_an_interrupted_send_leaves_nothing_visible(self, transport: Transport, inbox: str) -> None:
        name = message_name(4)
        data = random.Random(6).randbytes(100_000)
        await self.leave_interrupted_send(inbox, name, data[:30_000])
        assert await receive_all(transport, inbox) == []
        await transport.send(self.send_address(inbox), name, data)
        assert await received(transport, inbox) == {name: data}

    async def test_a_reader_never_sees_a_partial_file(self, transport: Transport, inbox: str) -> None:
        payloads = {message_name(last): random.Random(last).randbytes(2 * 1024 * 1024) for last in range(1, 5)}
        sending = asyncio.gather(*(transport.send(self.send_address(inbox), name, data) for name, data in payloads.items()))
        while not sending.done():
            async for incoming in transport.receive(inbox):
                assert incoming.data == payloads[incoming.name], f"partial {incoming.name}"
            await asyncio.sleep(0)
        await sending
        assert await received(transport, inbox) == payloads

    # -- waiting and closing -------------------------------------------------

    async def test_wait_incoming_returns_by_the_timeout(self, transport: Transport, inbox: str) -> None:
        async with asyncio.timeout(5):
            await transport.wait_incoming(inbox, 0.05)

    async def test_wait_incoming_refuses_a_negative_timeout(self, transport: Transport, inbox: str) -> None:
        with pytest.raises(ValueError):
            await transport.wait_incoming(inbox, -1)

    async def test_closed_transport_refuses_work_and_closes_idempotently(
            self, make_transport: Callable[[], Transport], inbox: str) -> None:
        transport = make_transport()
        async with transport:
            await transport.send(self.send_address(inbox), message_name(1), b"x")
            [incoming] = await receive_all(transport, inbox)
        assert transport.closed
        await transport.aclose()
        with pytest.raises(TransportClosed):
            await transport.send(self.send_address(inbox), message_name(2), b"x")
        with pytest.raises(TransportClosed):
            transport.receive(inbox)
        with pytest.raises(TransportClosed):
            await transport.ack(incoming)
        with pytest.raises(TransportClosed):
            async with transport:
                pass
