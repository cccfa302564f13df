"""Settings for the whole suite, in every pytest process (the main one and
each pytest-xdist worker)."""

from __future__ import annotations

import os

import pytest


def pytest_configure(config) -> None:
    # pytest imports pdb, and so readline, whose start-up exports LINES=24 and
    # COLUMNS=80 into the C environment when no terminal says otherwise,
    # though os.environ does not show them.  Every process started after
    # that inherits them: pytest-xdist's workers, where the agent's console
    # then takes COLUMNS=80 for the user's width (agent/cli/_common.py) and
    # wraps the tables the tests read, and the tests' own subprocesses.
    # What the user's environment does not set is unset again here.
    for name in ("COLUMNS", "LINES"):
        if name not in os.environ:
            os.unsetenv(name)


# -- pytest-xdist (docs/testing.md, "The whole suite") ---------------------------------


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """In a pytest-xdist worker, tests marked ``slow`` come first.  With
    ``--dist loadfile --no-loadscope-reorder`` the workers are handed whole
    files in the order their first test is collected: the files of the
    longest tests then start first, and the end of the run is many short
    files shared out between the two workers, not one long test running
    alone.  A file's other tests keep their order, after its slow ones."""
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: item.get_closest_marker("slow") is None)
