"""The DQN agent's options: one typed object its learner, env workers and policy share.

Its builder (:mod:`apex_dask.algo.agents.dqn.builder`) makes it from the run's
config (``learner.*``); it is plain data, so it crosses to every actor as it is.

The value head is one of three (:attr:`DQNOptions.head`): ``scalar`` (one Q-value per
action, the Huber TD loss), ``c51`` (``num_atoms`` > 1: a categorical return
distribution on ``num_atoms`` atoms spanning ``[v_min, v_max]``) or ``hl_gauss``
(``loss="hl_gauss"``: a histogram over ``num_bins`` bins of ``[v_min, v_max]``
trained on Gaussian-smoothed targets). Noisy layers, LayerNorm and the encoder
combine with each.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HEADS", "LOSSES", "DQNOptions"]

LOSSES = ("huber", "hl_gauss")
"""Values of ``loss``: the Huber TD loss of a scalar (or C51) head, or HL-Gauss."""
HEADS = ("scalar", "c51", "hl_gauss")
"""The value heads (:attr:`DQNOptions.head`)."""


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
    num_atoms: int = 1
    """1: a scalar Q head; > 1: C51, a categorical distribution over this many atoms."""
    v_min: float = -10.0
    """Lowest atom (C51) or lowest bin edge (HL-Gauss)."""
    v_max: float = 10.0
    """Highest atom (C51) or highest bin edge (HL-Gauss)."""
    noisy: bool = False
    """Factorised Gaussian noisy linear layers in the MLP torso and the head."""
    sigma0: float = 0.5
    """Initial noise scale of the noisy layers: sigma = sigma0 / sqrt(fan in)."""
    loss: str = "huber"
    """``huber`` (scalar head; C51 has its own cross-entropy) or ``hl_gauss``."""
    num_bins: int = 51
    """HL-Gauss: histogram bins over [v_min, v_max]."""
    hl_gauss_sigma_ratio: float = 0.75
    """HL-Gauss: the smoothing Gaussian's sigma in bin widths."""
    layer_norm: bool = False
    """LayerNorm before each ReLU of the MLP and CNN torsos."""
    encoder: str = "auto"
    """Image encoder: ``auto`` (Nature CNN, or the MinAtar conv for small frames) or
    ``impala`` (the IMPALA ResNet)."""
    impala_scale: int = 1
    """Channel multiplier of the IMPALA encoder (16, 32, 32 times this)."""

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
