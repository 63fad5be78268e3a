"""The DQN agent's config (``dqn:`` in YAML, ``dqn.<key>`` with ``--set``): n-step double
dueling DQN with Rainbow's options.

It is the one object the agent's learner, env workers and policy read (beside the
shared ``learner`` section); plain data, so it crosses to every actor as it is.

The value head is one of three (:attr:`DQNConfig.head`): ``scalar`` (one Q-value per
action, the Huber TD loss), ``c51`` (``num_atoms`` > 1: a categorical return
distribution on ``num_atoms`` atoms spanning ``[v_min, v_max]``) or ``hl_gauss``
(``loss="hl_gauss"``: a histogram over ``num_bins`` bins of ``[v_min, v_max]``
trained on Gaussian-smoothed targets). Noisy layers, LayerNorm and the encoder
combine with each.
"""

from __future__ import annotations

from dataclasses import dataclass

from apex_dask.algo.agents.config import (
    AMP_MODES,
    ENCODERS,
    MEMORY_FORMATS,
    AgentConfig,
    Problem,
    first,
    layer_sizes,
    positive,
)

__all__ = ["ACTING_NOISE", "HEADS", "LOSSES", "DQNConfig"]

LOSSES = ("huber", "hl_gauss")
"""Values of ``loss``: the Huber TD loss of a scalar (or C51) head, or HL-Gauss."""
HEADS = ("scalar", "c51", "hl_gauss")
"""The value heads (:attr:`DQNConfig.head`)."""
ACTING_NOISE = ("fragment", "pass")
"""Values of :attr:`DQNConfig.acting_noise`."""


