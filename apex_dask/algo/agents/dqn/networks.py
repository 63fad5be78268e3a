"""Q-networks for discrete actions: a dueling MLP for vectors, a CNN for images.

Both end in the same head. With ``dueling=True`` (Wang et al. 2016)

    Q(s, a) = V(s) + A(s, a) - (1/|A|) * sum_b A(s, b)

from a value stream ``V`` and an advantage stream ``A``, each one linear layer
on the shared features; with ``dueling=False`` a single linear layer gives Q.

* Vector observations (``Box`` of shape ``(d,)``): an MLP with ReLU layers of
  sizes ``hiddens`` feeds the head.
* Image observations (``Box`` of shape ``(H, W)``, ``(H, W, C)`` or
  ``(C, H, W)``): frames are scaled to [0, 1] inside the network by the
  space's bounds (``Box(0, 255)``: / 255, so replay stores ``uint8``; ``Box(0, 1)``
  and ``bool``: as they are; see :func:`input_scale`), HWC is permuted to CHW, then the Nature-DQN
  convolutions (32x8x8/4, 64x4x4/2, 64x3x3/1) when both sides are >= 36 pixels,
  or one 16x3x3/1 convolution (the MinAtar network) for small grids, then
  ReLU layers of sizes ``hiddens``, then the head.

:class:`NumpyMLPQ` runs the MLP's forward pass in numpy from a weights dict:
batch-1 action selection is several times faster than through torch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import torch
from gymnasium import spaces
from torch import nn

__all__ = [
    "build_q_network",
    "input_scale",
    "MLPQNetwork",
    "ConvQNetwork",
    "NumpyMLPQ",
    "is_image_space",
]


class _Head(nn.Module):
    """Linear Q head, dueling or plain (see the module docstring)."""

    def __init__(self, in_features: int, num_actions: int, dueling: bool) -> None:
        super().__init__()
        self.dueling = dueling
        if dueling:
            self.value = nn.Linear(in_features, 1)
            self.advantage = nn.Linear(in_features, num_actions)
        else:
            self.q = nn.Linear(in_features, num_actions)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.dueling:
            return self.q(x)
        adv = self.advantage(x)
        return self.value(x) + adv - adv.mean(dim=1, keepdim=True)


def _mlp(in_features: int, hiddens: Sequence[int]) -> tuple[nn.Sequential, int]:
    layers: list[nn.Module] = []
    for h in hiddens:
        layers += [nn.Linear(in_features, int(h)), nn.ReLU()]
        in_features = int(h)
    return nn.Sequential(*layers), in_features


class MLPQNetwork(nn.Module):
    """Q(s, .) for vector observations: ReLU MLP ``hiddens`` then the (dueling) head."""

    def __init__(
        self, obs_dim: int, num_actions: int, hiddens: Sequence[int], dueling: bool
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.dueling = dueling
        self.trunk, features = _mlp(obs_dim, hiddens)
        self.head = _Head(features, num_actions, dueling)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.head(self.trunk(obs.float().flatten(1)))


class ConvQNetwork(nn.Module):
    """Q(s, .) for image observations (see the module docstring for the layers)."""

    def __init__(
        self,
        shape_chw: tuple[int, int, int],
        num_actions: int,
        hiddens: Sequence[int],
        dueling: bool,
        *,
        channels_last: bool,
        scale: float,
    ) -> None:
        super().__init__()
        self.num_actions = num_actions
        self.channels_last = channels_last
        self.scale = scale
        c, h, w = shape_chw
        if min(h, w) >= 36:
            self.conv = nn.Sequential(
                nn.Conv2d(c, 32, 8, stride=4),
                nn.ReLU(),
                nn.Conv2d(32, 64, 4, stride=2),
                nn.ReLU(),
                nn.Conv2d(64, 64, 3, stride=1),
                nn.ReLU(),
                nn.Flatten(),
            )
        else:
            self.conv = nn.Sequential(nn.Conv2d(c, 16, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.conv(torch.zeros(1, c, h, w)).shape[1]
        self.fc, features = _mlp(flat, hiddens)
        self.head = _Head(features, num_actions, dueling)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float()
        if self.scale != 1.0:
            x = x * self.scale
        if x.dim() == 3:  # (B, H, W) grayscale
            x = x.unsqueeze(1)
        elif self.channels_last:
            x = x.permute(0, 3, 1, 2)
        return self.head(self.fc(self.conv(x)))


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


def build_q_network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    hiddens: Sequence[int] = (256,),
    dueling: bool = True,
    *,
    channels_last: bool | None = None,
) -> nn.Module:
    """The Q-network for these spaces: ``module(obs_batch) -> (B, action_space.n)`` Q-values.

    ``action_space`` must be ``Discrete``; ``observation_space`` a ``Box`` of rank
    1 (MLP), 2 or 3 (CNN). For rank 3, ``channels_last=None`` guesses the layout:
    HWC when the last axis is the smallest (``(84, 84, 4)``, ``(10, 10, 10)``),
    else CHW (``(4, 84, 84)``). Anything else raises ``ValueError`` naming the space.
    """
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(
            f"unsupported action space {action_space!r}: Q-learning needs a gymnasium Discrete space"
        )
    num_actions = int(action_space.n)
    hiddens = tuple(int(h) for h in hiddens)
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: "
            "need a gymnasium Box of rank 1 (vector) or 2-3 (image)"
        )
    shape = tuple(observation_space.shape)
    if len(shape) == 1:
        return MLPQNetwork(shape[0], num_actions, hiddens, dueling)
    if len(shape) not in (2, 3):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: "
            f"Box of rank {len(shape)}; need rank 1 (vector) or 2-3 (image)"
        )
    scale = input_scale(observation_space)
    if len(shape) == 2:
        return ConvQNetwork(
            (1, *shape), num_actions, hiddens, dueling, channels_last=False, scale=scale
        )
    if channels_last is None:
        channels_last = shape[2] <= min(shape[0], shape[1])
    chw = (shape[2], shape[0], shape[1]) if channels_last else shape
    return ConvQNetwork(
        chw, num_actions, hiddens, dueling, channels_last=channels_last, scale=scale
    )


class NumpyMLPQ:
    """Numpy forward pass of an :class:`MLPQNetwork` from its weights dict.

    ``weights`` maps the module's state-dict names (``trunk.0.weight``, ...,
    ``head.value.weight`` / ``head.advantage.weight`` or ``head.q.weight``) to
    arrays. ``q_values(obs)`` with ``obs`` of shape (B, d) or (d,) returns
    float32 Q-values of shape (B, A) or (A,), equal to the torch module's.
    """

    def __init__(self, weights: Mapping[str, np.ndarray]) -> None:
        idx = sorted(
            {int(k.split(".")[1]) for k in weights if k.startswith("trunk.")},
        )
        self.layers = [
            (
                np.ascontiguousarray(np.asarray(weights[f"trunk.{i}.weight"], np.float32).T),
                np.asarray(weights[f"trunk.{i}.bias"], np.float32),
            )
            for i in idx
        ]
        self.dueling = "head.value.weight" in weights
        if self.dueling:
            w = np.concatenate([weights["head.value.weight"], weights["head.advantage.weight"]])
            b = np.concatenate([weights["head.value.bias"], weights["head.advantage.bias"]])
        else:
            w, b = weights["head.q.weight"], weights["head.q.bias"]
        self.head = (
            np.ascontiguousarray(np.asarray(w, np.float32).T),
            np.asarray(b, np.float32),
        )

    def q_values(self, obs: np.ndarray) -> np.ndarray:
        x = np.asarray(obs, dtype=np.float32)
        single = x.ndim == 1
        if single:
            x = x[None]
        for w, b in self.layers:
            x = x @ w
            x += b
            np.maximum(x, 0.0, out=x)
        out = x @ self.head[0]
        out += self.head[1]
        if self.dueling:
            value, adv = out[:, :1], out[:, 1:]
            mean = np.add.reduce(adv, axis=1, keepdims=True) / adv.shape[1]  # adv.mean, faster
            out = value + adv - mean
        return out[0] if single else out
