"""The DPG agent's config (``dpg:`` in YAML, ``dpg.<key>`` with ``--set``): Ape-X DPG, DDPG
with TD3's options, Gaussian or Ornstein-Uhlenbeck noise per env worker.

It is the one object the agent's learner, env workers and policy read (beside the
shared ``learner`` section: ``batch_size``, ``gamma``, ``n_step``, ``grad_clip``,
``adam_eps``, ``target_update_freq``, ``device``, ...).
"""

from __future__ import annotations

from dataclasses import dataclass

from apex_dask.algo.agents.config import (
    AgentConfig,
    Problem,
    first,
    layer_sizes,
    nonneg,
    positive,
    unit,
)

__all__ = ["NOISES", "DPGConfig"]

NOISES = ("gaussian", "ou")
"""Exploration noises of the env workers."""


@dataclass(frozen=True)
class DPGConfig(AgentConfig):
    """Ape-X DPG: DDPG with TD3's options, Gaussian or Ornstein-Uhlenbeck noise per worker."""

    network_keys = ("actor_hiddens", "critic_hiddens", "twin_q")

    actor_hiddens: tuple[int, ...] = (256, 256)
    """ReLU layer sizes of the actor mu(s) (then tanh, scaled to the action bounds)."""
    critic_hiddens: tuple[int, ...] = (256, 256)
    """ReLU layer sizes of the critic Q(s, a) (input: observation and action concatenated)."""
    actor_lr: float = 1e-3
    """Adam learning rate of the actor."""
    critic_lr: float = 1e-3
    """Adam learning rate of the critic."""
    twin_q: bool = True
    """TD3's twin critics: the target takes the minimum of two Q estimates."""
    policy_delay: int = 2
    """Update the actor (and the targets) once per this many critic updates (>= 1; TD3: 2)."""
    smooth_target_policy: bool = True
    """TD3's target policy smoothing: clipped Gaussian noise on the target action."""
    target_noise: float = 0.2
    """Std of the target smoothing noise, in half ranges of the action space (>= 0)."""
    target_noise_clip: float = 0.5
    """The smoothing noise is clipped to +- this many half ranges (>= 0)."""
    tau: float = 0.005
    """Soft target update factor, applied at every actor update; 1.0: the targets are
    copied every ``learner.target_update_freq`` transitions trained instead. In (0, 1]."""
    use_huber: bool = False
    """Huber critic loss (delta 1) instead of the squared error x^2 / 2."""
    noise: str = "gaussian"
    """Exploration noise: ``gaussian`` (fresh each step) or ``ou`` (Ornstein-Uhlenbeck,
    reset at each episode start; scaled to a stationary std of 1)."""
    noise_base: float = 0.4
    """Noise ladder: worker i of N adds noise of scale base ** (1 + alpha * i / (N - 1))
    half ranges (the epsilon ladder's form; the evaluator adds none). In (0, 1]."""
    noise_alpha: float = 7.0
    """Noise ladder exponent spread (>= 0)."""
    ou_theta: float = 0.15
    """Mean reversion of the ``ou`` noise per step, in (0, 1]."""

    def check(self) -> Problem | None:
        return first(
            layer_sizes("actor_hiddens", self.actor_hiddens),
            layer_sizes("critic_hiddens", self.critic_hiddens),
            positive("actor_lr", self.actor_lr),
            positive("critic_lr", self.critic_lr),
            positive("policy_delay", self.policy_delay),
            nonneg("target_noise", self.target_noise),
            nonneg("target_noise_clip", self.target_noise_clip),
            unit("tau", self.tau, lo_open=True),
            None
            if self.noise in NOISES
            else ("noise", self.noise, f"must be {' or '.join(NOISES)}"),
            unit("noise_base", self.noise_base, lo_open=True),
            nonneg("noise_alpha", self.noise_alpha),
            unit("ou_theta", self.ou_theta, lo_open=True),
        )
