"""Factorised Gaussian noisy linear layers (Fortunato et al., *Noisy Networks for
Exploration*, ICLR 2018), shared by every agent whose torso or head can be noisy.

A :class:`NoisyLinear` layer of ``p`` inputs and ``q`` outputs holds means and scales
of its weights and biases and computes

    y = (mu_W + sigma_W * eps_W) x + mu_b + sigma_b * eps_b
    eps_W = f(eps_out) f(eps_in)^T,  eps_b = f(eps_out),  f(x) = sgn(x) sqrt(|x|)

with ``eps_in ~ N(0, I_p)`` and ``eps_out ~ N(0, I_q)`` drawn anew by whoever owns the
network (:func:`draw_noise`: the learner once per update, an env worker once per
acting pass). Initialised as the paper's factorised case: ``mu ~ U[-1/sqrt(p),
1/sqrt(p)]``, ``sigma = sigma0 / sqrt(p)`` (``sigma0`` 0.5 in the paper).

Without gradients (``torch.no_grad``/``inference_mode``: acting, the learner's target
passes) the layer keeps the noisy weight and bias it formed, and forms them again only
when the noise or a parameter changed (tensor version counters): an env worker that
holds one noise sample for a whole rollout fragment pays for the noisy weights once per
fragment, not once per pass. With gradients they are formed on every call.

In evaluation mode (``module.eval()``) the layer uses the mean weights ``mu`` only:
greedy evaluation, ``apex-dask-eval`` and the exported policy act on them. The noise
is kept in buffers that are not part of the state dict (weights published to env
workers and saved in checkpoints are the means and scales only); until the first
draw it is zero.

:func:`noise_numpy` draws the same kind of noise from a ``numpy.random.Generator``,
for forward passes in numpy (:mod:`apex_dask.algo.agents.dqn.numpy_net`).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "NoisyLinear",
    "draw_noise",
    "noise_numpy",
    "noise_twin",
    "noisy_layers",
    "scaled_noise",
]


def scaled_noise(eps: torch.Tensor) -> torch.Tensor:
    """f(x) = sgn(x) sqrt(|x|), elementwise."""
    return eps.sign() * eps.abs().sqrt()


class NoisyLinear(nn.Module):
    """A linear layer with factorised Gaussian noise; see the module docstring."""

    def __init__(self, in_features: int, out_features: int, sigma0: float = 0.5) -> None:
        super().__init__()
        self.in_features, self.out_features = int(in_features), int(out_features)
        self.sigma0 = float(sigma0)
        self.weight_mu = nn.Parameter(torch.empty(out_features, in_features))
        self.weight_sigma = nn.Parameter(torch.empty(out_features, in_features))
        self.bias_mu = nn.Parameter(torch.empty(out_features))
        self.bias_sigma = nn.Parameter(torch.empty(out_features))
        # f(eps_in), f(eps_out): the noise last drawn (not saved, not published)
        self.register_buffer("noise_in", torch.zeros(in_features), persistent=False)
        self.register_buffer("noise_out", torch.zeros(out_features), persistent=False)
        self._formed: tuple[tuple[int, ...], torch.Tensor, torch.Tensor] | None = None
        self.reset_parameters()

    def reset_parameters(self) -> None:
        bound = 1.0 / math.sqrt(self.in_features)
        with torch.no_grad():
            self.weight_mu.uniform_(-bound, bound)
            self.bias_mu.uniform_(-bound, bound)
            self.weight_sigma.fill_(self.sigma0 * bound)
            self.bias_sigma.fill_(self.sigma0 * bound)

    def set_noise(self, noise_in: torch.Tensor, noise_out: torch.Tensor) -> None:
        """Use these (already scaled: f(eps)) noise vectors from now on."""
        self.noise_in.copy_(noise_in)
        self.noise_out.copy_(noise_out)

    def _key(self) -> tuple[int, ...]:
        """What the noisy weights depend on: the tensors and their version counters (an
        in-place change, an optimizer step or a loaded state dict, bumps a counter)."""
        parts = (self.weight_mu, self.weight_sigma, self.bias_mu, self.bias_sigma)
        parts += (self.noise_in, self.noise_out)
        return tuple(v for t in parts for v in (id(t), t._version))

    def noisy_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(mu_W + sigma_W * eps_W, mu_b + sigma_b * eps_b)`` under the current noise;
        kept while gradients are off and nothing changed (see the module docstring)."""
        cache = not torch.is_grad_enabled()
        if cache and self._formed is not None and self._formed[0] == self._key():
            return self._formed[1], self._formed[2]
        # one fused multiply-add each (no separate sigma * eps temporary)
        eps_w = torch.outer(self.noise_out, self.noise_in)
        weight = torch.addcmul(self.weight_mu, self.weight_sigma, eps_w)
        bias = torch.addcmul(self.bias_mu, self.bias_sigma, self.noise_out)
        self._formed = (self._key(), weight, bias) if cache else None
        return weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return F.linear(x, self.weight_mu, self.bias_mu)
        return F.linear(x, *self.noisy_weights())

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, sigma0={self.sigma0}"


def noisy_layers(module: nn.Module) -> list[NoisyLinear]:
    """The module's noisy layers, in registration order (the order noise is drawn in)."""
    return [m for m in module.modules() if isinstance(m, NoisyLinear)]


def noise_twin(module: nn.Module) -> nn.Module:
    """A second view of ``module`` with the same parameters and buffers (the very tensors:
    an optimizer step or a loaded state dict shows in both) but noise of its own: for a
    pass that needs an independent noise sample of the same network, such as the online
    net's argmax at s' in NoisyNet's double-DQN target."""
    twin = copy.deepcopy(module)
    for mine, theirs in zip(module.modules(), twin.modules(), strict=True):
        for name, param in mine._parameters.items():
            theirs._parameters[name] = param
        for name, buf in mine._buffers.items():
            if not (isinstance(mine, NoisyLinear) and name in ("noise_in", "noise_out")):
                theirs._buffers[name] = buf
    return twin


def draw_noise(module: nn.Module, generator: torch.Generator) -> None:
    """Draw new noise for every noisy layer of ``module`` from ``generator`` (on the
    generator's device: no host round trip on a GPU)."""
    for layer in noisy_layers(module):
        device = layer.noise_in.device
        eps_in = torch.randn(layer.in_features, generator=generator, device=device)
        eps_out = torch.randn(layer.out_features, generator=generator, device=device)
        layer.noise_in.copy_(scaled_noise(eps_in))
        layer.noise_out.copy_(scaled_noise(eps_out))


def noise_numpy(
    rng: np.random.Generator, shapes: Sequence[tuple[int, int]]
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``[(f(eps_in), f(eps_out))]`` float32, one pair per layer of ``(in, out)`` sizes."""
    out = []
    for n_in, n_out in shapes:
        eps_in = rng.standard_normal(n_in, dtype=np.float32)
        eps_out = rng.standard_normal(n_out, dtype=np.float32)
        out.append(
            (
                np.sign(eps_in) * np.sqrt(np.abs(eps_in)),
                np.sign(eps_out) * np.sqrt(np.abs(eps_out)),
            )
        )
    return out
