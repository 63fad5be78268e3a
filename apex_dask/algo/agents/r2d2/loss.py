"""R2D2's maths: value rescaling, n-step double-Q targets over a sequence, burn-in,
the loss and the sequence priorities. Pure torch; the learner and the env workers
call the same functions, so their priorities agree on the same data and weights.

**Value rescaling** (Pohlen et al. 2018), with ``eps`` = 1e-3::

    h(x)      = sign(x) * (sqrt(|x| + 1) - 1) + eps * x
    h^-1(y)   = sign(y) * (((sqrt(1 + 4 eps (|y| + 1 + eps)) - 1) / (2 eps))^2 - 1)

**A sequence item** (:mod:`apex_dask.algo.agents.r2d2.sequences`) holds ``T = B + L``
steps (``B`` burn-in, ``L`` trace): ``obs`` (T, ...), ``next_obs`` (the observation
after step T-1), ``action``, ``reward``, ``done`` (terminated at that step), ``mask``
(1.0 for a real step, 0.0 for padding), ``first`` (1.0 where an episode begins) and
``state`` (2, H): the LSTM's ``(h, c)`` before step 0, as the env worker had it.

**Unroll with burn-in.** Both nets unroll over the ``T + 1`` observations from the
stored state; steps ``0 .. B-1`` run under ``torch.no_grad()`` and their final state
is detached, so no gradient reaches the burn-in steps or the stored state.

**Targets.** The real steps of an item are contiguous. For a real step ``t`` let
``c_t = sum_{k<n} mask_{t+k}`` (steps left in the item, at most ``n``),
``j = t + c_t`` and ``term_t = max_{k<c_t} done_{t+k}``. Then

    G_t = sum_{k<c_t} gamma^k r_{t+k}
          + gamma^{c_t} (1 - term_t) h^-1(Q_target(o_j, argmax_a Q_online(o_j, a)))
    y_t = h(G_t),   td_t = y_t - Q_online(o_t, a_t)

(``o_T`` is ``next_obs``; an episode's final observation sits right after its last
real step, so a time limit bootstraps from it and a termination does not).

**Loss and priorities** over the trained steps ``t >= B`` with ``mask_t = 1``
(``M`` of them per item, at least one): per item ``l = sum 0.5 td_t^2 / M``, the
batch loss ``mean_i(w_i * l_i)`` with the importance weights ``w``, and

    p = eta * max_t |td_t| + (1 - eta) * mean_t |td_t|.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork

__all__ = [
    "SequenceLoss",
    "nstep_returns",
    "sequence_loss",
    "sequence_priorities",
    "unroll_with_burn_in",
    "value_rescale",
    "value_rescale_inv",
]


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x."""
    return torch.sign(x) * (torch.sqrt(torch.abs(x) + 1.0) - 1.0) + eps * x


def value_rescale_inv(y: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(y), the closed form (see the module docstring); exact for ``eps`` > 0."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (torch.abs(y) + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(y) * (root * root - 1.0)


def nstep_returns(
    reward: torch.Tensor,
    done: torch.Tensor,
    mask: torch.Tensor,
    boot: torch.Tensor,
    n: int,
    gamma: float,
) -> torch.Tensor:
    """``G_t`` of the module docstring, ``(B, T)``, from ``reward``, ``done``, ``mask``
    ``(B, T)`` and the bootstrap values ``boot`` ``(B, T + 1)`` (already h^-1'd)."""
    b, t = reward.shape
    pad = reward.new_zeros(b, n)
    m = torch.cat([mask, pad], dim=1)
    r = torch.cat([reward * mask, pad], dim=1)
    d = torch.cat([done * mask, pad], dim=1)
    ret = reward.new_zeros(b, t)
    count = reward.new_zeros(b, t)
    term = reward.new_zeros(b, t)
    for k in range(n):
        ret = ret + (gamma**k) * r[:, k : k + t]
        count = count + m[:, k : k + t]
        term = torch.maximum(term, d[:, k : k + t])
    index = torch.arange(t, device=reward.device).unsqueeze(0) + count.long()
    value = boot.gather(1, index)
    return ret + torch.pow(torch.full_like(count, gamma), count) * (1.0 - term) * value


def sequence_priorities(td_abs: torch.Tensor, trained: torch.Tensor, eta: float) -> torch.Tensor:
    """``eta * max|td| + (1 - eta) * mean|td|`` per item over the ``trained`` steps."""
    count = trained.sum(dim=1).clamp(min=1.0)
    masked = td_abs * trained
    return eta * masked.max(dim=1).values + (1.0 - eta) * masked.sum(dim=1) / count


def unroll_with_burn_in(
    net: RecurrentQNetwork,
    obs: torch.Tensor,
    state: tuple[torch.Tensor, torch.Tensor],
    first: torch.Tensor,
    burn_in: int,
) -> torch.Tensor:
    """Q-values ``(B, T + 1, |A|)``: the first ``burn_in`` steps without gradient (their
    values detached), the rest with it, from the detached state burn-in reached."""
    if burn_in > 0:
        with torch.no_grad():
            q0, after = net.unroll(obs[:, :burn_in], state, first[:, :burn_in])
        after = (after[0].detach(), after[1].detach())
        q1, _ = net.unroll(obs[:, burn_in:], after, first[:, burn_in:], stored=state)
        return torch.cat([q0.detach(), q1], dim=1)
    q, _ = net.unroll(obs, state, first)
    return q


@dataclass(frozen=True)
class SequenceLoss:
    """The batch loss, each item's priority, the mean trained Q and the per-step |td|."""

    loss: torch.Tensor
    priorities: torch.Tensor
    mean_q: torch.Tensor
    td_abs: torch.Tensor


def sequence_loss(
    online: RecurrentQNetwork,
    target: RecurrentQNetwork,
    batch: Mapping[str, torch.Tensor],
    weights: torch.Tensor,
    *,
    burn_in: int,
    n: int,
    gamma: float,
    eta: float,
    eps: float,
) -> SequenceLoss:
    """The loss and priorities of a batch of sequence items (the module docstring);
    ``batch`` holds tensors of the item keys (``state`` (B, 2, H))."""
    obs = torch.cat([batch["obs"], batch["next_obs"].unsqueeze(1)], dim=1)
    first = torch.cat([batch["first"], batch["first"].new_zeros(len(obs), 1)], dim=1)
    state = (batch["state"][:, 0].contiguous(), batch["state"][:, 1].contiguous())
    q = unroll_with_burn_in(online, obs, state, first, burn_in)
    with torch.no_grad():
        q_target = unroll_with_burn_in(target, obs, state, first, burn_in)
        best = q.detach().argmax(dim=2, keepdim=True)
        boot = value_rescale_inv(q_target.gather(2, best).squeeze(2), eps)
        y = value_rescale(
            nstep_returns(batch["reward"], batch["done"], batch["mask"], boot, n, gamma), eps
        )
    q_taken = q[:, :-1].gather(2, batch["action"].long().unsqueeze(2)).squeeze(2)
    td = y - q_taken
    trained = batch["mask"].clone()
    trained[:, :burn_in] = 0.0
    count = trained.sum(dim=1).clamp(min=1.0)
    per_item = (0.5 * td.pow(2) * trained).sum(dim=1) / count
    td_abs = td.detach().abs()
    return SequenceLoss(
        loss=(weights * per_item).mean(),
        priorities=sequence_priorities(td_abs, trained, eta),
        mean_q=(q_taken.detach() * trained).sum() / trained.sum().clamp(min=1.0),
        td_abs=td_abs,
    )