@dataclass(frozen=True)
class DQNConfig(AgentConfig):
    """Ape-X DQN: the Q-network, its value head, the optimizer and the learner's engine."""

    network_keys = (
        "hiddens",
        "dueling",
        "num_atoms",
        "noisy",
        "loss",
        "num_bins",
        "layer_norm",
        "encoder",
        "impala_scale",
    )

    lr: float = 5e-4
    """Adam learning rate."""
    hiddens: tuple[int, ...] = (256,)
    """Hidden layer sizes of the MLP (vector observations) or after the CNN (images)."""
    dueling: bool = True
    """Dueling head: Q = V + A - mean(A)."""
    double_q: bool = True
    """Double DQN target: the online net picks the action, the target net values it (also
    for the env workers' initial priorities)."""
    num_atoms: int = 1
    """C51 when > 1 (RLlib ``num_atoms``; the C51 paper: 51): a categorical return
    distribution over this many atoms spanning [v_min, v_max], projected n-step
    double-Q targets, per-item cross-entropy priorities. 1: a scalar Q head."""
    v_min: float = -10.0
    """Lowest atom (C51) or lowest bin edge (HL-Gauss); RLlib ``v_min``."""
    v_max: float = 10.0
    """Highest atom (C51) or highest bin edge (HL-Gauss); RLlib ``v_max``."""
    noisy: bool = False
    """Noisy nets (RLlib ``noisy``): factorised Gaussian noisy layers in the MLP layers and
    the head; the learner draws new noise per update (one sample for the online net at s,
    one for its argmax at s', one for the target net), env workers per
    ``acting_noise``; evaluation and export use the mean weights. The env workers'
    epsilons are then 0 (``workers.epsilon_with_noisy``)."""
    sigma0: float = 0.5
    """Noisy nets: initial noise scale, sigma = sigma0 / sqrt(fan-in); RLlib ``sigma0``."""
    acting_noise: str = "fragment"
    """Noisy nets: how often an env worker draws new noise. ``fragment``: once per rollout
    fragment (the noisy weights formed once, passes as fast as without noise; NoisyNet
    A3C's once-per-rollout); ``pass``: before every acting pass (NoisyNet-DQN's
    per-step draw)."""
    loss: str = "huber"
    """``huber``: the TD loss of a scalar Q head (C51 has its own cross-entropy);
    ``hl_gauss``: a histogram over ``num_bins`` bins of [v_min, v_max] trained on
    Gaussian-smoothed targets (Farebrother et al. 2024)."""
    num_bins: int = 51
    """HL-Gauss (``loss: hl_gauss``): bins over [v_min, v_max] (>= 2)."""
    hl_gauss_sigma_ratio: float = 0.75
    """HL-Gauss: the smoothing Gaussian's sigma in bin widths (the paper's 0.75)."""
    layer_norm: bool = False
    """LayerNorm before each ReLU of the MLP layers and the image encoder (as PQN)."""
    encoder: str = "auto"
    """Image encoder: ``auto`` (the Nature CNN, or one 16x3x3 conv for frames under 36
    pixels) or ``impala`` (the 15-layer IMPALA ResNet). Images only."""
    impala_scale: int = 1
    """Channel multiplier of the IMPALA encoder's stages (16, 32, 32 times this)."""
    amp: str = "off"
    """``off`` or ``bf16`` (autocast of the forward passes; refused on a GPU without bf16)."""
    compile: bool = False
    """``torch.compile`` both networks (needs triton on CUDA, a C compiler on CPU)."""
    memory_format: str = "contiguous"
    """``contiguous`` or ``channels_last``: layout of the CNN's weights and image inputs."""
    pipeline: bool | None = None
    """The learner's pipelined batch path (results read one update later, no blocking
    sync). None: on a CUDA device only."""

    @property
    def head(self) -> str:
        """``c51`` (``num_atoms`` > 1), ``hl_gauss`` (``loss="hl_gauss"``) or ``scalar``."""
        if self.num_atoms > 1:
            return "c51"
        return "hl_gauss" if self.loss == "hl_gauss" else "scalar"

    @property
    def num_outputs(self) -> int:
        """Outputs per action: atoms (C51), bins (HL-Gauss) or 1."""
        return {"c51": self.num_atoms, "hl_gauss": self.num_bins}.get(self.head, 1)

    @property
    def noisy_sigma0(self) -> float | None:
        """``sigma0`` when the layers are noisy, else None."""
        return self.sigma0 if self.noisy else None

    def check(self) -> Problem | None:
        """The ranges, the value-head keys alone and together (one problem at a time)."""
        return first(
            positive("lr", self.lr),
            layer_sizes("hiddens", self.hiddens),
            self._check_head(),
            None if self.encoder in ENCODERS else ("encoder", self.encoder, _one_of(ENCODERS)),
            None if self.impala_scale >= 1 else ("impala_scale", self.impala_scale, "must be >= 1"),
            None
            if self.acting_noise in ACTING_NOISE
            else ("acting_noise", self.acting_noise, _one_of(ACTING_NOISE)),
            None if self.amp in AMP_MODES else ("amp", self.amp, _one_of(AMP_MODES)),
            None
            if self.memory_format in MEMORY_FORMATS
            else ("memory_format", self.memory_format, _one_of(MEMORY_FORMATS)),
        )

    def _check_head(self) -> Problem | None:
        if self.loss not in LOSSES:
            return "loss", self.loss, _one_of(LOSSES)
        if self.num_atoms < 1:
            return "num_atoms", self.num_atoms, "must be >= 1 (1: a scalar Q head; C51: 51)"
        if self.num_atoms > 1 and self.loss == "hl_gauss":
            return (
                "loss",
                self.loss,
                f"cannot be combined with dqn.num_atoms={self.num_atoms} (C51 has its own "
                "cross-entropy loss): set dqn.num_atoms=1 for HL-Gauss, or dqn.loss=huber "
                "for C51",
            )
        if self.head != "scalar" and not self.v_min < self.v_max:
            return "v_max", self.v_max, f"must be > dqn.v_min ({self.v_min})"
        if self.loss == "hl_gauss" and self.num_bins < 2:
            return "num_bins", self.num_bins, "must be >= 2 with dqn.loss=hl_gauss"
        if self.loss == "hl_gauss" and not self.hl_gauss_sigma_ratio > 0:
            return "hl_gauss_sigma_ratio", self.hl_gauss_sigma_ratio, "must be > 0"
        if self.noisy and not self.sigma0 > 0:
            return "sigma0", self.sigma0, "must be > 0 with dqn.noisy=true"
        return None


def _one_of(values: tuple[str, ...]) -> str:
    return f"must be one of {', '.join(values)}"
