"""Waiting for a state in tests: poll with a deadline, never a bare sleep."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def poll(fn: Callable[[], Any], timeout_s: float = 30.0, interval_s: float = 0.1) -> Any:
    """Call ``fn`` until it returns something truthy; return that.

    Raises ``AssertionError`` naming the wait once ``timeout_s`` has passed.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > deadline:
            name = getattr(fn, "__name__", "condition")
            raise AssertionError(f"{name} not met within {timeout_s} s")
        time.sleep(interval_s)
