"""The shared file-system rules (codec.fsutil): directory fsync, temporary
names, link-never-replace.  Every failure reaches the caller as an OSError."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

import pytest

from codec.fsutil import (
    DirectoryFlushUnsupported,
    claim_temporary,
    fsync_directory,
    is_temporary,
    link_new,
    temporary_name,
    temporary_target,
)

NAME = "hq-f1-(0-0000000000-0000000042-0).fsm"


def _fail_fsync(monkeypatch, code: int) -> None:
    def fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)


# -- fsync_directory ---------------------------------------------------------------


def test_fsync_directory_flushes_the_directory_itself(tmp_path: Path, monkeypatch) -> None:
    flushed = []
    real_fsync = os.fsync

    def spy(fd):
        flushed.append(stat.S_ISDIR(os.fstat(fd).st_mode))
        return real_fsync(fd)

    monkeypatch.setattr(os, "fsync", spy)
    fsync_directory(tmp_path)
    assert flushed == [True]


def test_fsync_directory_raises_for_a_missing_directory(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError) as caught:
        fsync_directory(tmp_path / "gone")
    assert caught.value.filename == str(tmp_path / "gone")


@pytest.mark.parametrize("code", [errno.EIO, errno.ENOSPC])
def test_a_failed_directory_fsync_propagates_named_after_the_directory(tmp_path: Path, monkeypatch, code) -> None:
    _fail_fsync(monkeypatch, code)
    with pytest.raises(OSError) as caught:
        fsync_directory(tmp_path)
    assert caught.value.errno == code and caught.value.filename == str(tmp_path)
    assert not isinstance(caught.value, DirectoryFlushUnsupported)


@pytest.mark.parametrize("code", [errno.EINVAL, errno.ENOTSUP])
def test_a_file_system_without_directory_fsync_raises_its_own_oserror(tmp_path: Path, monkeypatch, code) -> None:
    """Never swallowed: the caller decides whether an unflushable rename will do."""
    _fail_fsync(monkeypatch, code)
    with pytest.raises(DirectoryFlushUnsupported) as caught:
        fsync_directory(tmp_path)
    assert isinstance(caught.value, OSError) and caught.value.errno == code
    assert caught.value.filename == str(tmp_path)


def test_the_directory_is_closed_when_its_fsync_fails(tmp_path: Path, monkeypatch) -> None:
    opened, closed = [], []
    real_open, real_close = os.open, os.close
    monkeypatch.setattr(os, "open", lambda *args, **kwargs: opened.append(real_open(*args, **kwargs)) or opened[-1])
    monkeypatch.setattr(os, "close", lambda fd: (closed.append(fd), real_close(fd)))
    _fail_fsync(monkeypatch, errno.EIO)
    with pytest.raises(OSError):
        fsync_directory(tmp_path)
    assert opened == closed and len(opened) == 1


# -- temporary names ---------------------------------------------------------------


def test_a_temporary_name_is_hidden_fresh_and_names_its_target() -> None:
    first, second = temporary_name(NAME), temporary_name(NAME)
    assert first != second
    for temporary in (first, second):
        assert temporary.startswith(f".{NAME}.") and temporary.endswith(".tmp")
        assert is_temporary(temporary) and temporary_target(temporary) == NAME


@pytest.mark.parametrize("name", [".notes.tmp", f".{NAME}.xyz.tmp", f".{NAME}.0123456789ABCDEF.tmp", NAME,
                                  f"{NAME}.part", f".{NAME}.0123456789abcdef.tmp~"])
def test_other_names_have_no_target(name: str) -> None:
    assert temporary_target(name) is None


@pytest.mark.parametrize("name", [".DS_Store", ".notes", f"{NAME}.tmp", f"{NAME}.part", f"{NAME}.partial",
                                  f"{NAME}.filepart", f"{NAME}.crdownload", f"{NAME}~"])
def test_dot_names_and_other_tools_partial_files_are_temporary(name: str) -> None:
    assert is_temporary(name)


def test_a_finished_name_is_not_temporary() -> None:
    assert not is_temporary(NAME)


# -- link_new ----------------------------------------------------------------------


def _no_hard_links(monkeypatch) -> None:
    def link(source, target, **kwargs):
        raise PermissionError(errno.EPERM, "Operation not permitted", source)  # Linux's vfat

    monkeypatch.setattr(os, "link", link)


@pytest.fixture(params=["hard links", "no hard links"])
def file_system(request, monkeypatch) -> str:
    if request.param == "no hard links":
        _no_hard_links(monkeypatch)
    return request.param


def test_link_new_gives_the_file_its_name(tmp_path: Path, file_system) -> None:
    source = tmp_path / temporary_name("a")
    source.write_bytes(b"ours")
    link_new(source, tmp_path / "a")
    assert (tmp_path / "a").read_bytes() == b"ours" and not source.exists()


@pytest.mark.parametrize("existing", ["file", "dangling link"])
def test_link_new_never_replaces_a_file_there(tmp_path: Path, file_system, existing) -> None:
    source, target = tmp_path / temporary_name("a"), tmp_path / "a"
    source.write_bytes(b"ours")
    if existing == "file":
        target.write_bytes(b"theirs")
    else:
        target.symlink_to(tmp_path / "nowhere")
    with pytest.raises(FileExistsError) as caught:
        link_new(source, target)
    assert caught.value.filename == str(target)
    assert source.read_bytes() == b"ours"  # the caller removes it
    if existing == "file":
        assert target.read_bytes() == b"theirs"
    else:
        assert target.is_symlink() and not (tmp_path / "nowhere").exists()


def test_link_new_reports_a_missing_source(tmp_path: Path, file_system) -> None:
    with pytest.raises(FileNotFoundError):
        link_new(tmp_path / "gone", tmp_path / "a")
    assert not os.path.lexists(tmp_path / "a")


# -- claim_temporary ---------------------------------------------------------------


def _held(path: Path | str) -> bool:
    """Whether another open file holds ``path``'s flock (a flock is held by
    an open file, so a second opening in this process meets it too)."""
    import fcntl

    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_claimed_temporary_is_new_empty_and_held_until_closed(tmp_path: Path) -> None:
    path, removed, fd = claim_temporary(tmp_path / "n1.db", 0o640)
    try:
        assert removed == []
        assert temporary_target(os.path.basename(path)) == "n1.db" and os.path.dirname(path) == str(tmp_path)
        assert os.path.getsize(path) == 0
        assert _held(path)
    finally:
        os.close(fd)
    assert not _held(path)  # the claim ends with its descriptor (and with the process, however it ends)


def test_what_a_killed_writer_left_is_removed_and_a_held_one_is_not(tmp_path: Path) -> None:
    """A temporary of the same target that no one holds, with SQLite's
    journals beside it, goes; one another writer holds, and the
    temporaries of other targets, stay."""
    import fcntl

    left = tmp_path / temporary_name("n1.db")
    left.write_bytes(b"SQLite format 3\0 half a copy")
    for suffix in ("-wal", "-shm", "-journal"):
        Path(f"{left}{suffix}").write_bytes(b"x")
    other = tmp_path / temporary_name("n2.db")
    other.write_bytes(b"")
    held = tmp_path / temporary_name("n1.db")
    held.write_bytes(b"")
    holder = os.open(held, os.O_RDONLY)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:
        path, removed, fd = claim_temporary(tmp_path / "n1.db")
        os.close(fd)
    finally:
        os.close(holder)
    assert removed == [left.name]
    assert sorted(entry.name for entry in tmp_path.iterdir()) == sorted([held.name, other.name,
                                                                        os.path.basename(path)])
