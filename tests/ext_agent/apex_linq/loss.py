"""The linq agent's loss: the n-step double-Q TD error, Huber-weighted.

td_i = R_i + discount_i * Q_target(s'_i, argmax_b Q_online(s'_i, b)) - Q_online(s_i, a_i)
L    = (1/B) sum_i w_i huber(td_i),  new priority |td_i|
"""

from __future__ import annotations

import torch

from apex_dask.algo.agents.losses import weighted_td_loss

__all__ = ["td_loss"]


def td_loss(online, target, batch: dict[str, torch.Tensor], weights: torch.Tensor, delta: float):
    """``(loss, td, Q(s, a))`` of a batch (see the module docstring)."""
    q = online(batch["obs"].float())
    taken = q.gather(1, batch["action"].long()[:, None])[:, 0]
    with torch.no_grad():
        q_next = online(batch["next_obs"].float())
        best = q_next.argmax(dim=1, keepdim=True)
        boot = target(batch["next_obs"].float()).gather(1, best)[:, 0]
        y = batch["reward"].float() + batch["discount"].float() * boot
    td = y - taken
    return weighted_td_loss(td, weights, delta=delta), td, taken
