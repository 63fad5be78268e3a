"""The linq agent's greedy policy, and the same as a TorchScript program."""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from apex_dask.algo.agents.base import check_weights, load_weights
from apex_dask.algo.agents.spec import ScriptedPolicy
from apex_linq.networks import NumpyLinearQ, linear_q

__all__ = ["LinQPolicy"]


class Greedy(torch.nn.Module):
    """``forward(obs) -> action``: argmax of the Q-values of one observation."""

    def __init__(self, q: torch.nn.Module, start: int) -> None:
        super().__init__()
        self.q, self.start = q, start

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs.float()[None]).argmax(dim=1)[0] + self.start


class LinQPolicy:
    """Actions of trained weights (``WeightsMismatch`` if they do not fit)."""

    def __init__(self, observation_space, action_space, weights: Mapping[str, Any], bias=True):
        self.net = linear_q(observation_space, action_space, bias)
        check_weights(self.net, weights)
        load_weights(self.net, weights)
        self.q = NumpyLinearQ({k: np.asarray(v) for k, v in weights.items()})
        self.num_actions, self.start = int(action_space.n), int(action_space.start)

    def reset(self) -> None:
        """An episode begins (no state)."""

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> int:
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return int(rng.integers(self.num_actions)) + self.start
        return int(self.q(np.asarray(obs)[None])[0].argmax()) + self.start

    def program(self) -> ScriptedPolicy:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit.script's
            program = torch.jit.script(Greedy(self.net.eval(), self.start))
        inside = ["observations as float32", "Q = W s + b", "argmax over actions"]
        return ScriptedPolicy(program, inside, "an int64 action (0-d tensor)")
