"""The R2D2 agent's config (``r2d2:`` in YAML, ``r2d2.<key>`` with ``--set``): an LSTM
Q-network trained on stored sequences (Kapturowski et al. 2019).

It is the one object the agent's learner, env workers and policy read (beside the
shared ``learner`` section: ``gamma``, ``n_step``, ``adam_eps``, ``grad_clip``,
``target_update_freq``, ``device``, ...) and the ``workers`` section's epsilon ladder.
With this agent a replay item is a sequence: ``replay.capacity``,
``replay.learning_starts`` and ``learner.batch_size`` count sequences. The
sequence defaults are sized for small tasks (CartPole); the R2D2 paper's and
Acme's are burn-in 40, trace 80, period 40, LSTM 512 (docs/algorithm.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from apex_dask.algo.agents.config import (
    ENCODERS,
    AgentConfig,
    Problem,
    first,
    layer_sizes,
    nonneg,
    positive,
    unit,
)

__all__ = ["INITIAL_PRIORITIES", "R2D2Config"]

INITIAL_PRIORITIES = ("max", "worker")
"""Values of :attr:`R2D2Config.initial_priority`."""


@dataclass(frozen=True)
class R2D2Config(AgentConfig):
    """R2D2: an LSTM Q-network trained on stored sequences, epsilon-greedy env workers."""

    network_keys = ("hiddens", "dueling", "encoder", "impala_scale", "lstm_size")

    lr: float = 5e-4
    """Adam learning rate."""
    hiddens: tuple[int, ...] = (256,)
    """ReLU layer sizes of the MLP torso (vectors) or after the conv encoder (images),
    before the LSTM."""
    dueling: bool = True
    """Dueling head over the LSTM's output: Q = V + A - mean(A)."""
    encoder: str = "auto"
    """Image encoder: ``auto`` (the Nature CNN, or one 16x3x3 conv for frames under 36
    pixels) or ``impala`` (the IMPALA ResNet). Images only."""
    impala_scale: int = 1
    """Channel multiplier of the IMPALA encoder's stages (16, 32, 32 times this)."""
    lstm_size: int = 64
    """Units of the LSTM core between the torso (``hiddens``) and the dueling head."""
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
    initial_priority: str = "max"
    """A new sequence's replay priority until the learner computes its own. ``max``: the
    shard's largest priority so far (prioritized replay's rule for new items; env workers
    make no extra pass); ``worker``: the env worker scores each completed sequence with
    the learner's loss under its synced weights (one batched unroll per fragment, as
    the R2D2 paper's actors do)."""

    @property
    def sequence_length(self) -> int:
        """Steps of a stored sequence: ``burn_in + trace_length``."""
        return self.burn_in + self.trace_length

    def check(self) -> Problem | None:
        return first(
            positive("lr", self.lr),
            layer_sizes("hiddens", self.hiddens),
            None
            if self.encoder in ENCODERS
            else ("encoder", self.encoder, f"must be one of {', '.join(ENCODERS)}"),
            None if self.impala_scale >= 1 else ("impala_scale", self.impala_scale, "must be >= 1"),
            positive("lstm_size", self.lstm_size),
            nonneg("burn_in", self.burn_in),
            positive("trace_length", self.trace_length),
            positive("period", self.period),
            None
            if self.period <= self.trace_length
            else (
                "period",
                self.period,
                f"must be <= r2d2.trace_length ({self.trace_length}), or steps between traces "
                "are never trained",
            ),
            unit("eta", self.eta),
            positive("rescale_eps", self.rescale_eps),
            None
            if self.initial_priority in INITIAL_PRIORITIES
            else (
                "initial_priority",
                self.initial_priority,
                f"must be one of {', '.join(INITIAL_PRIORITIES)}",
            ),
        )
