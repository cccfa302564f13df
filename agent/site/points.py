"""Named places inside the site's own transactions where a test can make
the agent die (docs/testing.md): the site only says it reached one;
agent.crashpoints, which arms them, installs what happens there.

Rules of this file:
* Without a hook installed, reaching a point does nothing (one global
  lookup), so the site layer runs alike with or without the agent above it.
"""

from __future__ import annotations

from typing import Callable

_hook: Callable[[str], None] | None = None


def set_hook(hook: Callable[[str], None] | None) -> None:
    """What reaching a point does (None: nothing)."""
    global _hook
    _hook = hook


def reached(name: str) -> None:
    """The site reached the point ``name`` (agent.crashpoints.SCHEMA_POINTS, TOOL_POINTS)."""
    if _hook is not None:
        _hook(name)
