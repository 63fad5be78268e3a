"""The ``r2d2`` section of :class:`~apex_dask.config.ApexConfig`: the R2D2 agent's settings.

Read only when ``algo: r2d2``. The learner's shared keys apply to it too
(``learner.hiddens``, ``dueling``, ``encoder``, ``lr``, ``adam_eps``, ``grad_clip``,
``gamma``, ``n_step``, ``target_update_freq``, ``device``, ``num_threads``), and the
``workers`` section's epsilon ladder. With this agent a replay item is a sequence:
``replay.capacity``, ``replay.learning_starts`` and ``learner.batch_size`` count
sequences. The defaults are sized for small tasks (CartPole); the R2D2 paper's and
Acme's are burn-in 40, trace 80, period 40, LSTM 512 (docs/algorithm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["R2D2Config"]


@dataclass(frozen=True)
class R2D2Config:
    """R2D2 (Kapturowski et al. 2019): an LSTM Q-network trained on stored sequences."""

    lstm_size: int = 64
    """Units of the LSTM core between the torso (``learner.hiddens``) and the dueling head."""
    burn_in: int = 10
    """Steps at each sequence's start unrolled from the stored state without gradient
    (>= 0; the paper: 40)."""
    trace_length: int = 20
    """Steps of each sequence trained after the burn-in (>= 1; the paper: 80)."""
    period: int = 10
    """Env steps between the starts of consecutive traces of an episode, in [1,
    trace_length] (the paper: 40, so sequences overlap by half)."""
    eta: float = 0.9
    """Sequence priority eta * max|td| + (1 - eta) * mean|td| over its trained steps,
    in [0, 1] (the paper: 0.9)."""
    rescale_eps: float = 1e-3
    """The epsilon of the value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps x (> 0)."""
