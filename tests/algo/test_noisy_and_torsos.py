"""Noisy layers (their initialisation, noise statistics, mean weights in evaluation) and
the torsos (LayerNorm, the IMPALA encoder), checked against numpy in the test."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.networks import ConvQNetwork, NumpyMLPQ, q_network
from apex_dask.algo.agents.noisy import NoisyLinear, draw_noise, noise_numpy, noisy_layers
from apex_dask.algo.agents.torsos import ChannelNorm, ImpalaStage, conv_encoder, mlp_layers

VEC = spaces.Box(-1.0, 1.0, (6,), np.float32)


def test_noisy_layer_starts_as_the_factorised_initialisation_and_evaluates_on_the_mean():
    torch.manual_seed(0)
    layer = NoisyLinear(16, 5, sigma0=0.5)
    bound = 1 / math.sqrt(16)
    assert float(layer.weight_mu.detach().abs().max()) <= bound
    assert float(layer.bias_mu.detach().abs().max()) <= bound
    np.testing.assert_allclose(layer.weight_sigma.detach().numpy(), 0.5 * bound)
    np.testing.assert_allclose(layer.bias_sigma.detach().numpy(), 0.5 * bound)
    assert set(layer.state_dict()) == {"weight_mu", "weight_sigma", "bias_mu", "bias_sigma"}
    x = torch.randn(3, 16)
    draw_noise(layer, torch.Generator().manual_seed(1))
    noisy = layer(x)
    layer.eval()
    mean = layer(x)
    w, b = layer.weight_mu.detach().numpy(), layer.bias_mu.detach().numpy()
    np.testing.assert_allclose(mean.detach().numpy(), x.numpy() @ w.T + b, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(noisy, mean)


def test_noise_has_the_factorised_statistics():
    """(W - mu) / sigma = f(e_out) f(e_in)^T, f(x) = sgn(x) sqrt|x|: rank one, mean 0,
    E[f(e)^2] = E|e| = sqrt(2/pi), so Var = 2/pi for weights and sqrt(2/pi) for biases."""
    torch.manual_seed(0)
    layer = NoisyLinear(4, 3, sigma0=0.5)
    gen = torch.Generator().manual_seed(7)
    ws, bs = [], []
    for _ in range(5000):
        draw_noise(layer, gen)
        w = torch.outer(layer.noise_out, layer.noise_in)
        assert torch.linalg.matrix_rank(w) <= 1
        ws.append(w.numpy().copy())
        bs.append(layer.noise_out.numpy().copy())
    ws, bs = np.array(ws), np.array(bs)
    assert abs(ws.mean()) < 0.02 and abs(bs.mean()) < 0.03
    assert ws.var() == pytest.approx(2 / math.pi, rel=0.05)
    assert bs.var() == pytest.approx(math.sqrt(2 / math.pi), rel=0.05)
    # the effective weights: mu + sigma * noise, as the forward pass uses them
    x = torch.eye(4)
    draw_noise(layer, gen)
    eff = layer(x).detach().numpy().T - layer.bias_mu.detach().numpy()[:, None]
    eff -= (layer.bias_sigma * layer.noise_out).detach().numpy()[:, None]
    want = layer.weight_mu + layer.weight_sigma * torch.outer(layer.noise_out, layer.noise_in)
    np.testing.assert_allclose(eff, want.detach().numpy(), rtol=1e-5, atol=1e-6)
    # numpy's noise has the same law
    draws = noise_numpy(np.random.default_rng(0), [(4, 3)] * 5000)
    f_in = np.array([d[0] for d in draws])
    assert (f_in**2).mean() == pytest.approx(math.sqrt(2 / math.pi), rel=0.05)
    assert f_in.dtype == np.float32


def test_a_seeded_generator_repeats_its_noise():
    torch.manual_seed(0)
    net = q_network(VEC, spaces.Discrete(3), DQNConfig(hiddens=(8,), noisy=True))
    assert len(noisy_layers(net)) == 3  # the trunk's layer, the value and advantage streams
    draw_noise(net, torch.Generator().manual_seed(3))
    first = [layer.noise_in.clone() for layer in noisy_layers(net)]
    draw_noise(net, torch.Generator().manual_seed(3))
    assert all(torch.equal(a, b.noise_in) for a, b in zip(first, noisy_layers(net), strict=True))
    assert not any(k.startswith("noise") or ".noise" in k for k in net.state_dict())


@pytest.mark.parametrize(
    "options",
    [
        DQNConfig(hiddens=(16, 8), noisy=True),
        DQNConfig(hiddens=(16,), noisy=True, num_atoms=11, layer_norm=True),
        DQNConfig(hiddens=(16,), noisy=True, loss="hl_gauss", num_bins=7, dueling=False),
        DQNConfig(hiddens=(16, 16), layer_norm=True),
        DQNConfig(hiddens=(), num_atoms=5),
    ],
)
def test_the_numpy_forward_equals_torch_with_the_same_noise(options):
    torch.manual_seed(1)
    net = q_network(VEC, spaces.Discrete(4), options)
    np_net = NumpyMLPQ(module_weights(net), options)
    x = np.random.default_rng(0).normal(size=(9, 6)).astype(np.float32)
    net.eval()
    mean = net(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np_net.q_values(x), mean, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_net.q_values(x[2]), mean[2], rtol=1e-5, atol=1e-5)
    if not options.noisy:
        return
    noise = noise_numpy(np.random.default_rng(1), np_net.noise_shapes)
    for layer, (f_in, f_out) in zip(noisy_layers(net), noise, strict=True):
        layer.set_noise(torch.from_numpy(f_in), torch.from_numpy(f_out))
    net.train()
    noisy = net(torch.from_numpy(x)).detach().numpy()
    np.testing.assert_allclose(np_net.q_values(x, noise), noisy, rtol=1e-5, atol=1e-5)
    assert not np.allclose(noisy, mean, atol=1e-3)


def test_layer_norm_sits_before_each_relu_and_normalises_the_layer():
    torch.manual_seed(0)
    mlp, out = mlp_layers(5, (12, 7), layer_norm=True)
    kinds = [type(m).__name__ for m in mlp]
    assert kinds == ["Linear", "LayerNorm", "ReLU"] * 2 and out == 7
    x = torch.randn(4, 5)
    h = mlp[1](mlp[0](x)).detach().numpy()  # default affine: weight 1, bias 0
    np.testing.assert_allclose(h.mean(1), 0, atol=1e-5)
    np.testing.assert_allclose(h.var(1), 1, atol=1e-3)
    norm = ChannelNorm(3)
    maps = torch.randn(2, 3, 4, 5)
    y = norm(maps).detach().numpy()
    m = maps.numpy()
    want = (m - m.mean(1, keepdims=True)) / np.sqrt(m.var(1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-4, atol=1e-5)
    conv, _ = conv_encoder((4, 10, 10), layer_norm=True)
    assert [type(m).__name__ for m in conv] == ["Conv2d", "ChannelNorm", "ReLU", "Flatten"]


@pytest.mark.parametrize(
    ("shape", "scale", "flat"),
    [((4, 84, 84), 1, 32 * 11 * 11), ((10, 10, 4), 1, 32 * 2 * 2), ((10, 10, 4), 2, 64 * 2 * 2)],
)
def test_impala_encoder_has_three_residual_stages_of_16_32_32_channels(shape, scale, flat):
    torch.manual_seed(0)
    space = spaces.Box(0, 255 if shape[0] == 4 else 1, shape, np.uint8)
    options = DQNConfig(hiddens=(32,), encoder="impala", impala_scale=scale)
    net = q_network(space, spaces.Discrete(5), options)
    assert isinstance(net, ConvQNetwork)
    stages = [m for m in net.conv if isinstance(m, ImpalaStage)]
    assert [s.conv.out_channels for s in stages] == [16 * scale, 32 * scale, 32 * scale]
    convs = [m for m in net.conv.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 15 and all(c.kernel_size == (3, 3) for c in convs)
    assert net.fc[0].in_features == flat
    obs = torch.from_numpy(np.ones((3, *shape), np.uint8))
    assert net(obs).shape == (3, 5)
    # a residual block adds its input back: zero convolutions leave x unchanged
    block = stages[0].res0
    for c in (block.conv0, block.conv1):
        torch.nn.init.zeros_(c.weight)
        torch.nn.init.zeros_(c.bias)
    x = torch.randn(2, 16 * scale, 5, 5)
    torch.testing.assert_close(block(x), x)
