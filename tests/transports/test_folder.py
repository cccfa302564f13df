"""The folder transport: the conformance suite plus what only folders have."""

from __future__ import annotations

import errno
import logging
import os
import re
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from transports import BadAddress, InvalidMessageName, TransportRefused, TransportUnavailable
from transports.folder import FolderTransport

from .conformance import TransportConformance, message_name, receive_all, receive_wanted, received, record_reads

REPO_ROOT = Path(__file__).resolve().parents[2]
TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[0-9a-f]{16}\.tmp\Z")


class TestFolderConformance(TransportConformance):
    @pytest.fixture
    def make_transport(self):
        return FolderTransport

    @pytest.fixture
    def inbox(self, tmp_path: Path) -> str:
        (tmp_path / "hq-inbox").mkdir()
        return str(tmp_path / "hq-inbox")

    @pytest.fixture
    def peer_inbox(self, tmp_path: Path) -> str:
        (tmp_path / "field1-inbox").mkdir()
        return str(tmp_path / "field1-inbox")

    async def place_raw_file(self, address: str, name: str, data: bytes) -> None:
        (Path(address) / name).write_bytes(data)

    async def leave_interrupted_send(self, address: str, name: str, data: bytes) -> None:
        # A real sender process, killed just before its rename.
        script = (
            "import os, sys\n"
            "from transports.folder import FolderTransport\n"
            "os.replace = lambda *args: os._exit(9)\n"
            "FolderTransport()._send_blocking(sys.argv[1], sys.argv[2], sys.stdin.buffer.read())\n"
        )
        result = subprocess.run([sys.executable, "-c", script, address, name], input=data,
                                cwd=REPO_ROOT, capture_output=True, timeout=60)
        assert result.returncode == 9, result.stderr.decode()
        [temp] = os.listdir(address)
        assert TEMP_NAME.match(temp)["name"] == name
        assert (Path(address) / temp).read_bytes() == data


@pytest.fixture
def inbox(tmp_path: Path) -> Path:
    path = tmp_path / "inbox"
    path.mkdir()
    return path


@pytest.fixture
async def transport():
    async with FolderTransport() as transport:
        yield transport


def old(path: Path, seconds: float) -> None:
    moment = time.time() - seconds
    os.utime(path, (moment, moment), follow_symlinks=False)


# -- addresses ---------------------------------------------------------------


async def test_missing_inbox_on_receive_is_unavailable_and_names_the_path(transport, tmp_path: Path) -> None:
    missing = tmp_path / "unplugged" / "inbox"
    with pytest.raises(TransportUnavailable) as caught:
        await receive_all(transport, str(missing))
    message = str(caught.value)
    assert str(missing) in message and "\n" not in message and "mounted" in message
    assert caught.value.retryable


async def test_missing_folder_on_send_is_unavailable_and_not_created(transport, tmp_path: Path) -> None:
    missing = tmp_path / "unplugged" / "inbox"
    with pytest.raises(TransportUnavailable, match=re.escape(str(missing))):
        await transport.send(str(missing), message_name(1), b"x")
    assert not (tmp_path / "unplugged").exists()


async def test_an_invalid_name_is_refused_before_the_folder_is_looked_at(transport, tmp_path: Path) -> None:
    with pytest.raises(InvalidMessageName):
        await transport.send(str(tmp_path / "missing"), "../escape.fsm", b"x")


async def test_a_file_as_address_is_a_bad_address(transport, tmp_path: Path) -> None:
    a_file = tmp_path / "inbox"
    a_file.write_bytes(b"")
    with pytest.raises(BadAddress, match="not a folder"):
        await transport.send(str(a_file), message_name(1), b"x")
    with pytest.raises(BadAddress, match="not a folder"):
        await receive_all(transport, str(a_file))
    with pytest.raises(BadAddress):
        await transport.send(str(a_file / "below"), message_name(1), b"x")


@pytest.mark.parametrize("address", ["", "   ", "in\x00box", None])
async def test_unusable_addresses_are_bad(transport, address) -> None:
    with pytest.raises(BadAddress):
        await transport.send(address, message_name(1), b"x")
    with pytest.raises(BadAddress):
        transport.receive(address)


async def test_home_and_relative_addresses_are_resolved(transport, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "inbox").mkdir()
    await transport.send("~/inbox", message_name(1), b"home")
    monkeypatch.chdir(tmp_path)
    assert await received(transport, "inbox") == {message_name(1): b"home"}
    assert (tmp_path / "inbox" / message_name(1)).read_bytes() == b"home"


# -- how send writes -----------------------------------------------------------


