"""The DPG agent's options: one typed object its learner, env workers and policy share.

Its builder (:mod:`apex_dask.algo.agents.dpg.builder`) makes it from the run's
config (the ``dpg`` section and the learner's shared keys).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DPGOptions"]


@dataclass(frozen=True)
class DPGOptions:
    """Networks, losses, optimizers and exploration noise of Ape-X DPG (DDPG with TD3's
    options); the fields mean what the ``dpg`` config section says."""

    actor_hiddens: tuple[int, ...] = (256, 256)
    critic_hiddens: tuple[int, ...] = (256, 256)
    twin_q: bool = True
    actor_lr: float = 1e-3
    critic_lr: float = 1e-3
    adam_eps: float = 1e-8
    grad_clip: float = 40.0
    policy_delay: int = 2
    smooth_target_policy: bool = True
    target_noise: float = 0.2
    target_noise_clip: float = 0.5
    tau: float = 0.005
    target_update_freq: int = 1
    use_huber: bool = False
    device: str = "auto"
    num_threads: int | None = None
    noise: str = "gaussian"
    """Exploration noise of the env workers: ``gaussian`` or ``ou``."""
    ou_theta: float = 0.15
