"""The value heads' maths: supports, the C51 projection and the HL-Gauss target.

**C51** (Bellemare et al. 2017, ``num_atoms`` = N > 1). Atoms
``z_j = v_min + j * dz``, ``dz = (v_max - v_min) / (N - 1)``; the network gives
logits per action and atom, ``p(s, a) = softmax_j``, ``Q(s, a) = sum_j p_j(s, a) z_j``.
The target distribution of an n-step transition ``(R, discount)`` with next-state
probabilities ``p'_j`` (of the target net at ``a*``) is the projection Phi onto the atoms:

    Tz_j = clip(R + discount * z_j, v_min, v_max),   b_j = (Tz_j - v_min) / dz
    l = floor(b_j), u = ceil(b_j)
    m_l += p'_j * (u - b_j),  m_u += p'_j * (b_j - l)      (b_j integral: m_l += p'_j)

and the loss of an item is the cross-entropy ``-sum_j m_j log p_j(s, a)``.

**HL-Gauss** (Farebrother et al. 2024, "Stop Regressing", ``loss: hl_gauss``, K bins).
Bin edges ``e_k = v_min + k * zeta``, ``zeta = (v_max - v_min) / K``, centers
``c_k = (e_k + e_{k+1}) / 2``; ``Q(s, a) = sum_k softmax_k(logits) c_k``. A scalar
target y (clipped into [v_min, v_max]) becomes the histogram of a Gaussian
``N(y, sigma^2)``, ``sigma = hl_gauss_sigma_ratio * zeta``, over the bins, renormalised
to the mass inside [v_min, v_max]:

    p_k = (erf((e_{k+1} - y) / (sqrt(2) sigma)) - erf((e_k - y) / (sqrt(2) sigma)))
          / (erf((v_max - y) / (sqrt(2) sigma)) - erf((v_min - y) / (sqrt(2) sigma)))

Supports are made once in float64 and stored as float32 (:func:`support`), so the
learner (torch) and the env workers (numpy) use the same numbers. The numpy twins
give env workers their initial priorities from acting's own outputs.
"""

from __future__ import annotations

import math

import numpy as np
import torch

from apex_dask.algo.agents.dqn.config import DQNConfig

__all__ = [
    "bin_edges",
    "c51_priorities_numpy",
    "categorical_projection",
    "categorical_projection_numpy",
    "expected_value_numpy",
    "hl_gauss_target",
    "log_softmax_numpy",
    "support",
]


def bin_edges(config: DQNConfig) -> np.ndarray:
    """HL-Gauss: the ``num_bins + 1`` bin edges, float32."""
    return np.linspace(config.v_min, config.v_max, config.num_bins + 1).astype(np.float32)


def support(config: DQNConfig) -> np.ndarray | None:
    """float32 values of the outputs: C51's atoms, HL-Gauss's bin centers; None (scalar)."""
    if config.head == "c51":
        return np.linspace(config.v_min, config.v_max, config.num_atoms).astype(np.float32)
    if config.head == "hl_gauss":
        edges = np.linspace(config.v_min, config.v_max, config.num_bins + 1)
        return ((edges[:-1] + edges[1:]) / 2).astype(np.float32)
    return None


# -- torch (the learner) ----------------------------------------------------------
def _bounds(values: torch.Tensor, bounds: tuple[float, float] | None) -> tuple[float, float]:
    # reading them from a device tensor would sync the host with the device: the learner
    # passes them as numbers
    return bounds if bounds is not None else (float(values[0]), float(values[-1]))


def categorical_projection(
    probs: torch.Tensor,
    reward: torch.Tensor,
    discount: torch.Tensor,
    atoms: torch.Tensor,
    bounds: tuple[float, float] | None = None,
) -> torch.Tensor:
    """Phi: (B, N) next-state probabilities -> (B, N) target probabilities on ``atoms``
    (``bounds``: ``(v_min, v_max)``, else read from ``atoms``)."""
    n = atoms.shape[0]
    v_min, v_max = _bounds(atoms, bounds)
    dz = (v_max - v_min) / (n - 1)
    tz = (reward.unsqueeze(1) + discount.unsqueeze(1) * atoms.unsqueeze(0)).clamp(v_min, v_max)
    b = (tz - v_min) / dz
    low = b.floor()
    frac = b - low  # to the atom above; 0 where b is integral (all to ``low``)
    low_i = low.long().clamp(0, n - 1)
    up_i = (low_i + 1).clamp(max=n - 1)
    to_up = probs * frac
    m = torch.zeros_like(probs)  # two scatters of the neighbours' shares, no loop over atoms
    m.scatter_add_(1, low_i, probs - to_up)
    m.scatter_add_(1, up_i, to_up)
    return m


