"""What an :class:`~.driver.ApexDriver` tells about its run: read-only views of it.

:class:`RunViews` is the part of ``ApexDriver`` that reads the run (where the
actors are, the learner's weights and state, the elastic changes, the
notes); the driver module keeps what starts, drives and stops it, and what
reads its execution plan.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.launch import ActorSet
from apex_dask.runtime.orchestration.state import RunState

__all__ = ["RunViews"]


class RunViews:
    """Read-only views of a run, for :class:`~.driver.ApexDriver` (which sets the
    attributes below)."""

    _cluster: Any
    _actors: ActorSet | None
    _state: RunState | None
    _timeout: float

    @property
    def cluster(self) -> Any:
        """The embedded ``LocalCluster`` (None on a cluster given by a client): e.g.
        ``driver.cluster.scale(4)`` mid-run, which an elastic run follows."""
        return self._cluster

    @property
    def changes(self) -> list[str]:
        """Elastic runs: one line per env worker added or retired and per actor moved."""
        return [] if self._state is None else list(self._state.changes)

    @property
    def placement(self) -> dict[str, Any]:
        """Where each actor is now: ``{"learner", "shards", "env_workers", "evaluator"}``."""
        return {} if self._actors is None else self._actors.placement.as_dict()

    def learner_weights(self, timeout_s: float | None = None) -> tuple[int, dict[str, np.ndarray]]:
        """``(version, {name: array})`` of the learner's online net (within ``timeout_s``)."""
        return self._live().learner.get_weights().result(timeout=timeout_s or self._timeout)

    def learner_state(self) -> dict[str, Any]:
        """The learner's full state (online, target, optimizer, counters) as numpy."""
        return self._live().learner.state_dict().result(timeout=self._timeout)

    def replay_contents(self) -> list[dict[str, Any]]:
        """Each replay shard's contents and priorities (``ReplayShard.state_dict``), in
        shard order: what the run stored, e.g. to check it against what was offered."""
        shards = self._live().shards
        return [h.state_dict().result(timeout=self._timeout) for h in shards]

    def shard_stats(self) -> list[dict[str, float]]:
        """Each replay shard's ``replay/<k>/*`` stats now (``rollouts_stored``, ``add_s``, ...)."""
        calls = [h.stats() for h in self._live().shards]
        return [c.result(timeout=self._timeout) for c in calls]

    def env_transport(self) -> list[dict[str, Any]]:
        """Each env worker's ``transport()`` since the last call (rollout made -> stored
        seconds, weight bytes pulled) with its ``index``, ``address`` and
        ``rollouts_sent``; asked all at once (``benchmarks/scale.py``)."""
        slots = list(self._live().slots)
        calls = [(s, s.handle.transport(), s.handle.stats()) for s in slots]
        out = []
        for slot, transport, stats in calls:
            got = dict(transport.result(timeout=self._timeout))
            sent = stats.result(timeout=self._timeout)[f"env/{slot.index}/rollouts_sent"]
            got.update(index=slot.index, address=slot.address, rollouts_sent=int(sent))
            out.append(got)
        return out

    @property
    def notes(self) -> list[str]:
        """Problems the run met without ending (a failed periodic checkpoint, a rebuilt
        shard or learner): the last 20, oldest first."""
        return [] if self._state is None else list(self._state.notes)

    def _live(self) -> RunState:
        if self._state is None:
            raise ApexRuntimeError("this ApexDriver was stopped; create a new one")
        return self._state
