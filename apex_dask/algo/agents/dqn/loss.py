"""The n-step double-DQN losses of each value head and their new replay priorities.

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

Every loss takes an optional ``online_next``: the network whose values at s' choose
``a*`` (default: ``online``). With noisy layers the learner passes the online net
under a noise sample of its own (:func:`~apex_dask.algo.agents.noisy.noise_twin`), so
Q(s, a), the argmax at s' and the target's value use three independent samples, as in
NoisyNet's double-DQN loss (Fortunato et al. 2018, eq. 16).

The distributional heads (:mod:`apex_dask.algo.agents.dqn.heads` has their maths) take
the networks' ``logits`` (B, A, K) and choose ``a*`` by the expected values:

* :func:`c51_loss`: ``L = (1/B) sum_i w_i * CE_i``, ``CE_i = -sum_j m_ij log p_j(s_i, a_i)``
  with ``m_i`` the projection of ``R_i + discount_i * z`` under the target net's
  ``p(s'_i, a*)``; the new priority is ``CE_i`` (as Rainbow prioritises by its
  distributional loss).
* :func:`hl_gauss_loss`: ``y`` as above on the expected values, ``CE_i`` against the
  HL-Gauss histogram of ``y_i``; the new priority is ``|Q(s_i, a_i) - y_i|`` on the
  expected value.

``mean_q`` is the mean expected Q(s, a) of the replayed actions for every head.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import numpy as np
import torch
from torch import nn

from apex_dask.algo.agents.dqn.heads import categorical_projection, hl_gauss_target
from apex_dask.algo.agents.losses import LossOutput, weighted_td_loss

__all__ = ["c51_loss", "dqn_loss", "hl_gauss_loss", "q_targets", "td_errors_numpy"]

Logits = Callable[[torch.Tensor], torch.Tensor]
"""A network's ``logits``: observations -> (B, A, K)."""


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
    online_next: nn.Module | None = None,
) -> LossOutput:
    """Weighted Huber loss of the n-step (double) DQN target; see the module docstring.

    ``batch`` holds tensors ``obs, action (int64), reward, next_obs, discount``.
    """
    q = online(batch["obs"])
    q_taken = q.gather(1, batch["action"].long().unsqueeze(1)).squeeze(1)
    with torch.no_grad():
        q_next_target = target(batch["next_obs"])
        chooser = online if online_next is None else online_next
        q_next_online = chooser(batch["next_obs"]) if double_q else None
        y = q_targets(q_next_online, q_next_target, batch["reward"], batch["discount"], double_q)
    td = q_taken - y
    loss = weighted_td_loss(td, weights, delta=huber_delta)
    return LossOutput(loss=loss, td_abs=td.detach().abs(), mean_q=q_taken.detach().mean())


def _rows(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[i, index[i]]`` of (B, A, K) outputs: (B, K)."""
    return x[torch.arange(x.shape[0], device=x.device), index.long()]


def _taken_log_probs(logits: Logits, batch: Mapping[str, torch.Tensor]) -> torch.Tensor:
    """log p(s, a) (B, K) of the replayed actions: the log-softmax of their logits only
    (the other actions' distributions take no part in the loss or its gradient)."""
    return torch.log_softmax(_rows(logits(batch["obs"]).float(), batch["action"]), dim=1)


def _next_probs(
    pick: Logits,
    next_logits: torch.Tensor,
    next_obs: torch.Tensor,
    values: torch.Tensor,
    double_q: bool,
) -> torch.Tensor:
    """The target's probabilities (B, K) at a*: a* by the expected values of ``pick``'s
    distributions at s' (double Q), else of the target's (``next_logits`` (B, A, K));
    one softmax of the target's row at a*."""
    chooser = pick(next_obs).float() if double_q else next_logits
    best = (torch.softmax(chooser, dim=2) @ values).argmax(dim=1)
    return torch.softmax(_rows(next_logits, best), dim=1)


def c51_loss(
    online: Logits,
    target: Logits,
    batch: Mapping[str, torch.Tensor],
    weights: torch.Tensor,
    atoms: torch.Tensor,
    *,
    double_q: bool = True,
    bounds: tuple[float, float] | None = None,
    online_next: Logits | None = None,
) -> LossOutput:
    """C51's weighted cross-entropy; ``td_abs`` holds each item's cross-entropy (the new
    priorities). ``online`` / ``target``: the networks' ``logits``; ``atoms`` (N,);
    ``bounds``: ``(v_min, v_max)`` as numbers (no device sync to read them)."""
    logp_taken = _taken_log_probs(online, batch)
    with torch.no_grad():
        pick = online if online_next is None else online_next
        next_logits = target(batch["next_obs"]).float()
        probs = _next_probs(pick, next_logits, batch["next_obs"], atoms, double_q)
        m = categorical_projection(probs, batch["reward"], batch["discount"], atoms, bounds)
    ce = -(m * logp_taken).sum(dim=1)
    loss = (weights * ce).mean()
    mean_q = (logp_taken.detach().exp() @ atoms).mean()
    return LossOutput(loss=loss, td_abs=ce.detach(), mean_q=mean_q)


def hl_gauss_loss(
    online: Logits,
    target: Logits,
    batch: Mapping[str, torch.Tensor],
    weights: torch.Tensor,
    centers: torch.Tensor,
    edges: torch.Tensor,
    sigma: float,
    *,
    double_q: bool = True,
    bounds: tuple[float, float] | None = None,
    online_next: Logits | None = None,
) -> LossOutput:
    """HL-Gauss's weighted cross-entropy; ``td_abs`` is |Q(s, a) - y| on the expected
    values (the new priorities). ``centers`` (K,), ``edges`` (K + 1,) of the bins."""
    logp_taken = _taken_log_probs(online, batch)
    q_taken = logp_taken.detach().exp() @ centers
    with torch.no_grad():
        pick = online if online_next is None else online_next
        next_logits = target(batch["next_obs"]).float()
        probs_next = _next_probs(pick, next_logits, batch["next_obs"], centers, double_q)
        y = batch["reward"] + batch["discount"] * (probs_next @ centers)
        probs = hl_gauss_target(y, edges, sigma, bounds)
    ce = -(probs * logp_taken).sum(dim=1)
    loss = (weights * ce).mean()
    return LossOutput(loss=loss, td_abs=(q_taken - y).abs(), mean_q=q_taken.mean())


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
