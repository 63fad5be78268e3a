"""The R2D2 learner: one update per replayed batch of sequence items.

The learner contract of :mod:`apex_dask.algo.agents.base`, so the learner actor, the
in-process runner, checkpoints and metrics take it as they take DQN's::

    learner = R2D2Learner(obs_space, act_space, R2D2Config())
    priorities, metrics = learner.update(sample.data, sample.weights)
    shard.update_priorities(sample.indices, priorities, sample.generations)

Each update (maths in :mod:`apex_dask.algo.agents.r2d2.loss`): both nets unroll
from the stored states with burn-in, n-step double-Q targets through h, one Adam
step on the importance-weighted squared TD loss of the trained steps (the global
gradient norm clipped to ``grad_clip``); the new priorities are
``eta * max|td| + (1 - eta) * mean|td|`` per item. The target net is a copy of the
online net made every ``target_update_freq`` steps trained.

``steps_trained`` counts the real trained steps (so replay ratios stay in env
steps); ``version`` grows by one per update. :meth:`agent_stats` reports
``learner/state_staleness``: the mean age, in updates, of the stored states of the
last batches (the learner's version minus the weights version that computed each
state). A non-finite loss or gradient norm raises
:class:`~apex_dask.algo.agents.base.NonFiniteLossError` before the step.
"""

from __future__ import annotations

import copy
import math
from collections import deque
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
from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.loss import sequence_loss
from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork

__all__ = ["R2D2Learner", "batch_tensors"]

FLOAT_KEYS = ("reward", "done", "mask", "first", "state")


def batch_tensors(data: Mapping[str, np.ndarray], device: str = "cpu") -> dict[str, torch.Tensor]:
    """The sequence keys the loss reads, as tensors on ``device``."""
    out = {k: torch.as_tensor(np.asarray(data[k]), dtype=torch.float32) for k in FLOAT_KEYS}
    out["obs"] = torch.as_tensor(np.asarray(data["obs"]))
    out["next_obs"] = torch.as_tensor(np.asarray(data["next_obs"]))
    out["action"] = torch.as_tensor(np.asarray(data["action"]), dtype=torch.int64)
    return {k: v.to(device) for k, v in out.items()}


class R2D2Learner(LearnerBase):
    """Online and target recurrent Q-nets and Adam; see the module docstring."""

    def __init__(
        self,
        observation_space: spaces.Space,
        action_space: spaces.Space,
        config: R2D2Config | None = None,
        learner: LearnerConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        o = config if config is not None else R2D2Config()
        self.config = o
        self.learner = lc = self._init_shared(learner)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            net = RecurrentQNetwork(observation_space, action_space, o)
        self.online = net.to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=o.lr, eps=lc.adam_eps)
        self._staleness: deque[float] = deque(maxlen=20)

    def loss(self, data: Mapping[str, np.ndarray], weights: np.ndarray):
        """The :class:`~apex_dask.algo.agents.r2d2.loss.SequenceLoss` of a batch now."""
        o = self.config
        batch = batch_tensors(data, self.device)
        w = torch.as_tensor(np.asarray(weights), dtype=torch.float32, device=self.device)
        return sequence_loss(
            self.online,
            self.target,
            batch,
            w,
            burn_in=o.burn_in,
            n=self.learner.n_step,
            gamma=self.learner.gamma,
            eta=o.eta,
            eps=o.rescale_eps,
        )

    def update(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One update; float32 priorities per item (before the step) and
        ``{"loss", "mean_q", "grad_norm"}`` (the norm before clipping)."""
        out = self.loss(data, weights)
        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        value, norm_value = (float(x) for x in torch.stack([out.loss.detach(), norm]).cpu())
        if not (math.isfinite(value) and math.isfinite(norm_value)):
            raise NonFiniteLossError(
                f"non-finite loss ({value}) or gradient norm ({norm_value}) at update "
                f"{self.num_updates + 1} (after {self.steps_trained} steps trained); "
                f"the weights of update {self.num_updates} are kept"
            )
        self.optimizer.step()
        versions = np.maximum(np.asarray(data["state_version"], np.int64), 0)
        self._staleness.append(float(np.mean(self.version - versions)))
        steps = int(np.asarray(data["mask"])[:, self.config.burn_in :].sum())
        if self.steps_trained + steps - self._last_target_update >= self.target_update_freq:
            self.update_target(self.steps_trained + steps)
        self._count(steps)
        metrics = {"loss": value, "mean_q": float(out.mean_q), "grad_norm": norm_value}
        return out.priorities.cpu().numpy().astype(np.float32), metrics

    def update_target(self, at: int | None = None) -> None:
        """Copy the online net to the target net now (``at``: the steps trained it counts
        from; default now)."""
        self.target.load_state_dict(self.online.state_dict())
        self.num_target_updates += 1
        self._last_target_update = self.steps_trained if at is None else at

    def agent_stats(self) -> dict[str, float]:
        """``learner/state_staleness`` (see the module docstring); NaN before an update."""
        s = self._staleness
        return {"learner/state_staleness": float(np.mean(s)) if s else math.nan}

    def state_dict(self) -> dict[str, Any]:
        """Plain dict of CPU numpy arrays: nets, optimizer, counters."""
        counters = self.counters()
        return {
            "online": module_weights(self.online),
            "target": module_weights(self.target),
            "optimizer": to_numpy_tree(self.optimizer.state_dict()),
            "counters": counters,
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore what :meth:`state_dict` returned."""
        load_weights(self.online, state["online"])
        load_weights(self.target, state["target"])
        self.optimizer.load_state_dict(to_torch_tree(state["optimizer"]))
        self._load_counters(state["counters"])
