"""The MLP Q-network's forward pass in numpy, from its weights dict: how env workers act on
vector observations (batch-1 passes are several times faster than through torch).

:class:`NumpyMLPQ` reads the layers from the state-dict names the torch module has
(:class:`~apex_dask.algo.agents.dqn.networks.MLPQNetwork`): ``trunk.i.weight`` /
``trunk.i.bias`` of a linear layer (2-D weight) or a LayerNorm (1-D weight, applied
to the linear layer before it), ``trunk.i.weight_mu`` / ``weight_sigma`` / ``bias_mu`` /
``bias_sigma`` of a noisy layer; a ReLU ends each linear layer's group; then the head
(``head.value`` + ``head.advantage``, or ``head.q``). ``config`` give the head's
outputs per action and their support (C51, HL-Gauss).

Noisy layers take their noise as an argument, ``[(f(eps_in), f(eps_out))]`` in the order
of :attr:`NumpyMLPQ.noise_shapes` (the torch module's
:func:`~apex_dask.algo.agents.noisy.noisy_layers` order); without it they use the mean
weights, as the torch module in evaluation mode. A pass with noise never forms the
noisy weight matrix: with ``W = mu + sigma * outer(f_out, f_in)``,

    x W^T + b = x mu^T + ((x * f_in) sigma^T) * f_out + mu_b + sigma_b * f_out

(two matmuls of the batch, no (out, in) temporaries). Who keeps one noise sample for
many passes (an env worker, once per rollout fragment) instead calls
:meth:`NumpyMLPQ.noised` once: a plain network whose weights are the noisy ones, as
fast per pass as the noise-free network.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.heads import expected_value_numpy, log_softmax_numpy, support

__all__ = ["NumpyMLPQ"]

Noise = Sequence[tuple[np.ndarray, np.ndarray]]
_LN_EPS = 1e-5  # torch.nn.LayerNorm's default


def _f32(a: Any) -> np.ndarray:
    return np.asarray(a, np.float32)


class _Linear:
    """y = x W^T + b; noisy: W = mu + sigma * outer(f_out, f_in), b = mu_b + sigma_b * f_out."""

    def __init__(self, weights: Mapping[str, Any], name: str) -> None:
        self.name = name
        self.noisy = f"{name}.weight_mu" in weights
        if self.noisy:
            self.w = _f32(weights[f"{name}.weight_mu"])
            self.b = _f32(weights[f"{name}.bias_mu"])
            self.w_sigma = _f32(weights[f"{name}.weight_sigma"])
            self.b_sigma = _f32(weights[f"{name}.bias_sigma"])
        else:
            self.w = _f32(weights[f"{name}.weight"])
            self.b = _f32(weights[f"{name}.bias"])
        self.wt = np.ascontiguousarray(self.w.T)  # (in, out): x @ wt
        self.sigma_t = np.ascontiguousarray(self.w_sigma.T) if self.noisy else None

    @property
    def shape(self) -> tuple[int, int]:
        return int(self.w.shape[1]), int(self.w.shape[0])

    def __call__(self, x: np.ndarray, noise: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
        if noise is None:
            out = x @ self.wt
            out += self.b
            return out
        f_in, f_out = noise
        out = x @ self.wt
        out += ((x * f_in) @ self.sigma_t) * f_out
        out += self.b + self.b_sigma * f_out
        return out

    def noisy_weights(self, noise: tuple[np.ndarray, np.ndarray]) -> dict[str, np.ndarray]:
        """This layer as a plain linear layer's weights under ``noise``."""
        f_in, f_out = noise
        return {
            f"{self.name}.weight": self.w + self.w_sigma * np.outer(f_out, f_in),
            f"{self.name}.bias": self.b + self.b_sigma * f_out,
        }


