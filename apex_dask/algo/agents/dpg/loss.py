"""The DPG (DDPG / TD3) critic and actor losses and their TD errors (the new priorities).

For a batch of n-step transitions (s, a, R, s', discount) (``discount`` = gamma^k,
0 after a termination), online nets mu, Q_1 (Q_2) and target nets mu', Q_1' (Q_2'):

    a'    = mu'(s')                                          (plain DDPG)
    a'    = clip(mu'(s') + clip(half * eps, -half * c, half * c), low, high)
            eps ~ N(0, sigma_t^2)                            (smooth_target_policy)
    y     = R + discount * min(Q_1'(s', a'), Q_2'(s', a'))   (twin_q; else Q_1')
    td_k  = Q_k(s, a) - y                                    (y carries no gradient)
    L_Q   = (1/B) sum_i w_i * l(td_1,i) [+ (1/B) sum_i w_i * l(td_2,i)]
    L_mu  = -(1/B) sum_i Q_1(s_i, mu(s_i))                   (only mu's weights move)

with ``l(x) = x^2 / 2`` (``use_huber=False``, RLlib's default) or the Huber loss,
``sigma_t`` = ``target_noise`` and ``c`` = ``target_noise_clip``, both in units
of the action half range ``half = (high - low) / 2``. The new priority of item
i is |td_1,i|, with y from the twin minimum.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch

from apex_dask.algo.agents.dpg.networks import DPGModel
from apex_dask.algo.agents.losses import LossOutput, weighted_td_loss

__all__ = ["actor_loss", "critic_loss", "dpg_targets", "target_actions"]


def target_actions(
    target: DPGModel,
    next_obs: torch.Tensor,
    *,
    smooth: bool,
    noise: float,
    noise_clip: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """a' of the module docstring (smoothed with clipped Gaussian noise if ``smooth``)."""
    act = target.actor(next_obs)
    if not smooth or noise == 0.0:
        return act
    half, center = target.actor.act_half, target.actor.act_center
    eps = torch.randn(act.shape, generator=generator, device="cpu").to(act.device) * noise
    eps = eps.clamp(-noise_clip, noise_clip) * half
    return torch.max(torch.min(act + eps, center + half), center - half)


def dpg_targets(
    target: DPGModel,
    batch: Mapping[str, torch.Tensor],
    *,
    smooth: bool,
    noise: float,
    noise_clip: float,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """y = R + discount * min_k Q_k'(s', a') (no gradient)."""
    with torch.no_grad():
        a_next = target_actions(
            target,
            batch["next_obs"],
            smooth=smooth,
            noise=noise,
            noise_clip=noise_clip,
            generator=generator,
        )
        q1, q2 = target.critic(batch["next_obs"], a_next)
        value = q1 if q2 is None else torch.min(q1, q2)
        return batch["reward"] + batch["discount"] * value


def critic_loss(
    online: DPGModel,
    y: torch.Tensor,
    batch: Mapping[str, torch.Tensor],
    weights: torch.Tensor,
    *,
    use_huber: bool = False,
    huber_delta: float = 1.0,
) -> LossOutput:
    """L_Q of the module docstring against the targets ``y``."""
    q1, q2 = online.critic(batch["obs"], batch["action"])
    td1 = q1 - y
    loss = weighted_td_loss(td1, weights, use_huber=use_huber, delta=huber_delta)
    if q2 is not None:
        loss = loss + weighted_td_loss(q2 - y, weights, use_huber=use_huber, delta=huber_delta)
    return LossOutput(loss=loss, td_abs=td1.detach().abs(), mean_q=q1.detach().mean())


def actor_loss(online: DPGModel, obs: torch.Tensor) -> torch.Tensor:
    """L_mu = -mean Q_1(s, mu(s)) (gradients reach the critic too: step only the actor)."""
    q1, _ = online.critic(obs, online.actor(obs))
    return -q1.mean()
