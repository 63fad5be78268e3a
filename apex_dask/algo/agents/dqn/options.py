"""The DQN agent's options: one typed object its learner, env workers and policy share.

Its builder (:mod:`apex_dask.algo.agents.dqn.builder`) makes it from the run's
config (``learner.*``); it is plain data, so it crosses to every actor as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DQNOptions"]


@dataclass(frozen=True)
class DQNOptions:
    """Network, loss and optimizer settings of n-step double dueling DQN."""

    hiddens: tuple[int, ...] = (256,)
    """ReLU layer sizes of the MLP (vectors) or after the CNN (images)."""
    dueling: bool = True
    """Dueling head: Q = V + A - mean(A)."""
    double_q: bool = True
    """Double-DQN target (also for the env workers' initial priorities)."""
    lr: float = 5e-4
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon."""
    grad_clip: float = 40.0
    """Global gradient norm clip."""
    target_update_freq: int = 500_000
    """Transitions trained between copies of the online net to the target net."""
    device: str = "auto"
    """The learner's device: ``auto``, ``cpu`` or ``cuda[:N]``."""
    num_threads: int | None = None
    """torch threads of the learner's process (None: leave torch's choice)."""
    amp: str = "off"
    """``off`` or ``bf16`` autocast of the learner's forward passes."""
    compile: bool = False
    """``torch.compile`` the learner's networks."""
    memory_format: str = "contiguous"
    """``contiguous`` or ``channels_last`` for the CNN's weights and inputs."""
    pipeline: bool | None = None
    """The learner's pipelined batch path (results one update later, no blocking sync);
    None: on a CUDA device only."""
