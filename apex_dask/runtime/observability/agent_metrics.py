"""The metrics agents add, as the ``/apex`` page and ``/apex/metrics.json`` list them.

Each agent's builder declares them (:meth:`~apex_dask.algo.agents.builder.AgentBuilder.declared_metrics`:
its exploration parameter and its learner's own metrics, each with the chart it is drawn
in); the page and the JSON read that declaration here, for every registered agent (an
agent package's entry point included), so a new agent's metrics show with no change to
the dashboard.
"""

from __future__ import annotations

from functools import cache
from typing import Any

from apex_dask.algo.agents.registry import declared_metrics

__all__ = ["charted", "listing"]


@cache
def charted(chart: str) -> list[tuple[str, str]]:
    """``(name, legend)`` of the declared metrics drawn in ``chart`` (``sync``, ``agent``)."""
    return [
        (name, declared[0][1].label)
        for name, declared in declared_metrics().items()
        if declared[0][1].chart == chart
    ]


@cache
def listing() -> dict[str, dict[str, Any]]:
    """``{name: {"agents": [...], "meaning": ...}}``: the ``agent_metrics`` of
    ``/apex/metrics.json``."""
    return {
        name: {"agents": [a for a, _ in declared], "meaning": declared[0][1].meaning}
        for name, declared in declared_metrics().items()
    }
