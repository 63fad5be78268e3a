"""Torsos: the layers that turn an observation into features, for every agent that uses them.

* **MLP** (:func:`mlp_layers`) for vectors: per width in ``hiddens`` a linear
  layer (a :class:`~apex_dask.algo.agents.noisy.NoisyLinear` when ``noisy_sigma0``
  is given), a LayerNorm when ``layer_norm`` (over the layer's outputs, before the
  ReLU, as PQN places it), then a ReLU. Without LayerNorm and noise the layers are
  exactly ``[Linear, ReLU] * len(hiddens)``.
* **Conv encoders** (:func:`conv_encoder`) for images, ending in a flatten:

  - ``auto``: the Nature-DQN convolutions (32x8x8/4, 64x4x4/2, 64x3x3/1, each
    with a ReLU) when both sides are >= 36 pixels, else one 16x3x3/1 convolution
    and a ReLU (the MinAtar network). With ``layer_norm`` a
    :class:`ChannelNorm` sits between each convolution and its ReLU.
  - ``impala``: the IMPALA ResNet (Espeholt et al. 2018), 15 convolutions: three
    stages of ``(16, 32, 32) * impala_scale`` channels, each a 3x3/1 convolution,
    a 3x3/2 max-pool (padding 1), and two residual blocks
    ``x + conv(relu(conv(relu(x))))``; a ReLU after the last stage. With
    ``layer_norm`` a :class:`ChannelNorm` ends each stage.

* :func:`image_input` is what every conv torso applies first: frames to float32,
  scaled by :func:`input_scale` (read from the space's bounds), rank-2 frames given
  a channel axis, HWC permuted to CHW.

Their sizes, for the pre-start memory estimate, are counted on the modules themselves
(built on torch's ``meta`` device: :meth:`~apex_dask.algo.agents.builder.AgentBuilder.network_size`).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import nn
from torch.nn import functional as F

from apex_dask.algo.agents.config import ENCODERS
from apex_dask.algo.agents.noisy import NoisyLinear

__all__ = [
    "ENCODERS",
    "IMPALA_CHANNELS",
    "ChannelNorm",
    "ImpalaStage",
    "ResidualBlock",
    "conv_encoder",
    "image_chw",
    "image_input",
    "input_scale",
    "is_image_space",
    "linear_layer",
    "mlp_layers",
    "net_on_cpu",
]


IMPALA_CHANNELS = (16, 32, 32)
"""Channels of the IMPALA encoder's three stages (times ``impala_scale``)."""


def image_chw(
    shape: Sequence[int], channels_last: bool | None = None
) -> tuple[tuple[int, int, int], bool]:
    """``((C, H, W), channels_last)`` of a frame shape: rank 2 is one channel; for rank 3
    ``channels_last=None`` guesses HWC when the last axis is the smallest."""
    shape = tuple(int(d) for d in shape)
    if len(shape) == 2:
        return (1, *shape), False
    if channels_last is None:
        channels_last = shape[2] <= min(shape[0], shape[1])
    if channels_last:
        return (shape[2], shape[0], shape[1]), True
    return (shape[0], shape[1], shape[2]), False


def linear_layer(in_features: int, out_features: int, noisy_sigma0: float | None) -> nn.Module:
    """``nn.Linear``, or a :class:`NoisyLinear` with ``sigma0 = noisy_sigma0``."""
    if noisy_sigma0 is None:
        return nn.Linear(in_features, out_features)
    return NoisyLinear(in_features, out_features, noisy_sigma0)


def mlp_layers(
    in_features: int,
    hiddens: Sequence[int],
    *,
    layer_norm: bool = False,
    noisy_sigma0: float | None = None,
) -> tuple[nn.Sequential, int]:
    """The MLP torso (see the module docstring) and its number of output features."""
    layers: list[nn.Module] = []
    for h in hiddens:
        layers.append(linear_layer(in_features, int(h), noisy_sigma0))
        if layer_norm:
            layers.append(nn.LayerNorm(int(h)))
        layers.append(nn.ReLU())
        in_features = int(h)
    return nn.Sequential(*layers), in_features


