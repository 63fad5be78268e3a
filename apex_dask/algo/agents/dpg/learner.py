"""The Ape-X DPG learner: DDPG with TD3's config, one update per replayed batch.

The learner contract of :mod:`apex_dask.algo.agents.base`, so the learner actor,
the in-process runner, checkpoints and metrics take it as they take DQN's::

    learner = DPGLearner(obs_space, act_space, DPGConfig(twin_q=True, policy_delay=2))
    td_abs, metrics = learner.update(sample.data, sample.weights)
    shard.update_priorities(sample.indices, td_abs, sample.generations)
    version, weights = learner.get_weights()     # actor and critic, one flat dict

Each update (maths in :mod:`apex_dask.algo.agents.dpg.loss`):

1. one Adam step of the critic on the importance-weighted loss L_Q, its global
   gradient norm clipped to ``grad_clip``; the new priorities are |td_1|;
2. every ``policy_delay``-th update, one Adam step of the actor on L_mu (norm
   clipped the same way), then the targets move when due: with ``tau < 1``
   soft, ``theta' <- tau * theta + (1 - tau) * theta'`` at every actor step;
   with ``tau = 1`` a copy once ``target_update_freq`` transitions were trained
   since the last one (RLlib's periodic update).

``steps_trained`` counts transitions; ``version`` grows by one per update. A
non-finite loss or gradient norm raises
:class:`~apex_dask.algo.agents.base.NonFiniteLossError` before that net's step.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from gymnasium import spaces

from apex_dask.algo.agents.base import (
    LearnerBase,
    NonFiniteLossError,
    load_weights,
    module_weights,
    to_numpy_tree,
    to_torch_tree,
)
from apex_dask.algo.agents.config import LearnerConfig
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dpg.loss import actor_loss, critic_loss, dpg_targets
from apex_dask.algo.agents.dpg.networks import build_dpg_model

__all__ = ["DPGLearner"]


class DPGLearner(LearnerBase):
    """Actor, critic, their targets and two Adam optimizers; see the module docstring."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        config: DPGConfig | None = None,
        learner: LearnerConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        o = config if config is not None else DPGConfig()
        lc = self._init_shared(learner)
        if o.policy_delay < 1:
            raise ValueError(f"policy_delay must be >= 1, got {o.policy_delay}")
        if not 0.0 < o.tau <= 1.0:
            raise ValueError(f"tau must be in (0, 1], got {o.tau}")
        self.policy_delay, self.tau = int(o.policy_delay), float(o.tau)
        self.smooth = bool(o.smooth_target_policy)
        self.target_noise, self.target_noise_clip = (
            float(o.target_noise),
            float(o.target_noise_clip),
        )
        self.use_huber = bool(o.use_huber)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = build_dpg_model(
                observation_space, action_space, o.actor_hiddens, o.critic_hiddens, o.twin_q
            )
        self.online = model.to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.actor_optimizer = torch.optim.Adam(
            self.online.actor.parameters(), lr=o.actor_lr, eps=lc.adam_eps
        )
        self.critic_optimizer = torch.optim.Adam(
            self.online.critic.parameters(), lr=o.critic_lr, eps=lc.adam_eps
        )
        self._noise_gen = torch.Generator().manual_seed(int(seed) + 1)

    def _tensor(self, arr: np.ndarray, dtype: torch.dtype = torch.float32) -> torch.Tensor:
        return torch.as_tensor(np.asarray(arr)).to(self.device, dtype=dtype, non_blocking=True)

    def _step(self, loss: torch.Tensor, params: Any, optimizer: torch.optim.Optimizer, what: str):
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(params, self.grad_clip)
        value, norm_value = (float(x) for x in torch.stack([loss.detach(), norm]).cpu().tolist())
        if not (math.isfinite(value) and math.isfinite(norm_value)):
            raise NonFiniteLossError(
                f"non-finite {what} loss ({value}) or gradient norm ({norm_value}) at update "
                f"{self.num_updates + 1} (after {self.steps_trained} transitions trained); "
                f"the weights of update {self.num_updates} are kept"
            )
        optimizer.step()
        return value, norm_value

    def update(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One update on a replayed batch (``obs, action, reward, next_obs, discount``).

        Returns float32 |td_1| per item (before the step: the new priorities) and
        ``{"loss", "mean_q", "grad_norm"}`` of the critic (norm before clipping),
        plus ``actor_loss`` on the updates that step the actor.
        """
        batch = {k: self._tensor(data[k]) for k in ("obs", "action", "reward", "next_obs")}
        batch["discount"] = self._tensor(data["discount"])
        w = self._tensor(weights)
        y = dpg_targets(
            self.target,
            batch,
            smooth=self.smooth,
            noise=self.target_noise,
            noise_clip=self.target_noise_clip,
            generator=self._noise_gen,
        )
        out = critic_loss(self.online, y, batch, w, use_huber=self.use_huber)
        critic = self.online.critic
        loss, norm = self._step(out.loss, critic.parameters(), self.critic_optimizer, "critic")
        metrics = {"loss": loss, "mean_q": float(out.mean_q), "grad_norm": norm}
        if (self.num_updates + 1) % self.policy_delay == 0:
            critic.requires_grad_(False)  # the actor's loss moves the actor only
            try:
                a_loss = actor_loss(self.online, batch["obs"])
                metrics["actor_loss"], _ = self._step(
                    a_loss, self.online.actor.parameters(), self.actor_optimizer, "actor"
                )
            finally:
                critic.requires_grad_(True)
            self._maybe_update_target(len(weights))
        self._count(len(weights))
        return out.td_abs.to("cpu").numpy().astype(np.float32, copy=False), metrics

    def _maybe_update_target(self, batch_size: int) -> None:
        if self.tau < 1.0:
            self.update_target()
        elif self.steps_trained + batch_size - self._last_target_update >= self.target_update_freq:
            self.update_target(self.steps_trained + batch_size)

    def update_target(self, at: int | None = None) -> None:
        """Move the targets now: theta' <- tau * theta + (1 - tau) * theta' (a copy at tau 1)."""
        with torch.no_grad():
            if self.tau >= 1.0:
                self.target.load_state_dict(self.online.state_dict())
            else:
                for t, o in zip(self.target.parameters(), self.online.parameters(), strict=True):
                    t.lerp_(o, self.tau)
        self.num_target_updates += 1
        self._last_target_update = self.steps_trained if at is None else at

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of CPU numpy arrays: ``online``, ``target``, ``optimizer``
        (``actor`` and ``critic``), ``counters``, ``noise_rng`` (the smoothing noise's state)."""
        return {
            "online": module_weights(self.online),
            "target": module_weights(self.target),
            "optimizer": {
                "actor": to_numpy_tree(self.actor_optimizer.state_dict()),
                "critic": to_numpy_tree(self.critic_optimizer.state_dict()),
            },
            "counters": self.counters(),
            "noise_rng": self._noise_gen.get_state().numpy(),  # the target smoothing draws
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned (nets, optimizers, counters)."""

        load_weights(self.online, state["online"])
        load_weights(self.target, state["target"])
        self.actor_optimizer.load_state_dict(to_torch_tree(state["optimizer"]["actor"]))
        self.critic_optimizer.load_state_dict(to_torch_tree(state["optimizer"]["critic"]))
        self._load_counters(state["counters"])
        if "noise_rng" in state:
            self._noise_gen.set_state(torch.as_tensor(np.asarray(state["noise_rng"], np.uint8)))