async def test_send_writes_a_temp_file_fsyncs_renames_and_fsyncs_the_folder(
        transport, inbox: Path, monkeypatch) -> None:
    name = message_name(1)
    data = b"d" * 100_000
    events = []
    loop_thread = threading.get_ident()
    real_fsync, real_replace = os.fsync, os.replace

    def spy_fsync(fd):
        kind = "folder" if stat.S_ISDIR(os.fstat(fd).st_mode) else "file"
        events.append(("fsync", kind, threading.get_ident() != loop_thread))
        return real_fsync(fd)

    def spy_replace(source, target):
        source, target = Path(source), Path(target)
        assert source.parent == target.parent == inbox
        assert TEMP_NAME.match(source.name)["name"] == name
        assert source.read_bytes() == data
        assert not target.exists()
        events.append(("replace", target.name, threading.get_ident() != loop_thread))
        return real_replace(source, target)

    monkeypatch.setattr(os, "fsync", spy_fsync)
    monkeypatch.setattr(os, "replace", spy_replace)
    await transport.send(str(inbox), name, data)
    assert events == [("fsync", "file", True), ("replace", name, True), ("fsync", "folder", True)]
    assert os.listdir(inbox) == [name]


def _failing_folder_fsync(monkeypatch, code: int) -> None:
    real_fsync = os.fsync

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(code, os.strerror(code))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)


async def test_a_share_that_cannot_flush_a_folder_still_takes_files(transport, inbox: Path, monkeypatch,
                                                                    caplog) -> None:
    _failing_folder_fsync(monkeypatch, errno.EINVAL)  # what some network file systems answer
    with caplog.at_level(logging.DEBUG, logger="transports.folder"):
        await transport.send(str(inbox), message_name(1), b"x")
    assert os.listdir(inbox) == [message_name(1)]
    assert "does not support fsync" in caplog.text


async def test_a_folder_that_fails_to_flush_fails_the_send(transport, inbox: Path, monkeypatch) -> None:
    _failing_folder_fsync(monkeypatch, errno.EIO)
    with pytest.raises(TransportUnavailable, match=f"cannot flush folder {re.escape(str(inbox))}.*EIO"):
        await transport.send(str(inbox), message_name(1), b"x")


async def test_ack_removes_without_an_fsync(transport, inbox: Path, monkeypatch) -> None:
    """A removal lost in a crash brings back a file already stored (read
    again as a duplicate); an fsync per ack would make a flood of junk cost
    about 11 ms a file."""
    await transport.send(str(inbox), message_name(1), b"x")
    [incoming] = await receive_all(transport, str(inbox))
    synced = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(stat.S_ISDIR(os.fstat(fd).st_mode)), real_fsync(fd)))
    await transport.ack(incoming)
    assert synced == []
    assert os.listdir(inbox) == []


async def test_a_hard_link_is_not_read(transport, inbox: Path, tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.write_bytes(b"not the inbox's")
    os.link(elsewhere, inbox / message_name(1))
    assert await receive_all(transport, str(inbox)) == []
    assert (inbox / message_name(1)).exists()


async def test_the_default_limit_is_the_largest_message(transport, inbox: Path) -> None:
    from codec.message import MAX_FILE_SIZE

    with open(inbox / message_name(1), "wb") as handle:
        handle.truncate(MAX_FILE_SIZE + 1)
    with open(inbox / message_name(2), "wb") as handle:
        handle.truncate(MAX_FILE_SIZE)
    assert [incoming.name for incoming in await receive_all(transport, str(inbox))] == [message_name(2)]


async def test_a_failed_write_leaves_neither_the_file_nor_a_temp(transport, inbox: Path, monkeypatch) -> None:
    def failing_fsync(fd):
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing_fsync)
    with pytest.raises(TransportUnavailable, match="EIO"):
        await transport.send(str(inbox), message_name(1), b"x")
    assert os.listdir(inbox) == []


@pytest.mark.parametrize("code, error_class", [
    (errno.EACCES, TransportRefused), (errno.EROFS, TransportRefused), (errno.ENOSPC, TransportUnavailable)])
