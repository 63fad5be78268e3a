"""R2D2's recurrent Q-network: a torso, an LSTM core and a dueling head.

::

    net = RecurrentQNetwork(obs_space, act_space, R2D2Config())
    state = net.initial_state(batch=4)                 # (h, c), each (4, lstm_size)
    q, state = net.step(obs, state)                    # acting: one step, q (4, |A|)
    q, state = net.unroll(obs_seq, state, first)       # learning: (B, T, |A|)

The torso is the existing one of :mod:`apex_dask.algo.agents.torsos`: the MLP for
vectors, the conv encoder (Nature CNN / MinAtar conv, or the IMPALA ResNet) then
the MLP for images. The core is one ``nn.LSTM`` layer; the head is dueling
(``Q = V + A - mean_a A``, one linear layer each) or a single linear layer.

``first[:, t]`` (1.0 at a sequence's first real step) puts the given state back
before step ``t`` is read: ``(h, c) <- first_t * state + (1 - first_t) * (h, c)``, so
an unroll over a sequence padded in front (its episode began inside the burn-in)
meets the episode's first step with the state the env worker had there. Runs of
steps without such a mark go through ``nn.LSTM`` in one call.
"""

from __future__ import annotations

import torch
from gymnasium import spaces
from torch import nn

from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.torsos import (
    conv_encoder,
    image_chw,
    image_input,
    input_scale,
    is_image_space,
    mlp_layers,
)

__all__ = ["RecurrentQNetwork", "State"]

State = tuple[torch.Tensor, torch.Tensor]
"""The LSTM's ``(h, c)``, each ``(B, lstm_size)``."""


class RecurrentQNetwork(nn.Module):
    """Torso -> LSTM -> dueling head; see the module docstring."""

    def __init__(
        self, observation_space: spaces.Box, action_space: spaces.Discrete, config: R2D2Config
    ) -> None:
        super().__init__()
        o = config
        self.image = is_image_space(observation_space)
        self.num_actions = int(action_space.n)
        self.lstm_size = int(o.lstm_size)
        self.dueling = bool(o.dueling)
        if self.image:
            chw, self.channels_last = image_chw(tuple(observation_space.shape))
            self.scale = float(input_scale(observation_space))
            self.conv, features = conv_encoder(chw, encoder=o.encoder, impala_scale=o.impala_scale)
        else:
            self.channels_last, self.scale = False, 1.0
            self.conv = nn.Identity()
            features = int(observation_space.shape[0])
        self.trunk, features = mlp_layers(features, o.hiddens)
        self.core = nn.LSTM(features, self.lstm_size, batch_first=True)
        if self.dueling:
            self.value = nn.Linear(self.lstm_size, 1)
            self.advantage = nn.Linear(self.lstm_size, self.num_actions)
        else:
            self.q = nn.Linear(self.lstm_size, self.num_actions)

    def initial_state(self, batch: int, device: str | torch.device = "cpu") -> State:
        """Zeros: the state at an episode's start."""
        z = torch.zeros(batch, self.lstm_size, device=device)
        return z, z.clone()

    def features(self, obs: torch.Tensor) -> torch.Tensor:
        """Torso features of observations ``(B, *obs_shape)`` -> ``(B, F)``."""
        if self.image:
            obs = self.conv(image_input(obs, self.scale, self.channels_last))
        return self.trunk(obs.float())

    def head(self, out: torch.Tensor) -> torch.Tensor:
        """Q-values from the core's outputs (any leading axes)."""
        if not self.dueling:
            return self.q(out)
        adv = self.advantage(out)
        return self.value(out) + adv - adv.mean(dim=-1, keepdim=True)

    def step(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """One step of every env: ``q (B, |A|)`` and the state after it."""
        x = self.features(obs).unsqueeze(1)
        out, (h, c) = self.core(x, (state[0].unsqueeze(0), state[1].unsqueeze(0)))
        return self.head(out[:, 0]), (h[0], c[0])

    def step_cell(self, obs: torch.Tensor, state: State) -> tuple[torch.Tensor, State]:
        """:meth:`step` through one fused LSTM cell (``torch.lstm_cell``, the core's own
        weights): the same maths (equal within float rounding) at about a quarter of
        ``nn.LSTM``'s per-call cost for a single step; the env workers' acting pass."""
        core = self.core
        h, c = torch.lstm_cell(
            self.features(obs),
            state,
            core.weight_ih_l0,
            core.weight_hh_l0,
            core.bias_ih_l0,
            core.bias_hh_l0,
        )
        return self.head(h), (h, c)

    def forward(self, obs: torch.Tensor, h: torch.Tensor, c: torch.Tensor):
        """``step`` for TorchScript export: ``(q, h, c)``."""
        q, (h2, c2) = self.step(obs, (h, c))
        return q, h2, c2

    def unroll(
        self,
        obs: torch.Tensor,
        state: State,
        first: torch.Tensor | None = None,
        stored: State | None = None,
    ) -> tuple[torch.Tensor, State]:
        """Q-values ``(B, T, |A|)`` of sequences ``obs (B, T, *obs_shape)`` from ``state``;
        ``stored`` (default: ``state``) is put back before the steps ``first`` marks.
        Also the state after the last step."""
        b, t = obs.shape[0], obs.shape[1]
        x = self.features(obs.reshape(b * t, *obs.shape[2:])).reshape(b, t, -1)
        back = state if stored is None else stored
        h0, c0 = back[0].unsqueeze(0), back[1].unsqueeze(0)
        h, c = state[0].unsqueeze(0), state[1].unsqueeze(0)
        cuts = [] if first is None else torch.nonzero(first.any(dim=0)).flatten().tolist()
        bounds = sorted({0, t, *cuts})
        outs = []
        for lo, hi in zip(bounds[:-1], bounds[1:], strict=True):
            if first is not None and lo in cuts:
                mark = first[:, lo].to(h.dtype).view(1, b, 1)
                h, c = mark * h0 + (1.0 - mark) * h, mark * c0 + (1.0 - mark) * c
            out, (h, c) = self.core(x[:, lo:hi], (h, c))
            outs.append(out)
        return self.head(torch.cat(outs, dim=1)), (h[0], c[0])
