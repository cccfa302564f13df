"""Settings for the whole suite, in every pytest process (the main one and
each pytest-xdist worker)."""

from __future__ import annotations

import os


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