async def test_os_errors_on_send_map_to_the_error_tree(transport, inbox: Path, monkeypatch, code, error_class) -> None:
    real_open = os.open

    def failing_open(path, flags, *args, **kwargs):
        if str(path).endswith(".tmp"):
            raise OSError(code, os.strerror(code), path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", failing_open)
    with pytest.raises(error_class, match=re.escape(str(inbox))) as caught:
        await transport.send(str(inbox), message_name(1), b"x")
    assert caught.value.retryable is (error_class is TransportUnavailable)
    assert os.listdir(inbox) == []


async def test_file_mode_option_and_umask(inbox: Path) -> None:
    async with FolderTransport(file_mode=0o600) as private:
        await private.send(str(inbox), message_name(1), b"x")
    previous = os.umask(0o027)
    try:
        async with FolderTransport() as default:
            await default.send(str(inbox), message_name(2), b"x")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((inbox / message_name(1)).stat().st_mode) == 0o600
    assert stat.S_IMODE((inbox / message_name(2)).stat().st_mode) == 0o640


@pytest.mark.parametrize("options", [
    {"stale_temp_age": 0}, {"min_age": -1}, {"max_file_size": -1}, {"max_file_size": 1.5}, {"max_file_size": 9999}, {"file_mode": 0o1000},
    {"min_age": "abc"}, {"stale_temp_age": True}])
def test_bad_options_are_refused(options) -> None:
    [(option, value)] = options.items()
    # One line naming the option and the value (what -O gave), never a bare TypeError.
    shown = f"0o{value:o}" if option == "file_mode" else repr(value)  # permission bits in octal
    with pytest.raises(ValueError, match=f"^{option} must be .*, got {shown}$"):
        FolderTransport(**options)


# -- what receive reads ----------------------------------------------------------


async def test_temp_files_are_cleaned_up_only_when_stale_and_only_our_own(transport, inbox: Path) -> None:
    name = message_name(1)
    stale_own = inbox / f".{name}.0123456789abcdef.tmp"
    fresh_own = inbox / f".{name}.fedcba9876543210.tmp"
    not_ours = [inbox / ".notes.tmp", inbox / ".DS_Store", inbox / f".{name}.xyz.tmp", inbox / f"{name}.part"]
    for path in [stale_own, fresh_own, *not_ours]:
        path.write_bytes(b"partial")
    for path in [stale_own, *not_ours]:
        old(path, 2 * 3600)
    assert await receive_all(transport, str(inbox)) == []
    assert not stale_own.exists()
    assert fresh_own.exists() and all(path.exists() for path in not_ours)


async def test_stale_temp_age_is_an_option(inbox: Path) -> None:
    temp = inbox / f".{message_name(1)}.0123456789abcdef.tmp"
    temp.write_bytes(b"partial")
    old(temp, 120)
    async with FolderTransport() as default:
        await receive_all(default, str(inbox))
    assert temp.exists()
    async with FolderTransport(stale_temp_age=60) as eager:
        await receive_all(eager, str(inbox))
    assert not temp.exists()


@pytest.mark.parametrize("suffix", [".tmp", ".part", ".partial", ".filepart", ".crdownload", "~"])
async def test_other_tools_partial_files_are_not_yielded(transport, inbox: Path, suffix: str) -> None:
    (inbox / (message_name(1) + suffix)).write_bytes(b"half")
    assert await receive_all(transport, str(inbox)) == []


async def test_links_folders_and_fifos_are_ignored_and_nothing_outside_is_touched(
        transport, inbox: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside.fsm"
    outside.write_bytes(b"secret")
    (tmp_path / "outside-dir").mkdir()
    (inbox / message_name(1)).symlink_to(outside)
    (inbox / message_name(2)).symlink_to(tmp_path / "outside-dir")
    (inbox / message_name(3)).symlink_to(tmp_path / "dangling")
    (inbox / message_name(4)).mkdir()
    (inbox / message_name(4) / message_name(5)).write_bytes(b"nested")
    os.mkfifo(inbox / message_name(6))
    (inbox / message_name(7)).write_bytes(b"real")
    got = await receive_all(transport, str(inbox))
    assert [(incoming.name, incoming.data) for incoming in got] == [(message_name(7), b"real")]
    for incoming in got:
        await transport.ack(incoming)
    assert outside.read_bytes() == b"secret"
    assert sorted(os.listdir(inbox)) == [message_name(n) for n in (1, 2, 3, 4, 6)]
    assert (inbox / message_name(4) / message_name(5)).read_bytes() == b"nested"


async def test_a_file_swapped_for_a_link_after_listing_is_not_followed(
        transport, inbox: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"secret")
    (inbox / message_name(1)).write_bytes(b"first")
    (inbox / message_name(2)).write_bytes(b"second")
    iterator = transport.receive(str(inbox))
    first = await anext(iterator)
    (inbox / message_name(2)).unlink()
    (inbox / message_name(2)).symlink_to(outside)
    rest = [incoming async for incoming in iterator]
    assert first.data == b"first" and rest == []


async def test_a_file_removed_after_listing_is_skipped(transport, inbox: Path) -> None:
    for last in (1, 2, 3):
        (inbox / message_name(last)).write_bytes(b"%d" % last)
    iterator = transport.receive(str(inbox))
    first = await anext(iterator)
    (inbox / message_name(2)).unlink()  # another reader took it
    rest = [incoming async for incoming in iterator]
    assert [first.name] + [incoming.name for incoming in rest] == [message_name(1), message_name(3)]


async def test_ack_keeps_a_copy_delivered_after_the_receive(transport, inbox: Path) -> None:
    name = message_name(1)
    await transport.send(str(inbox), name, b"old")
    [stale] = await receive_all(transport, str(inbox))
    await transport.send(str(inbox), name, b"redelivered")
    await transport.ack(stale)
    [fresh] = await receive_all(transport, str(inbox))
    assert fresh.data == b"redelivered"
    await transport.ack(fresh)
    assert os.listdir(inbox) == []


async def test_ack_of_an_incoming_from_another_transport_is_refused(transport) -> None:
    from transports import Incoming

    with pytest.raises(TypeError):
        await transport.ack(Incoming(message_name(1), b"x", token=("imap", 17)))


async def test_min_age_leaves_recently_modified_files_for_later(inbox: Path) -> None:
    path = inbox / message_name(1)
    path.write_bytes(b"being copied")
    async with FolderTransport(min_age=60) as careful:
        assert await receive_all(careful, str(inbox)) == []
        old(path, 61)
        assert await received(careful, str(inbox)) == {message_name(1): b"being copied"}


async def test_files_over_the_size_limit_are_left_and_logged(inbox: Path, caplog) -> None:
    (inbox / message_name(1)).write_bytes(b"x" * 10_001)
    (inbox / message_name(2)).write_bytes(b"y" * 10_000)
    async with FolderTransport(max_file_size=10_000) as limited:
        with caplog.at_level(logging.WARNING, logger="transports.folder"):
            assert await received(limited, str(inbox)) == {message_name(2): b"y" * 10_000}
    assert (inbox / message_name(1)).exists()
    assert any(message_name(1) in record.getMessage() and "limit" in record.getMessage()
               for record in caplog.records)


async def test_a_file_that_grows_while_read_is_left_for_the_next_receive(transport, inbox: Path, monkeypatch) -> None:
    path = inbox / message_name(1)
    path.write_bytes(b"a" * 10)
    real_read = os.read
    grown = []

    def read_while_someone_appends(fd, size):
        if not grown:
            grown.append(True)
            with open(path, "ab") as appender:
                appender.write(b"b" * 10)
        return real_read(fd, size)

    monkeypatch.setattr(os, "read", read_while_someone_appends)
    assert await receive_all(transport, str(inbox)) == []
    assert await received(transport, str(inbox)) == {message_name(1): b"a" * 10 + b"b" * 10}


async def test_an_unreadable_file_is_logged_and_skipped(transport, inbox: Path, monkeypatch, caplog) -> None:
    for last in (1, 2):
        (inbox / message_name(last)).write_bytes(b"%d" % last)
    real_open = os.open

    def open_denied_for_first(path, flags, *args, **kwargs):
        if str(path).endswith(message_name(1)):
            raise PermissionError(errno.EACCES, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", open_denied_for_first)
    with caplog.at_level(logging.WARNING, logger="transports.folder"):
        assert await received(transport, str(inbox)) == {message_name(2): b"2"}
    assert any(message_name(1) in record.getMessage() for record in caplog.records)


async def test_receive_reads_files_in_worker_threads(transport, inbox: Path, monkeypatch) -> None:
    (inbox / message_name(1)).write_bytes(b"x")
    loop_thread = threading.get_ident()
    threads = []
    real_scandir, real_open = os.scandir, os.open
    monkeypatch.setattr(os, "scandir", lambda path: (threads.append(threading.get_ident()), real_scandir(path))[1])
    monkeypatch.setattr(os, "open", lambda *args, **kwargs: (threads.append(threading.get_ident()),
                                                            real_open(*args, **kwargs))[1])
    await receive_all(transport, str(inbox))
    assert threads and loop_thread not in threads


async def test_a_name_the_caller_does_not_want_is_not_read(transport, inbox: Path, monkeypatch) -> None:
    ours, theirs = message_name(1), message_name(1, recipient="field2")
    (inbox / ours).write_bytes(b"ours")
    (inbox / theirs).write_bytes(b"another site's")
    reads = record_reads(monkeypatch, transport, "_read_blocking", lambda directory, name: name)
    assert await receive_wanted(transport, str(inbox), ours) == [ours]
    assert reads == [ours]
    assert sorted(os.listdir(inbox)) == sorted([ours, theirs])