def hl_gauss_target(
    y: torch.Tensor, edges: torch.Tensor, sigma: float, bounds: tuple[float, float] | None = None
) -> torch.Tensor:
    """(B,) scalar targets -> (B, K) HL-Gauss probabilities over the bins of ``edges``
    (``bounds``: ``(v_min, v_max)``, else read from ``edges``)."""
    y = y.clamp(*_bounds(edges, bounds))
    cdf = torch.erf((edges.unsqueeze(0) - y.unsqueeze(1)) / (math.sqrt(2.0) * sigma))
    mass = cdf[:, -1:] - cdf[:, :1]
    return (cdf[:, 1:] - cdf[:, :-1]) / mass


# -- numpy (env workers) -------------------------------------------------------------
def log_softmax_numpy(x: np.ndarray) -> np.ndarray:
    """log softmax over the last axis, float32."""
    shifted = x - x.max(axis=-1, keepdims=True)
    return (shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))).astype(np.float32)


def expected_value_numpy(logp: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``sum_j exp(logp_j) * values_j`` over the last axis (Q from log-probabilities)."""
    return (np.exp(logp) * values).sum(axis=-1, dtype=np.float32)


def categorical_projection_numpy(
    probs: np.ndarray, reward: np.ndarray, discount: np.ndarray, atoms: np.ndarray
) -> np.ndarray:
    """:func:`categorical_projection` in numpy (float32)."""
    rows, n = probs.shape
    v_min, v_max = atoms[0], atoms[-1]
    dz = np.float32((float(v_max) - float(v_min)) / (n - 1))
    reward = np.asarray(reward, np.float32)[:, None]
    discount = np.asarray(discount, np.float32)[:, None]
    tz = np.clip(reward + discount * atoms[None, :], v_min, v_max)
    b = (tz - v_min) / dz
    low, up = np.floor(b), np.ceil(b)
    to_low = probs * (up - b + (low == up))
    to_up = probs * (b - low)
    base = (np.arange(rows) * n)[:, None]
    low_i = base + np.clip(low.astype(np.int64), 0, n - 1)
    up_i = base + np.clip(up.astype(np.int64), 0, n - 1)
    m = np.bincount(low_i.ravel(), to_low.ravel(), minlength=rows * n)
    m += np.bincount(up_i.ravel(), to_up.ravel(), minlength=rows * n)
    return m.reshape(rows, n).astype(np.float32)


def c51_priorities_numpy(
    logp_taken: np.ndarray,
    logp_next: np.ndarray,
    reward: np.ndarray,
    discount: np.ndarray,
    atoms: np.ndarray,
) -> np.ndarray:
    """Per-item C51 cross-entropy with online = target (one set of weights):
    ``logp_taken`` (M, N) of ``(s, a)``, ``logp_next`` (M, A, N) of ``s'``; ``a*`` is the
    argmax of the expected values at ``s'``. A terminal item has ``discount`` 0 (its
    ``logp_next`` row is not read)."""
    if len(logp_taken) == 0:
        return np.zeros(0, np.float32)
    q_next = expected_value_numpy(logp_next, atoms)
    best = np.argmax(q_next, axis=1)
    probs = np.exp(logp_next[np.arange(len(best)), best])
    # a terminal item's target is R whatever s' holds (and an env worker keeps no values
    # of terminal states): any distribution sums to 1 there
    probs[np.asarray(discount) == 0] = 1.0 / probs.shape[1]
    m = categorical_projection_numpy(probs, reward, discount, atoms)
    return (-(m * logp_taken).sum(axis=1)).astype(np.float32)
