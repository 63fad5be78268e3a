"""The R2D2 agent's greedy policy: argmax of the recurrent Q-network, its state carried.

For play, :meth:`R2D2Policy.reset` at each episode's start (the zero state), then one
:meth:`R2D2Policy.act` per step; with probability ``epsilon`` a step takes a uniform
action (the state still advances on the observation, as on the env workers).

Exported (:meth:`R2D2Policy.program`), the program takes and returns the state::

    policy = torch.jit.load("r2d2.pt")
    h = c = torch.zeros(1, lstm_size)                       # at each episode's start
    action, h, c = policy(torch.as_tensor(obs)[None], h, c)  # action: (1,) int64
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.base import check_weights, load_weights
from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork
from apex_dask.algo.agents.spec import ScriptedPolicy
from apex_dask.algo.agents.torsos import input_scale, is_image_space

__all__ = ["R2D2Policy", "RecurrentProgram"]


def _network(observation_space, action_space, weights, config) -> RecurrentQNetwork:
    net = RecurrentQNetwork(observation_space, action_space, config)
    check_weights(net, weights)
    load_weights(net, weights)
    return net.eval().requires_grad_(False)


class R2D2Policy:
    """Actions of an ``r2d2`` run's weights, one observation at a time, state carried."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
        config: R2D2Config | None = None,
    ) -> None:
        o = config if config is not None else R2D2Config()
        self.config = o
        self.observation_space, self.action_space = observation_space, action_space
        self.net = _network(observation_space, action_space, weights, o)
        self.num_actions = int(action_space.n)
        self.offset = int(action_space.start)
        self.dtype = observation_space.dtype
        self.reset()

    def reset(self) -> None:
        """An episode begins: the zero state."""
        self.state = self.net.initial_state(1)

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> int:
        """The env's action for one observation (``action_space.start`` added)."""
        with torch.inference_mode():
            x = torch.as_tensor(np.asarray(obs, self.dtype))[None]
            q, self.state = self.net.step(x, self.state)
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return int(rng.integers(self.num_actions)) + self.offset
        return int(q[0].argmax()) + self.offset

    def program(self) -> ScriptedPolicy:
        """The greedy recurrent policy as a traced TorchScript program (the module
        docstring)."""
        net, observation_space, action_space = self.net, self.observation_space, self.action_space
        size = int(self.config.lstm_size)
        program = RecurrentProgram(net, int(action_space.start)).eval()
        example = (
            torch.as_tensor(np.stack([observation_space.sample() for _ in range(2)])),
            torch.zeros(2, size),
            torch.zeros(2, size),
        )
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore")  # TorchScript's deprecation; see play/export.py
            traced = torch.jit.trace(program, example)
        inside = [
            "torso, LSTM core and dueling head (state dict of the learner's online net)",
            "one step of the LSTM from the given (h, c)",
            "argmax over actions",
        ]
        if is_image_space(observation_space):
            inside.insert(
                0, f"input scaling: observations times {input_scale(observation_space):.10g}"
            )
        else:
            inside.insert(0, "observations as float32, no scaling (as the env workers)")
        output = (
            f"(action, h, c): int64 actions (B,), the LSTM state after the step, h and c "
            f"each (B, {size}); pass h and c back with the next observation"
        )
        call = (
            f"policy = torch.jit.load(path); h = c = torch.zeros(1, {size}) at each episode's "
            "start; action, h, c = policy(torch.as_tensor(obs)[None], h, c); int(action[0])"
        )
        return ScriptedPolicy(
            traced,
            inside,
            output,
            call,
            state=((1, size), (1, size)),
            module=program,
            example=example,
        )


class RecurrentProgram(torch.nn.Module):
    """``forward(obs (B, ...), h, c) -> (action (B,) int64, h, c)``."""

    def __init__(self, net: RecurrentQNetwork, action_start: int) -> None:
        super().__init__()
        self.net = net
        self.action_start = action_start

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        q, h2, c2 = self.net(obs, h, c)
        return q.argmax(dim=1) + self.action_start, h2, c2
