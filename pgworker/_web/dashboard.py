"""The web dashboard (issue 14, item 4). Placeholder: owned by the dashboard helper."""

from __future__ import annotations

from typing import Any


def install(app: Any, config: Any) -> None:
    """Add the dashboard's routes to `app`."""
