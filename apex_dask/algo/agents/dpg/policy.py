"""The DPG agent's greedy policy: its deterministic actor mu(s), no noise.

For play, with probability ``epsilon`` a step takes a uniform random action
within the bounds. Exported (:meth:`DPGPolicy.program`), the program is the actor:
it takes observations as float32 and returns float32 action(s) within the
action space's bounds (the tanh squashing and scaling are inside).
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.base import check_weights, load_weights
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dpg.networks import NumpyDPG, action_bounds, build_dpg_model
from apex_dask.algo.agents.spec import ScriptedPolicy

__all__ = ["DPGPolicy", "DeterministicProgram"]


class DPGPolicy:
    """Actions of a ``dpg`` run's deterministic policy mu(s) (see the module docstring)."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        weights: Mapping[str, Any],
        config: DPGConfig | None = None,
    ) -> None:
        o = config if config is not None else DPGConfig()
        model = build_dpg_model(
            observation_space, action_space, o.actor_hiddens, o.critic_hiddens, o.twin_q
        )
        check_weights(model, weights)
        load_weights(model, weights)
        self.model = model.eval()
        self.observation_space, self.action_space = observation_space, action_space
        center, half = action_bounds(action_space)
        self.numpy_net = NumpyDPG({k: np.asarray(v) for k, v in weights.items()}, center, half)
        self.low, self.high = action_space.low, action_space.high
        self.shape, self.dtype = action_space.shape, action_space.dtype

    def reset(self) -> None:
        """An episode begins (nothing to reset: the policy has no state)."""

    def act(
        self, obs: Any, epsilon: float = 0.0, rng: np.random.Generator | None = None
    ) -> np.ndarray:
        """The env's action for one observation (float, the action space's shape)."""
        if epsilon > 0.0 and rng is not None and rng.random() < epsilon:
            return rng.uniform(self.low, self.high).astype(self.dtype)
        action = self.numpy_net.policy(np.asarray(obs, np.float32)[None])[0]
        return np.clip(action, self.low, self.high).astype(self.dtype).reshape(self.shape)

    def program(self) -> ScriptedPolicy:
        """The actor as TorchScript (see the module docstring)."""
        with warnings.catch_warnings(), torch.no_grad():
            warnings.simplefilter("ignore", DeprecationWarning)  # see play/export.py
            program = torch.jit.script(DeterministicProgram(self.model.actor))
        shape = list(self.action_space.shape)
        output = (
            f"float32 action(s) within the action space's bounds: {shape} for one "
            f"observation, (B, {', '.join(str(s) for s in shape)}) for a batch"
        )
        inside = [
            "observations as float32, no scaling (as the env workers)",
            "the actor's ReLU MLP (state dict of the learner's online actor)",
            "center + half * tanh(.), the action space's bounds",
        ]
        module = DeterministicProgram(self.model.actor).eval()
        example = (torch.as_tensor(np.stack([self.observation_space.sample() for _ in range(2)])),)
        return ScriptedPolicy(program, inside, output, module=module, example=example)


class DeterministicProgram(torch.nn.Module):
    """``forward(obs) -> action``: the actor on one observation (rank 1) or a batch."""

    def __init__(self, actor: torch.nn.Module) -> None:
        super().__init__()
        self.actor = actor

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        single = obs.dim() == 1
        batch = obs.unsqueeze(0) if single else obs
        actions = self.actor(batch.float())
        if single:
            return actions[0]
        return actions
