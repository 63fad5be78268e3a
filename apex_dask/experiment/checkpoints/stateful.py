"""The one save/restore interface of everything a checkpoint holds.

::

    part = obj.state_dict()          # numpy arrays, numbers, strings, lists, dicts
    fresh.load_state_dict(part)      # into an object built from the same config

A replay shard (:class:`~apex_dask.algo.replay.shard.ReplayShard`), a learner
(each agent's, :class:`~apex_dask.algo.agents.base.LearnerProtocol`) and the
in-process runner (:class:`~apex_dask.local.runner.LocalApex`, whose state is
its learner's, its shards' and its own counters':
:func:`~apex_dask.experiment.checkpoints.runner.runner_state`) implement it;
:mod:`.store` writes what ``state_dict`` returns as ``.npz`` and JSON (nothing
is pickled), and the Dask runtime's learner and shard actors write their
parts with it straight into a staged checkpoint.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol, runtime_checkable

__all__ = ["Stateful"]


@runtime_checkable
class Stateful(Protocol):
    """Saves itself as one checkpoint part and restores itself from one."""

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: Mapping[str, Any]) -> None: ...
