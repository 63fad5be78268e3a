"""An R2D2 env worker: epsilon-greedy over a recurrent Q-network, sequence items out.

Usage loop (every agent's worker's)::

    worker = R2D2EnvWorker(make_env_factory(POMDP_CARTPOLE_ID), epsilon=0.4, seed=1,
                           rollout=RolloutSpec(fragment_length=40), config=R2D2Config())
    worker.set_weights(*learner.get_weights())
    rollout = worker.sample()          # the sequence items completed in the fragment
    shard.add(rollout.batch, rollout.priorities)

Acting (the loop itself is :class:`~apex_dask.algo.rollout.worker.ActingWorker`'s):
each vector step makes one torch pass of the LSTM over every env's observation
from that env's recurrent state (one fused LSTM cell,
``RecurrentQNetwork.step_cell``), then per env with probability ``epsilon`` a uniform
action, else ``argmax_a Q``. The state before each step goes to the
:class:`~apex_dask.algo.agents.r2d2.sequences.SequenceAdder` with the weights
version that computed it; an env whose episode ends (or whose step failed) starts
its next one from the zero state. The states carry over fragments and weight
syncs, as R2D2's actors do (the learner's staleness metric measures the cost).

Initial priorities (``initial_priority``). ``max`` (the default): the rollout carries
no priorities and the shard gives each new sequence its largest priority so far, as
prioritized replay gives new transitions; the learner's priorities replace them once
the sequence is sampled. The worker makes no pass beyond acting, so it runs at its
env+LSTM speed. ``worker``: the items a fragment completed are scored in one batched pass
of the learner's own loss (:func:`~apex_dask.algo.agents.r2d2.loss.sequence_loss`)
with online = target = the synced weights, from each item's stored state and with
the same burn-in. They equal the learner's priorities on the same data and
weights. They are not read from the acting passes: a sequence spans weight syncs,
so its acting values come from more than one version, and the stored state must be
burned in for them to agree with the learner.

Greedy evaluation carries its own recurrent state, reset at each episode's start.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import gymnasium as gym
import numpy as np
import torch

from apex_dask.algo.agents.base import load_weights
from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.learner import batch_tensors
from apex_dask.algo.agents.r2d2.loss import sequence_loss
from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork
from apex_dask.algo.agents.r2d2.sequences import SequenceAdder
from apex_dask.algo.rollout.spec import RolloutSpec
from apex_dask.algo.rollout.worker import ActingWorker

__all__ = ["R2D2EnvWorker"]


class R2D2EnvWorker(ActingWorker):
    """Envs plus a recurrent epsilon-greedy policy; see the module docstring."""

    def __init__(
        self,
        env_factory: Callable[[], gym.Env],
        *,
        epsilon: float,
        seed: int,
        rollout: RolloutSpec | None = None,
        config: R2D2Config | None = None,
        where: str = "",
    ) -> None:
        if not 0.0 <= epsilon <= 1.0:
            raise ValueError(f"epsilon must be in [0, 1], got {epsilon!r}")
        r = rollout if rollout is not None else RolloutSpec()
        o = config if config is not None else R2D2Config()
        super().__init__(env_factory, r, seed=seed, where=where)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.net = RecurrentQNetwork(self.observation_space, self.action_space, o)
        self.net.eval().requires_grad_(False)
        self.config = o
        self.exploration = self.epsilon = float(epsilon)
        self.num_actions = int(self.action_space.n)
        self._action_offset = int(self.action_space.start)
        self.state = self.net.initial_state(self.num_envs)
        self._eval_state = self.net.initial_state(1)
        self.adder = SequenceAdder(
            self.num_envs,
            self._obs_shape,
            self._obs_dtype,
            burn_in=o.burn_in,
            trace_length=o.trace_length,
            period=o.period,
            state_size=o.lstm_size,
            priority_fn=self.priorities if o.initial_priority == "worker" else None,
        )

    def set_weights(self, version: int, weights: Mapping[str, np.ndarray]) -> None:
        """Act with these weights (an :class:`R2D2Learner`'s ``get_weights()``) from now on;
        the recurrent states carry on."""
        load_weights(self.net, weights)
        self.weights_version = int(version)

    # -- acting (the loop: ActingWorker.sample) -----------------------------
    def _actions(self, t: int) -> np.ndarray:
        h, c = self.state
        self.adder.set_states(h.numpy(), c.numpy(), self.weights_version)
        with torch.inference_mode():
            q, self.state = self.net.step_cell(torch.as_tensor(self._obs), self.state)
        actions = q.argmax(dim=1).numpy().astype(np.int64)
        explore = self.rng.random(self.num_envs) < self.epsilon
        if explore.any():
            actions[explore] = self.rng.integers(0, self.num_actions, int(explore.sum()))
        return actions + self._action_offset

    def _episodes_ended(self, mask: np.ndarray) -> None:
        keep = torch.as_tensor(~np.asarray(mask, bool), dtype=torch.float32).unsqueeze(1)
        self.state = (self.state[0] * keep, self.state[1] * keep)

    def _end_fragment(self) -> None:
        pass

    def priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """float32 priorities of sequence items under the synced weights (online = target)."""
        o = self.config
        with torch.inference_mode():
            out = sequence_loss(
                self.net,
                self.net,
                batch_tensors(batch),
                torch.ones(len(batch["action"])),
                burn_in=o.burn_in,
                n=self.rollout.n_step,
                gamma=self.rollout.gamma,
                eta=o.eta,
                eps=o.rescale_eps,
            )
        return out.priorities.numpy().astype(np.float32)

    # -- greedy evaluation ---------------------------------------------------
    def _begin_eval_episode(self) -> None:
        self._eval_state = self.net.initial_state(1)

    def _greedy(self, obs: np.ndarray) -> int:
        with torch.inference_mode():
            q, self._eval_state = self.net.step(torch.as_tensor(obs)[None], self._eval_state)
        return int(q[0].argmax())