class ChannelNorm(nn.LayerNorm):
    """LayerNorm over the channels at each position of a ``(B, C, H, W)`` map."""

    def __init__(self, channels: int) -> None:
        super().__init__(channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.layer_norm(
            x.permute(0, 2, 3, 1), self.normalized_shape, self.weight, self.bias, self.eps
        )
        return y.permute(0, 3, 1, 2)


class ResidualBlock(nn.Module):
    """``x + conv1(relu(conv0(relu(x))))``, 3x3 convolutions keeping the channels."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaStage(nn.Module):
    """One IMPALA stage: conv 3x3/1, max-pool 3x3/2, two residual blocks (+ ChannelNorm)."""

    def __init__(self, in_channels: int, channels: int, layer_norm: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(in_channels, channels, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.res0 = ResidualBlock(channels)
        self.res1 = ResidualBlock(channels)
        self.norm = ChannelNorm(channels) if layer_norm else nn.Identity()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.res1(self.res0(self.pool(self.conv(x)))))


def conv_encoder(
    shape_chw: tuple[int, int, int],
    *,
    encoder: str = "auto",
    layer_norm: bool = False,
    impala_scale: int = 1,
) -> tuple[nn.Sequential, int]:
    """The conv encoder for ``(C, H, W)`` frames (see the module docstring) and its number
    of flattened output features. ``ValueError`` for an unknown encoder."""
    if encoder not in ENCODERS:
        raise ValueError(f"encoder must be one of {ENCODERS}, got {encoder!r}")
    c, h, w = shape_chw
    layers: list[nn.Module] = []
    if encoder == "impala":
        for out in (k * int(impala_scale) for k in IMPALA_CHANNELS):
            layers.append(ImpalaStage(c, out, layer_norm))
            c = out
        layers.append(nn.ReLU())
    else:
        convs = [(32, 8, 4), (64, 4, 2), (64, 3, 1)] if min(h, w) >= 36 else [(16, 3, 1)]
        for out, k, stride in convs:
            layers.append(nn.Conv2d(c, out, k, stride=stride))
            if layer_norm:
                layers.append(ChannelNorm(out))
            layers.append(nn.ReLU())
            c = out
    layers.append(nn.Flatten())
    net = nn.Sequential(*layers)
    with torch.no_grad():  # on the CPU: built on torch's `meta` device, an empty copy
        probe = net if next(net.parameters()).device.type == "cpu" else net_on_cpu(net)
        flat = int(probe(torch.zeros(1, *shape_chw, device="cpu")).shape[1])
    return net, flat


def net_on_cpu(module: nn.Module) -> nn.Module:
    """An uninitialised CPU copy of ``module`` (built on torch's ``meta`` device): its
    shapes, to run a pass whose values do not matter. Its memory is allocated, not
    written, until read."""
    out = copy.deepcopy(module)
    for m in out.modules():  # tensor by tensor: `to_empty` inside a device context is slow
        for group in (m._parameters, m._buffers):
            for name, t in group.items():
                if t is not None:
                    empty = torch.empty(t.shape, dtype=t.dtype, device="cpu")
                    group[name] = (
                        nn.Parameter(empty, t.requires_grad) if name in m._parameters else empty
                    )
    return out


def image_input(obs: torch.Tensor, scale: float, channels_last: bool) -> torch.Tensor:
    """Frames as a conv torso takes them: float32, times ``scale``, ``(B, C, H, W)``."""
    x = obs.float()
    if scale != 1.0:
        x = x * scale
    if x.dim() == 3:  # (B, H, W) grayscale
        return x.unsqueeze(1)
    if channels_last:
        return x.permute(0, 3, 1, 2)
    return x


def is_image_space(observation_space: spaces.Space) -> bool:
    """True for ``Box`` observations of rank 2 or 3 (frames)."""
    return isinstance(observation_space, spaces.Box) and len(observation_space.shape) in (2, 3)


def input_scale(observation_space: spaces.Box) -> float:
    """The factor image inputs are multiplied by: ``1 / high`` for a space bounded in
    ``[0, high]`` with ``high > 1`` (``Box(0, 255, uint8)``: 1/255), else 1.

    Read from the space's bounds, not its dtype: ``Box(0, 1, uint8)`` and ``bool``
    frames (MinAtar) are already in [0, 1]; unbounded or signed spaces are left as they are.
    """
    low = np.asarray(observation_space.low, dtype=np.float64)
    high = np.asarray(observation_space.high, dtype=np.float64)
    if not (np.all(np.isfinite(low)) and np.all(np.isfinite(high))):
        return 1.0
    top = float(high.max()) if high.size else 1.0
    if float(low.min(initial=0.0)) < 0.0 or top <= 1.0:
        return 1.0
    return 1.0 / top
