"""Q-networks for discrete actions: a torso (:mod:`apex_dask.algo.agents.torsos`) and a head.

* Vector observations (``Box`` of shape ``(d,)``): the MLP torso (``trunk``).
* Image observations (``Box`` of shape ``(H, W)``, ``(H, W, C)`` or ``(C, H, W)``):
  frames scaled to [0, 1] inside the network by the space's bounds
  (:func:`~apex_dask.algo.agents.torsos.input_scale`; ``Box(0, 255)``: / 255, so replay
  stores ``uint8``), HWC permuted to CHW, the conv encoder (``conv``: ``auto`` the
  Nature-DQN or MinAtar convolutions, ``impala`` the IMPALA ResNet), then the MLP
  layers ``hiddens`` (``fc``).

The head gives K outputs per action (K = 1 for a scalar head, the atoms of C51,
the bins of HL-Gauss; :mod:`apex_dask.algo.agents.dqn.heads`). With ``dueling``
(Wang et al. 2016), per output k

    out(s, a)_k = V(s)_k + A(s, a)_k - (1/|A|) * sum_b A(s, b)_k

from a value stream ``V`` and an advantage stream ``A``, one linear layer each (noisy
with ``noisy``); without it a single linear layer. ``forward`` always returns the
Q-values ``(B, |A|)`` (for C51 and HL-Gauss the expected value
``sum_k softmax_k(out) * support_k``), so acting, evaluation and export take the argmax
of the expected value; ``logits`` gives ``(B, |A|, K)`` to the distributional losses.

The default settings build exactly the modules (and state-dict names) of earlier
versions: ``trunk.0.weight``, ..., ``head.value.weight`` / ``head.advantage.weight``
or ``head.q.weight``; ``conv.*``, ``fc.*`` for images.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from gymnasium import spaces
from torch import nn

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.heads import support
from apex_dask.algo.agents.dqn.numpy_net import NumpyMLPQ
from apex_dask.algo.agents.torsos import (
    conv_encoder,
    image_chw,
    image_input,
    input_scale,
    is_image_space,
    linear_layer,
    mlp_layers,
)

__all__ = [
    "build_q_network",
    "q_network",
    "input_scale",
    "MLPQNetwork",
    "ConvQNetwork",
    "NumpyMLPQ",
    "is_image_space",
]


class _Head(nn.Module):
    """Linear head, dueling or plain, K outputs per action (see the module docstring)."""

    def __init__(
        self,
        in_features: int,
        num_actions: int,
        dueling: bool,
        num_outputs: int = 1,
        noisy_sigma0: float | None = None,
    ) -> None:
        super().__init__()
        self.dueling = dueling
        self.num_actions, self.num_outputs = num_actions, num_outputs
        k = num_outputs
        if dueling:
            self.value = linear_layer(in_features, k, noisy_sigma0)
            self.advantage = linear_layer(in_features, num_actions * k, noisy_sigma0)
        else:
            self.q = linear_layer(in_features, num_actions * k, noisy_sigma0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """(B, |A|) for one output per action, else (B, |A|, K)."""
        k = self.num_outputs
        if not self.dueling:
            out = self.q(x)
            return out if k == 1 else out.view(-1, self.num_actions, k)
        adv = self.advantage(x)
        if k == 1:
            return self.value(x) + adv - adv.mean(dim=1, keepdim=True)
        adv = adv.view(-1, self.num_actions, k)
        return self.value(x).unsqueeze(1) + adv - adv.mean(dim=1, keepdim=True)


class _QNetwork(nn.Module):
    """``forward`` -> Q-values, ``logits`` -> (B, |A|, K) (distributional heads)."""

    head: _Head

    def _init_head(self, features: int, num_actions: int, config: DQNConfig) -> None:
        self.num_actions = num_actions
        self.dueling = config.dueling
        self.head = _Head(
            features, num_actions, config.dueling, config.num_outputs, config.noisy_sigma0
        )
        values = support(config)
        self.distributional = values is not None
        if values is not None:  # not saved: made from the config
            self.register_buffer("support", torch.from_numpy(values), persistent=False)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def logits(self, obs: torch.Tensor) -> torch.Tensor:
        """(B, |A|, K) head outputs (logits of the atoms or bins)."""
        return self.head(self.features(obs))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        out = self.head(self.features(obs))
        if not self.distributional:
            return out
        return (torch.softmax(out.float(), dim=2) * self.support).sum(dim=2)


class MLPQNetwork(_QNetwork):
    """Q(s, .) for vector observations: the MLP torso ``trunk``, then the head."""

    def __init__(
        self,
        obs_dim: int,
        num_actions: int,
        hiddens: Sequence[int],
        dueling: bool,
        config: DQNConfig | None = None,
    ) -> None:
        super().__init__()
        o = config if config is not None else DQNConfig(hiddens=tuple(hiddens), dueling=dueling)
        self.trunk, features = mlp_layers(
            obs_dim, hiddens, layer_norm=o.layer_norm, noisy_sigma0=o.noisy_sigma0
        )
        self._init_head(features, num_actions, o)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.trunk(obs.float().flatten(1))


class ConvQNetwork(_QNetwork):
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
        config: DQNConfig | None = None,
    ) -> None:
        super().__init__()
        o = config if config is not None else DQNConfig(hiddens=tuple(hiddens), dueling=dueling)
        self.channels_last = channels_last
        self.scale = scale
        self.conv, flat = conv_encoder(
            shape_chw, encoder=o.encoder, layer_norm=o.layer_norm, impala_scale=o.impala_scale
        )
        self.fc, features = mlp_layers(
            flat, hiddens, layer_norm=o.layer_norm, noisy_sigma0=o.noisy_sigma0
        )
        self._init_head(features, num_actions, o)

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(image_input(obs, self.scale, self.channels_last)))


def q_network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    config: DQNConfig,
    *,
    channels_last: bool | None = None,
) -> _QNetwork:
    """The Q-network ``config`` describes for these spaces: ``module(obs_batch) ->
    (B, action_space.n)`` Q-values.

    ``action_space`` must be ``Discrete``; ``observation_space`` a ``Box`` of rank
    1 (MLP), 2 or 3 (conv encoder). For rank 3, ``channels_last=None`` guesses the layout:
    HWC when the last axis is the smallest (``(84, 84, 4)``, ``(10, 10, 10)``),
    else CHW (``(4, 84, 84)``). Anything else raises ``ValueError`` naming the space.
    """
    if not isinstance(action_space, spaces.Discrete):
        raise ValueError(
            f"unsupported action space {action_space!r}: Q-learning needs a gymnasium Discrete space"
        )
    num_actions = int(action_space.n)
    hiddens = tuple(int(h) for h in config.hiddens)
    if not isinstance(observation_space, spaces.Box):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: "
            "need a gymnasium Box of rank 1 (vector) or 2-3 (image)"
        )
    shape = tuple(observation_space.shape)
    if len(shape) == 1:
        return MLPQNetwork(shape[0], num_actions, hiddens, config.dueling, config)
    if not is_image_space(observation_space):
        raise ValueError(
            f"unsupported observation space {observation_space!r}: "
            f"Box of rank {len(shape)}; need rank 1 (vector) or 2-3 (image)"
        )
    chw, last = image_chw(shape, channels_last)
    return ConvQNetwork(
        chw,
        num_actions,
        hiddens,
        config.dueling,
        channels_last=last,
        scale=input_scale(observation_space),
        config=config,
    )


def build_q_network(
    observation_space: spaces.Space,
    action_space: spaces.Space,
    hiddens: Sequence[int] = (256,),
    dueling: bool = True,
    *,
    channels_last: bool | None = None,
) -> _QNetwork:
    """A scalar-head Q-network of ReLU layers ``hiddens`` (:func:`q_network` with
    ``DQNConfig(hiddens=hiddens, dueling=dueling)``)."""
    config = DQNConfig(hiddens=tuple(int(h) for h in hiddens), dueling=dueling)
    return q_network(observation_space, action_space, config, channels_last=channels_last)
