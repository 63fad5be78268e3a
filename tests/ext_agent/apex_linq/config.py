"""The linq agent's config section (``linq:`` in YAML, ``linq.<key>`` with ``--set``)."""

from __future__ import annotations

from dataclasses import dataclass

from apex_dask.algo.agents.config import AgentConfig, Problem, first, positive

__all__ = ["LinQConfig"]


@dataclass(frozen=True)
class LinQConfig(AgentConfig):
    """Linear Q-learning: Q(s, .) = W s + b, an n-step double-Q target, Adam."""

    network_keys = ("bias",)

    lr: float = 1e-2
    """Adam learning rate."""
    bias: bool = True
    """A bias per action beside the weights."""
    huber_delta: float = 1.0
    """Huber loss threshold of the TD errors (> 0)."""

    def check(self) -> Problem | None:
        return first(positive("lr", self.lr), positive("huber_delta", self.huber_delta))
