"""The R2D2 agent's options: one typed object its learner, env workers and policy share.

Its builder (:mod:`apex_dask.algo.agents.r2d2.builder`) makes it from the run's
config (the ``r2d2`` section and the learner's shared keys); it is plain data, so
it crosses to every actor as it is.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["R2D2Options"]


@dataclass(frozen=True)
class R2D2Options:
    """Network, sequences, loss and optimizer of R2D2 (Kapturowski et al. 2019); the
    fields mean what the ``r2d2`` config section says."""

    hiddens: tuple[int, ...] = (64,)
    """ReLU layer sizes of the MLP torso (vectors) or after the conv encoder (images)."""
    lstm_size: int = 64
    """Units of the LSTM core."""
    dueling: bool = True
    """Dueling head over the LSTM's output: Q = V + A - mean(A)."""
    encoder: str = "auto"
    """Image encoder (``auto`` or ``impala``); vectors use the MLP."""
    impala_scale: int = 1
    """Channel multiplier of the IMPALA encoder."""
    burn_in: int = 10
    """Steps at a sequence's start unrolled without gradient to refresh the stored state."""
    trace_length: int = 20
    """Steps of a sequence that are trained (after the burn-in)."""
    period: int = 10
    """Env steps between the trace starts of consecutive sequences of one episode."""
    n_step: int = 5
    """Steps summed in a target's return before bootstrapping."""
    gamma: float = 0.997
    """Discount factor."""
    eta: float = 0.9
    """Sequence priority: eta * max|td| + (1 - eta) * mean|td| over the trained steps."""
    rescale_eps: float = 1e-3
    """The epsilon of the value rescaling h(x) = sign(x)(sqrt(|x| + 1) - 1) + eps * x."""
    lr: float = 1e-3
    """Adam learning rate."""
    adam_eps: float = 1e-8
    """Adam epsilon (the paper's 1e-3 slowed CartPole's small gradients several-fold)."""
    grad_clip: float = 40.0
    """Global gradient norm clip."""
    target_update_freq: int = 2_500
    """Steps trained (the real steps of the traces) between copies of the online net to
    the target net."""
    device: str = "auto"
    """The learner's device: ``auto``, ``cpu`` or ``cuda[:N]``."""
    num_threads: int | None = None
    """torch threads of the learner's process (None: leave torch's choice)."""

    @property
    def sequence_length(self) -> int:
        """Steps of a stored sequence: ``burn_in + trace_length``."""
        return self.burn_in + self.trace_length
