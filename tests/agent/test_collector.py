"""The cyclic collector paused for the big passes (agent.collector): off
inside a pause, back on after the last one ends, whatever thread or
exception ends it, and left off when the process had switched it off."""

from __future__ import annotations

import gc
import threading

import pytest

from agent.collector import collector_paused


@pytest.fixture(autouse=True)
def collector_on():
    was = gc.isenabled()
    gc.enable()
    yield
    if was:
        gc.enable()
    else:
        gc.disable()


def test_a_pause_switches_the_collector_off_for_its_block() -> None:
    with collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()


def test_an_error_ends_the_pause_too() -> None:
    with pytest.raises(KeyError):
        with collector_paused():
            raise KeyError("x")
    assert gc.isenabled()


def test_pauses_nest_and_the_collector_resumes_after_the_last() -> None:
    with collector_paused():
        with collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()


def test_pauses_from_two_threads_overlap() -> None:
    """The first pause ends while the other thread's goes on: the collector
    stays off until that one ends."""
    inside, first_done, seen = threading.Event(), threading.Event(), []

    def other() -> None:
        with collector_paused():
            inside.set()
            first_done.wait(10)
            seen.append(gc.isenabled())

    thread = threading.Thread(target=other)
    with collector_paused():
        thread.start()
        assert inside.wait(10)
    first_done.set()
    assert not gc.isenabled() or not thread.is_alive()
    thread.join(10)
    assert seen == [False]
    assert gc.isenabled()


def test_a_collector_the_process_switched_off_stays_off() -> None:
    gc.disable()
    with collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()
