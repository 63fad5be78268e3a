"""The linq agent's learner: the learner contract of ``apex_dask.algo.agents.base``."""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from apex_dask.algo.agents.base import (
    LearnerBase,
    NonFiniteLossError,
    load_weights,
    module_weights,
    to_numpy_tree,
    to_torch_tree,
)
from apex_dask.algo.agents.config import LearnerConfig
from apex_linq.config import LinQConfig
from apex_linq.loss import td_loss
from apex_linq.networks import linear_q

__all__ = ["LinQLearner"]


class LinQLearner(LearnerBase):
    """Online and target linear Q-functions and Adam; the target copied every
    ``learner.target_update_freq`` transitions trained."""

    def __init__(
        self,
        observation_space: Any,
        action_space: Any,
        config: LinQConfig | None = None,
        learner: LearnerConfig | None = None,
        *,
        seed: int = 0,
    ) -> None:
        self.config = c = config if config is not None else LinQConfig()
        lc = self._init_shared(learner)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.online = linear_q(observation_space, action_space, c.bias).to(self.device)
        self.target = copy.deepcopy(self.online).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.online.parameters(), lr=c.lr, eps=lc.adam_eps)

    def update(
        self, data: Mapping[str, np.ndarray], weights: np.ndarray
    ) -> tuple[np.ndarray, dict[str, float]]:
        """One Adam step on a batch; ``(|td|, metrics)``."""
        batch = {
            k: torch.as_tensor(np.asarray(data[k])).to(self.device)
            for k in ("obs", "action", "reward", "next_obs", "discount")
        }
        w = torch.as_tensor(np.asarray(weights), dtype=torch.float32, device=self.device)
        loss, td, taken = td_loss(self.online, self.target, batch, w, self.config.huber_delta)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.online.parameters(), self.grad_clip)
        if not (torch.isfinite(loss) and torch.isfinite(norm)):
            raise NonFiniteLossError(f"linq update {self.num_updates + 1}: a non-finite loss")
        self.optimizer.step()
        self._count(len(w))
        if self.steps_trained - self._last_target_update >= self.target_update_freq:
            self.target.load_state_dict(self.online.state_dict())
            self.num_target_updates += 1
            self._last_target_update = self.steps_trained
        metrics = {
            "loss": float(loss.detach()),
            "mean_q": float(taken.mean()),
            "grad_norm": float(norm),
        }
        return td.detach().abs().cpu().numpy().astype(np.float32), metrics

    def agent_stats(self) -> dict[str, float]:
        """``learner/weight_norm``: the norm of the online weights (the agent's metric)."""
        return {"learner/weight_norm": float(self.online[1].weight.detach().norm())}

    def state_dict(self) -> dict[str, Any]:
        """``online``, ``target``, ``optimizer`` and ``counters`` as plain arrays."""
        return {
            "online": module_weights(self.online),
            "target": module_weights(self.target),
            "optimizer": to_numpy_tree(self.optimizer.state_dict()),
            "counters": self.counters(),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        load_weights(self.online, state["online"])
        load_weights(self.target, state["target"])
        self.optimizer.load_state_dict(to_torch_tree(state["optimizer"]))
        self._load_counters(state["counters"])
