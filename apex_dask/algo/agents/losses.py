"""What the agents' losses share: the Huber function, the weighted mean, the result type.

Each agent's loss computes TD errors ``td_i`` against its own targets, then

    L = (1/B) * sum_i w_i * l(td_i)

with the importance weights ``w_i`` of prioritized replay and ``l`` the Huber
function (``huber(x) = x^2 / 2`` for ``|x| <= delta``, else ``delta * (|x| - delta / 2)``)
or the square ``x^2 / 2``. The new priority of item i is ``|td_i|``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["LossOutput", "huber", "weighted_td_loss"]


def huber(x: torch.Tensor, delta: float = 1.0) -> torch.Tensor:
    """Elementwise Huber: x^2/2 for |x| <= delta, else delta * (|x| - delta/2)."""
    ax = x.abs()
    return torch.where(ax <= delta, 0.5 * x * x, delta * (ax - 0.5 * delta))


def weighted_td_loss(
    td: torch.Tensor, weights: torch.Tensor, *, use_huber: bool = True, delta: float = 1.0
) -> torch.Tensor:
    """``(1/B) * sum_i w_i * l(td_i)``, ``l`` the Huber function or ``x^2 / 2``."""
    elementwise = huber(td, delta) if use_huber else 0.5 * td * td
    return (weights * elementwise).mean()


@dataclass
class LossOutput:
    """What one loss evaluation yields."""

    loss: torch.Tensor
    """Scalar weighted loss (differentiable w.r.t. the online net)."""
    td_abs: torch.Tensor
    """|td| per item, detached: the new priorities."""
    mean_q: torch.Tensor
    """Mean Q(s, a) of the replayed actions, detached."""
