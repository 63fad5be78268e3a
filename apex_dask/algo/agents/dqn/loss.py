"""The n-step double-DQN loss and its TD errors (the new replay priorities).

For a batch of n-step transitions (s, a, R, s', discount) from
:mod:`apex_dask.algo.rollout.nstep` (``discount`` = gamma^k, or 0 after termination):

    a*  = argmax_b Q_online(s', b)                (double_q=True)
    y   = R + discount * Q_target(s', a*)
    y   = R + discount * max_b Q_target(s', b)    (double_q=False)
    td  = Q_online(s, a) - y                       (y carries no gradient)
    L   = (1/B) * sum_i w_i * huber(td_i)          (apex_dask.algo.agents.losses)

with importance weights w_i from prioritized replay. The new priority of item
i is |td_i| (the replay shard adds its eps). The same maths in numpy
(:func:`td_errors_numpy`) gives env workers their initial priorities.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch
from torch import nn

from apex_dask.algo.agents.losses import LossOutput, weighted_td_loss

__all__ = ["dqn_loss", "q_targets", "td_errors_numpy"]


def q_targets(
    q_next_online: torch.Tensor | None,
    q_next_target: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    double_q: bool = True,
) -> torch.Tensor:
    """y = R + discount * Q_target(s', argmax Q_online(s')), or max Q_target(s') if not double."""
    if double_q:
        if q_next_online is None:
            raise ValueError("double_q=True needs the online Q-values of s'")
        best = q_next_online.argmax(dim=1, keepdim=True)
        next_value = q_next_target.gather(1, best).squeeze(1)
    else:
        next_value = q_next_target.max(dim=1).values
    return reward + discount * next_value


def dqn_loss(
    online: nn.Module,
    target: nn.Module,
    batch: Mapping[str, torch.Tensor],
    weights: torch.Tensor,
    *,
    double_q: bool = True,
    huber_delta: float = 1.0,
) -> LossOutput:
    """Weighted Huber loss of the n-step (double) DQN target; see the module docstring.

    ``batch`` holds tensors ``obs, action (int64), reward, next_obs, discount``.
    """
    q = online(batch["obs"])
    q_taken = q.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        q_next_target = target(batch["next_obs"])
        q_next_online = online(batch["next_obs"]) if double_q else None
        y = q_targets(q_next_online, q_next_target, batch["reward"], batch["discount"], double_q)
    td = q_taken - y
    loss = weighted_td_loss(td, weights, delta=huber_delta)
    return LossOutput(loss=loss, td_abs=td.detach().abs(), mean_q=q_taken.detach().mean())


def td_errors_numpy(
    q: np.ndarray,
    q_next_online: np.ndarray | None,
    q_next_target: np.ndarray,
    action: np.ndarray,
    reward: np.ndarray,
    discount: np.ndarray,
    double_q: bool = True,
) -> np.ndarray:
    """|Q(s, a) - y| as float32, with y as in :func:`q_targets`, from numpy Q-value arrays."""
    rows = np.arange(len(action))
    if double_q:
        if q_next_online is None:
            raise ValueError("double_q=True needs the online Q-values of s'")
        next_value = q_next_target[rows, np.argmax(q_next_online, axis=1)]
    else:
        next_value = q_next_target.max(axis=1)
    y = reward + discount * next_value
    return np.abs(q[rows, action] - y).astype(np.float32)
