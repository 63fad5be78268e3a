"""Errors of the Dask runtime that a command line turns into one line."""

from __future__ import annotations

__all__ = [
    "ApexRuntimeError",
    "BackgroundTaskFailed",
    "InvariantViolated",
    "describe",
    "first_line",
]


class ApexRuntimeError(RuntimeError):
    """A run cannot start or cannot go on; the message is one line that says why.

    Raised for: scheduler unreachable, scheduler file missing, no workers,
    unknown env id, a learner that died or was lost, an actor that could not be
    created.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))


class BackgroundTaskFailed(ApexRuntimeError):
    """A supervised task whose policy is to end the run failed (``task``: its name);
    the message names it (``runtime/actors/supervision.py``)."""

    def __init__(self, task: str, message: str) -> None:
        super().__init__(message)
        self.task = task


class InvariantViolated(ApexRuntimeError):
    """A law of the run's counters failed while ``report.strict_invariants`` is on
    (``law``: its name; ``runtime/orchestration/invariants.py``)."""

    def __init__(self, law: str, message: str) -> None:
        super().__init__(message)
        self.law = law


def first_line(exc: BaseException, limit: int | None = None) -> str:
    """The first line of ``exc``'s message ("" when it has none), cut at ``limit``."""
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else "")[:limit]


def describe(exc: BaseException, limit: int | None = None) -> str:
    """``"Type: first line"`` (just ``"Type"`` for an empty message): an error in one line."""
    text = first_line(exc, limit)
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
