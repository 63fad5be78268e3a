"""Errors of the Dask runtime that a command line turns into one line."""

from __future__ import annotations

__all__ = ["ApexRuntimeError"]


class ApexRuntimeError(RuntimeError):
    """A run cannot start or cannot go on; the message is one line that says why.

    Raised for: scheduler unreachable, scheduler file missing, no workers,
    unknown env id, a learner that died or was lost, an actor that could not be
    created.
    """

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(str(message).split()))
