"""A DPG env worker: a deterministic policy plus per-worker noise, with initial priorities.

Usage loop (every agent's worker's)::

    worker = DPGEnvWorker(make_env_factory("Pendulum-v1"), noise_scale=0.3, seed=1,
                          rollout=RolloutSpec(), config=DPGConfig())
    worker.set_weights(*learner.get_weights())      # a DPGLearner's actor and critic
    rollout = worker.sample()
    shard.add(rollout.batch, rollout.priorities)

Acting (the loop itself is :class:`~apex_dask.algo.rollout.worker.ActingWorker`'s):
each vector step makes one actor pass over the envs' observations,
``mu(s_t)``, and acts with ``a_t = clip(mu(s_t) + sigma * x_t * half, low, high)``
(:mod:`apex_dask.algo.agents.dpg.noise`: Gaussian or Ornstein-Uhlenbeck ``x_t``, ``sigma``
this worker's rung of the ladder). Numpy forwards (:class:`NumpyDPG`), no torch.

Initial priorities come from the worker's copy of the critic, from values of
the acting step: one critic pass per step over ``(s_t, a_t)`` and
``(s_t, mu(s_t))`` gives ``Q_1(s_t, a_t)`` and ``V(s_t) = min_k Q_k(s_t, mu(s_t))``,
the latter reusing the acting pass's ``mu(s_t)``. The adder
(:class:`~apex_dask.algo.rollout.vector_nstep.VectorNStepAdder` with continuous actions)
keeps both, so at a fragment's end

    |td| = |R + discount * V(s_{t+k}) - Q_1(s_t, a_t)|

with no further pass: the learner's TD error with online = target (the synced
weights) and no target smoothing. Time limits' final observations and, after
new weights, the pending steps ride along as extra rows (as in the DQN worker),
and the pass at a fragment's end already chooses the next fragment's first
actions. :meth:`td_errors` recomputes the same from a batch (for tests).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import replace

import gymnasium as gym
import numpy as np
import torch

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dpg.networks import NumpyDPG, action_bounds, build_dpg_model
from apex_dask.algo.agents.dpg.noise import ActionNoise
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.algo.rollout.vector_nstep import VectorNStepAdder
from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["DPGEnvWorker"]


class DPGEnvWorker(ActingWorker):
    """Envs plus a noisy deterministic policy; see the module docstring.

    ``noise_scale`` (sigma) is this worker's exploration (in half ranges of the action
    space), reported as ``env/noise_scale/<i>``. Before the first
    :meth:`set_weights` the worker acts with its own random initial weights.
    """

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        *,
        noise_scale: float,
        seed: int,
        rollout: RolloutSpec | None = None,
        config: DPGConfig | None = None,
        where: str = "",
    ) -> None:
        r = rollout if rollout is not None else RolloutSpec()
        o = config if config is not None else DPGConfig()
        super().__init__(env_factory, replace(r, vector_mode="sync"), seed=seed, where=where)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_dpg_model(
                self.observation_space,
                self.action_space,
                o.actor_hiddens,
                o.critic_hiddens,
                o.twin_q,
            )
        self._center, self._half = action_bounds(self.action_space)
        self._low, self._high = self._center - self._half, self._center + self._half
        self._net = NumpyDPG(module_weights(model), self._center, self._half)
        self.exploration = self.noise_scale = float(noise_scale)
        self._action_offset = 0
        act_dim = len(self._center)
        shape = (self.num_envs, act_dim)
        self.noise = ActionNoise(o.noise, self.noise_scale, shape, self.rng, o.ou_theta)
        self.adder = VectorNStepAdder(
            self.num_envs,
            r.n_step,
            r.gamma,
            self._obs_shape,
            self._obs_dtype,
            self.fragment_length,
            action_shape=(act_dim,),
            action_dtype=np.float32,
        )
        self._next: tuple[np.ndarray, np.ndarray] | None = None  # (actions, values) cached
        self._requote = False

    # -- policy ---------------------------------------------------------
    def mu(self, obs: np.ndarray) -> np.ndarray:
        """mu(s) (B, act_dim) float32 under the synced weights."""
        return self._net.policy(obs)

    def _greedy(self, obs: np.ndarray) -> np.ndarray:
        return self._net.policy(obs[None])[0]

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """Act with these weights (a :class:`DPGLearner`'s ``get_weights()``) from now on."""
        self._net = NumpyDPG(weights, self._center, self._half)
        self.weights_version = int(version)
        self._next = None  # chosen with the old weights: chosen again
        self._requote = True  # the pending steps' values too

    # -- rollouts (the loop: ActingWorker.sample) --------------------------
    def _actions(self, t: int) -> np.ndarray:
        return self._act()

    def _episodes_ended(self, mask: np.ndarray) -> None:
        self.noise.reset(mask)

    def _end_fragment(self) -> None:
        self._act(keep=True)

    def _act(self, keep: bool = False) -> np.ndarray:
        """Noisy actions for the envs' observations; their values (and those of the last
        step's final observations and, after new weights, the pending steps) to the adder.
        ``keep``: the pass at a fragment's end, kept for the next fragment's first step."""
        n, adder = self.num_envs, self.adder
        cached, self._next = self._next, None
        finals = len(adder.finals())
        if cached is not None and not finals:
            adder.set_q(cached[1])
            return cached[0]
        states = [self._obs, adder.final_obs()] if finals else [self._obs]
        pending_obs = pending_act = None
        if self._requote:
            self._requote = False
            pending_obs, pending_act = adder.pending_obs()
            if len(pending_act):
                states.append(pending_obs)
            else:
                pending_obs = None
        obs = np.concatenate(states) if len(states) > 1 else states[0]
        mu = self._net.policy(obs)
        noisy = mu[:n] + self.noise.sample() * self._half
        actions = np.clip(noisy, self._low, self._high).astype(np.float32)
        # one critic pass: Q_1(s_t, a_t) of the envs, then V of every state, then the
        # pending steps' Q_1(s, a) with their stored actions
        c_obs, c_act = [self._obs, obs], [actions, mu]
        if pending_obs is not None:
            c_obs.append(pending_obs)
            c_act.append(pending_act)
        q1, qmin = self._net.values(np.concatenate(c_obs), np.concatenate(c_act))
        m = len(obs)
        value = qmin[n : n + m]
        q_envs = np.stack([q1[:n], value[:n]], axis=1)
        q_finals = np.stack([value[n : n + finals]] * 2, axis=1) if finals else None
        adder.set_q(q_envs, q_finals)
        if pending_obs is not None:
            adder.set_pending_q(np.stack([q1[n + m :], value[n + finals :]], axis=1))
        if keep:
            self._next = (actions, q_envs)
        return actions

    def td_errors(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 |td| of a batch under the synced weights (online = target, no smoothing),
        from new passes: what :meth:`sample`'s priorities equal."""
        if len(batch["action"]) == 0:
            return np.zeros(0, np.float32)
        q1, _ = self._net.values(batch["obs"], batch["action"])
        _, v_next = self._net.values(batch["next_obs"], self._net.policy(batch["next_obs"]))
        y = batch["reward"] + batch["discount"] * v_next
        return np.abs(q1 - y).astype(np.float32)
