"""The DQN agent's greedy policy: for playing episodes, and as a TorchScript program.

With probability ``epsilon`` a step takes a uniform random action, else
``argmax_a Q(s, a)`` (for C51 and HL-Gauss the expected value; noisy layers at their
mean weights). Vector observations run through the numpy MLP
(:class:`~apex_dask.algo.agents.dqn.networks.NumpyMLPQ`, as the env workers do),
images through torch.

The exported program (:meth:`QPolicy.program`) is the Q-network with what the
env worker applies to an observation inside it (the input scaling from the
space's bounds, :func:`~apex_dask.algo.agents.dqn.networks.input_scale`, and the
HWC -> CHW permutation), then ``argmax`` and the action space's ``start``. It
takes the env's observations as the env returns them, in the space's dtype or
any numeric one: one observation gives a 0-d int64 tensor, a batch ``(B,)``.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.base import check_weights, load_weights
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.networks import (
    NumpyMLPQ,
    input_scale,
    is_image_space,
    q_network,
)
from apex_dask.algo.agents.spec import ScriptedPolicy

__all__ = ["GreedyProgram", "QPolicy"]


class QPolicy:
    """Actions from trained weights for one pair of spaces (see the module docstring)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
        config: DQNConfig | None = None,
    ) -> None:
        o = config if config is not None else DQNConfig()
        self.config = o
        self.observation_space, self.action_space = observation_space, action_space
        self.net = q_network(observation_space, action_space, o)
        check_weights(self.net, weights)
        load_weights(self.net, weights)
        self.net.eval()
        self.numpy_net = None
        if len(observation_space.shape) == 1:
            self.numpy_net = NumpyMLPQ({k: np.asarray(v) for k, v in weights.items()}, o)
        self.num_actions = int(action_space.n)
        self.offset = int(action_space.start)
        self.dtype = observation_space.dtype

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        """float32 Q-values (B, A) of a batch of observations."""
        if self.numpy_net is not None:
            return self.numpy_net.q_values(np.asarray(obs, np.float32))
        with torch.inference_mode():
            return self.net(torch.as_tensor(np.asarray(obs, self.dtype))).numpy()

    def reset(self) -> None:
        """An episode begins (nothing to reset: the policy has no state)."""

    def act(self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None) -> int:
        """The env's action for one observation (``action_space.start`` added)."""
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return int(rng.integers(self.num_actions)) + self.offset
        q = self.q_values(np.asarray(obs, self.dtype)[None])[0]
        return int(np.argmax(q)) + self.offset

    def program(self) -> ScriptedPolicy:
        """The greedy policy as TorchScript (see the module docstring)."""
        observation_space, action_space = self.observation_space, self.action_space
        config, net = self.config, self.net
        example = torch.as_tensor(np.stack([observation_space.sample() for _ in range(2)]))
        rank = len(observation_space.shape)
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", DeprecationWarning)  # see play/export.py
            traced = torch.jit.trace(net, example)
            program = torch.jit.script(GreedyProgram(traced, rank, int(action_space.start)))
        inside = ["Q-network (state dict of the learner's online net)", "argmax over actions"]
        if config.head != "scalar":
            k = config.num_outputs
            what = "atoms" if config.head == "c51" else "bins"
            inside.insert(
                1,
                f"Q = expected value of the softmax over {k} {what} on "
                f"[{config.v_min:g}, {config.v_max:g}] ({config.head})",
            )
        if config.noisy:
            inside.insert(1, "noisy layers at their mean weights (no noise)")
        if is_image_space(observation_space):
            scale = input_scale(observation_space)
            inside.insert(0, f"input scaling: observations as float32 times {scale:.10g}")
            if rank == 3 and getattr(net, "channels_last", False):
                inside.insert(1, "HWC -> CHW permutation")
        else:
            inside.insert(0, "observations as float32, no scaling (as the env workers)")
        if action_space.start:
            inside.append(f"plus the action space's start ({int(action_space.start)})")
        output = "int64 action(s): a 0-d tensor for one observation, (B,) for a batch"
        module = GreedyProgram(net, rank, int(action_space.start)).eval()
        return ScriptedPolicy(program, inside, output, module=module, example=(example,))


class GreedyProgram(torch.nn.Module):
    """``forward(obs) -> action``: one observation (rank of the space) or a batch."""

    def __init__(self, q: torch.nn.Module, obs_rank: int, action_start: int) -> None:
        super().__init__()
        self.q = q
        self.obs_rank = obs_rank
        self.action_start = action_start

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        single = obs.dim() == self.obs_rank
        batch = obs.unsqueeze(0) if single else obs
        actions = torch.argmax(self.q(batch), dim=1) + self.action_start
        if single:
            return actions[0]
        return actions