class NumpyMLPQ:
    """Numpy forward pass of an MLP Q-network from its weights dict; see the module docstring.

    ``q_values(obs)`` with ``obs`` of shape (B, d) or (d,) returns float32 Q-values of
    shape (B, A) or (A,), equal to the torch module's (within float rounding).
    """

    def __init__(self, weights: Mapping[str, Any], config: DQNConfig | None = None) -> None:
        o = config if config is not None else DQNConfig()
        self.config = o
        self._weights = weights
        idx = sorted({int(k.split(".")[1]) for k in weights if k.startswith("trunk.")})
        # groups: [linear, layernorm or None], a ReLU after each
        self.layers: list[list[Any]] = []
        for i in idx:
            name = f"trunk.{i}"
            if f"{name}.weight_mu" in weights or np.ndim(weights[f"{name}.weight"]) == 2:
                self.layers.append([_Linear(weights, name), None])
            else:  # LayerNorm of the linear layer before it
                self.layers[-1][1] = (
                    _f32(weights[f"{name}.weight"]),
                    _f32(weights[f"{name}.bias"]),
                )
        self.dueling = "head.value.weight" in weights or "head.value.weight_mu" in weights
        names = ("head.value", "head.advantage") if self.dueling else ("head.q",)
        self.head = [_Linear(weights, n) for n in names]
        self._head_cat: tuple[np.ndarray, np.ndarray] | None = None
        if self.dueling and not self.head[0].noisy:  # one matmul for both streams
            w = np.concatenate([self.head[0].w, self.head[1].w])
            b = np.concatenate([self.head[0].b, self.head[1].b])
            self._head_cat = (np.ascontiguousarray(w.T), b)
        self.num_outputs = int(o.num_outputs)
        values = support(o)
        self.support = values
        self.num_actions = self.head[-1].shape[1] // self.num_outputs
        self.noise_shapes = [layer.shape for layer, _ in self.layers if layer.noisy]
        self.noise_shapes += [layer.shape for layer in self.head if layer.noisy]

    def noised(self, noise: Noise) -> NumpyMLPQ:
        """A network without noisy layers whose weights are these under ``noise``: its
        passes equal ``outputs(obs, noise)`` (within float rounding)."""
        noisy = [layer for layer, _ in self.layers if layer.noisy]
        noisy += [layer for layer in self.head if layer.noisy]
        if len(noise) != len(noisy):
            raise ValueError(f"{len(noisy)} noisy layers, got noise for {len(noise)}")
        weights = {
            k: v
            for k, v in self._weights.items()
            if not any(k.startswith(f"{layer.name}.") for layer in noisy)
        }
        for layer, draw in zip(noisy, noise, strict=True):
            weights.update(layer.noisy_weights(draw))
        return NumpyMLPQ(weights, self.config)

    def outputs(self, obs: np.ndarray, noise: Noise | None = None) -> np.ndarray:
        """Head outputs of a batch: (B, A) for a scalar head, else (B, A, K) logits."""
        x = np.asarray(obs, dtype=np.float32)
        draws = iter(noise) if noise is not None else None
        for linear, norm in self.layers:
            x = linear(x, next(draws) if draws is not None and linear.noisy else None)
            if norm is not None:
                mean = x.mean(axis=1, keepdims=True)
                var = ((x - mean) ** 2).mean(axis=1, keepdims=True)
                x = (x - mean) / np.sqrt(var + _LN_EPS) * norm[0] + norm[1]
            np.maximum(x, 0.0, out=x)
        k, b = self.num_outputs, x.shape[0]
        if self._head_cat is not None:
            out = x @ self._head_cat[0]
            out += self._head_cat[1]
            outs = [out[:, :k], out[:, k:]]
        else:
            outs = [h(x, next(draws) if draws is not None and h.noisy else None) for h in self.head]
        if not self.dueling:
            out = outs[0]
            return out if k == 1 else out.reshape(b, self.num_actions, k)
        value, adv = outs
        if k == 1:
            mean = np.add.reduce(adv, axis=1, keepdims=True) / adv.shape[1]  # adv.mean, faster
            return value + adv - mean
        adv = adv.reshape(b, self.num_actions, k)
        return value[:, None, :] + adv - adv.mean(axis=1, keepdims=True)

    def values(self, obs: np.ndarray, noise: Noise | None = None) -> tuple[np.ndarray, np.ndarray]:
        """``(Q (B, A), log-probabilities (B, A, K))`` of a distributional head; for a
        scalar head ``(Q, Q)``."""
        out = self.outputs(obs, noise)
        if self.support is None:
            return out, out
        logp = log_softmax_numpy(out)
        return expected_value_numpy(logp, self.support), logp

    def q_values(self, obs: np.ndarray, noise: Noise | None = None) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32)
        single = x.ndim == 1
        q = self.values(x[None] if single else x, noise)[0]
        return q[0] if single else q
