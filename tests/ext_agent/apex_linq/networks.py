"""The linq agent's Q-function: one linear layer, in torch (learner) and numpy (workers)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
from torch import nn

__all__ = ["NumpyLinearQ", "linear_q"]


def linear_q(observation_space, action_space, bias: bool = True) -> nn.Module:
    """``Q(s, .) = W s + b`` for a vector observation and Discrete actions."""
    return nn.Sequential(
        nn.Flatten(), nn.Linear(int(np.prod(observation_space.shape)), int(action_space.n), bias)
    )


class NumpyLinearQ:
    """The same Q-values from a weights dict (what the learner publishes), in numpy."""

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        self.w = np.asarray(weights["1.weight"], np.float32).T.copy()
        b = weights.get("1.bias")
        self.b = np.zeros(self.w.shape[1], np.float32) if b is None else np.asarray(b, np.float32)

    def __call__(self, obs: np.ndarray) -> np.ndarray:
        """float32 Q-values (B, A)."""
        return np.asarray(obs, np.float32).reshape(len(obs), -1) @ self.w + self.b
