"""The linq agent's env worker: epsilon-greedy over the linear Q-values, n-step transitions
whose initial priorities come from the acting passes (as the Ape-X actors' do)."""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.algo.rollout.vector_nstep import VectorNStepAdder
from apex_dask.algo.rollout.worker import ActingWorker
from apex_linq.networks import NumpyLinearQ, linear_q

__all__ = ["LinQEnvWorker"]


class LinQEnvWorker(ActingWorker):
    """Envs plus an epsilon-greedy linear policy (the loop is :class:`ActingWorker`'s)."""

    def __init__(self, env_factory, *, epsilon: float, seed: int, rollout: RolloutSpec, bias=True,
                 where: str = "") -> None:  # fmt: skip
        super().__init__(env_factory, rollout, seed=seed, where=where)
        self.exploration = self.epsilon = float(epsilon)
        self.num_actions = int(self.action_space.n)
        self._action_offset = int(self.action_space.start)
        self.q = NumpyLinearQ(dict(linear_q(self.observation_space, self.action_space, bias)
                                   .state_dict()))  # fmt: skip
        self.adder = VectorNStepAdder(
            self.num_envs, rollout.n_step, rollout.gamma, self._obs_shape, self._obs_dtype,
            self.fragment_length, num_actions=self.num_actions,
        )  # fmt: skip
        self._requote = False

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        self.q = NumpyLinearQ(weights)
        self.weights_version = int(version)
        self._requote = True  # the pending steps' Q(s_t)[a_t] under the new weights

    def _values(self) -> np.ndarray:
        """One pass over the envs' states (and the time-limit finals, and after new weights
        the pending steps): the adder keeps the values; the envs' Q-values come back."""
        adder, n = self.adder, self.num_envs
        finals = len(adder.finals())
        parts = [self._obs, adder.final_obs()] if finals else [self._obs]
        pending = adder.pending_obs()[0] if self._requote else parts[0][:0]
        self._requote = False
        q = self.q(np.concatenate([*parts, pending]))
        if len(pending):
            adder.set_pending_q(q[len(q) - len(pending) :])
        adder.set_q(q[:n], q[n : n + finals] if finals else None)
        return q[:n]

    def _actions(self, t: int) -> np.ndarray:
        actions = self._values().argmax(axis=1)
        explore = self.rng.random(self.num_envs) < self.epsilon
        actions[explore] = self.rng.integers(0, self.num_actions, int(explore.sum()))
        return actions + self._action_offset

    def _end_fragment(self) -> None:
        self._values()

    def _greedy(self, obs: np.ndarray) -> int:
        return int(self.q(obs[None])[0].argmax())
