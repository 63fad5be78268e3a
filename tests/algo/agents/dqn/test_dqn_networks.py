import numpy as np
import pytest
import torch
from gymnasium import spaces

from apex_dask.algo.agents.dqn.networks import (
    ConvQNetwork,
    MLPQNetwork,
    NumpyMLPQ,
    build_q_network,
)

VEC = spaces.Box(-1.0, 1.0, (4,), np.float32)


def _state_numpy(net):
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def test_mlp_has_requested_layers_and_action_count():
    torch.manual_seed(0)
    net = build_q_network(VEC, spaces.Discrete(3), hiddens=(32, 16))
    assert isinstance(net, MLPQNetwork)
    linears = [m for m in net.trunk if isinstance(m, torch.nn.Linear)]
    assert [(m.in_features, m.out_features) for m in linears] == [(4, 32), (32, 16)]
    q = net(torch.zeros(5, 4))
    assert q.shape == (5, 3)


def test_dueling_head_mean_q_equals_value_stream():
    torch.manual_seed(0)
    net = build_q_network(VEC, spaces.Discrete(5), hiddens=(8,), dueling=True)
    x = torch.randn(7, 4)
    q = net(x)
    value = net.head.value(net.trunk(x))
    # Q = V + A - mean(A)  =>  mean_a Q(s, a) = V(s)
    torch.testing.assert_close(q.mean(dim=1, keepdim=True), value)


def test_plain_head_has_no_value_stream():
    net = build_q_network(VEC, spaces.Discrete(2), hiddens=(8,), dueling=False)
    names = set(net.state_dict())
    assert "head.q.weight" in names and not any("value" in n for n in names)


@pytest.mark.parametrize("dueling", [True, False])
@pytest.mark.parametrize("hiddens", [(16,), (32, 32), ()])
def test_numpy_forward_matches_torch(dueling, hiddens):
    torch.manual_seed(1)
    net = build_q_network(VEC, spaces.Discrete(3), hiddens=hiddens, dueling=dueling)
    x = np.random.default_rng(0).normal(size=(9, 4)).astype(np.float32)
    expected = net(torch.from_numpy(x)).detach().numpy()
    np_net = NumpyMLPQ(_state_numpy(net))
    np.testing.assert_allclose(np_net.q_values(x), expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np_net.q_values(x[3]), expected[3], rtol=1e-5, atol=1e-5)


def test_nature_cnn_on_uint8_hwc_frames_scales_inside():
    torch.manual_seed(0)
    space = spaces.Box(0, 255, (84, 84, 4), np.uint8)
    net = build_q_network(space, spaces.Discrete(6), hiddens=(512,))
    assert isinstance(net, ConvQNetwork) and net.channels_last
    convs = [m for m in net.conv if isinstance(m, torch.nn.Conv2d)]
    assert [(c.out_channels, c.kernel_size, c.stride) for c in convs] == [
        (32, (8, 8), (4, 4)),
        (64, (4, 4), (2, 2)),
        (64, (3, 3), (1, 1)),
    ]
    frames = torch.randint(0, 256, (2, 84, 84, 4), dtype=torch.uint8)
    q = net(frames)
    assert q.shape == (2, 6)
    # Same weights, frames given as floats in [0, 1] through an unscaled copy.
    net.scale = 1.0
    torch.testing.assert_close(net(frames.float() / 255.0), q)


def test_chw_and_hwc_layouts_agree():
    torch.manual_seed(0)
    hwc = build_q_network(spaces.Box(0, 255, (84, 84, 4), np.uint8), spaces.Discrete(4))
    chw = build_q_network(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(4))
    assert not chw.channels_last
    chw.load_state_dict(hwc.state_dict())
    frames = torch.randint(0, 256, (3, 84, 84, 4), dtype=torch.uint8)
    torch.testing.assert_close(chw(frames.permute(0, 3, 1, 2)), hwc(frames))


@pytest.mark.parametrize("shape", [(10, 10, 4), (10, 10, 10), (10, 10)])
def test_small_grids_use_small_conv(shape):
    space = spaces.Box(0, 1, shape, bool)
    net = build_q_network(space, spaces.Discrete(3), hiddens=(128,))
    convs = [m for m in net.conv if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 1 and convs[0].out_channels == 16
    obs = torch.from_numpy(np.ones((2, *shape), dtype=bool))
    assert net(obs).shape == (2, 3)


@pytest.mark.parametrize(
    "obs_space,act_space,fragment",
    [
        (VEC, spaces.Box(-1, 1, (2,)), "Box"),
        (VEC, spaces.MultiDiscrete([2, 2]), "MultiDiscrete"),
        (spaces.Discrete(16), spaces.Discrete(4), "Discrete(16)"),
        (spaces.Dict({"a": VEC}), spaces.Discrete(2), "Dict"),
        (spaces.Box(0, 1, (2, 3, 4, 5)), spaces.Discrete(2), "(2, 3, 4, 5)"),
    ],
)
def test_unsupported_spaces_raise_naming_the_space(obs_space, act_space, fragment):
    with pytest.raises(ValueError, match="unsupported") as info:
        build_q_network(obs_space, act_space)
    assert fragment in str(info.value)


@pytest.mark.parametrize(
    "space, scale",
    [
        (spaces.Box(0, 255, (10, 10, 4), np.uint8), 1 / 255),
        (spaces.Box(0, 1, (10, 10, 4), np.uint8), 1.0),  # MinAtar master's declared space
        (spaces.Box(0, 1, (10, 10, 4), bool), 1.0),  # MinAtar 1.0.15 declares bool frames
        (spaces.Box(0.0, 255.0, (4, 84, 84), np.float32), 1 / 255),
        (spaces.Box(-1.0, 1.0, (10, 10, 4), np.float32), 1.0),
        (spaces.Box(-np.inf, np.inf, (10, 10, 4), np.float32), 1.0),
    ],
    ids=["uint8-0-255", "uint8-0-1", "bool", "float-0-255", "float-signed", "unbounded"],
)
def test_image_inputs_are_scaled_by_the_space_bounds_not_the_dtype(space, scale):
    torch.manual_seed(0)
    net = build_q_network(space, spaces.Discrete(3), hiddens=(16,))
    assert net.scale == pytest.approx(scale)
    # The network sees the frame in [0, 1] for all of them: an all-"high" frame
    # gives the same Q-values as a float frame of ones through an unscaled copy.
    high = np.broadcast_to(np.minimum(space.high, 255), space.shape).astype(space.dtype)
    q = net(torch.as_tensor(high[None]))
    ones = torch.as_tensor(high[None]).float() * scale
    net.scale = 1.0
    torch.testing.assert_close(net(ones), q)
    if space.dtype != np.float32:
        assert ones.max().item() == pytest.approx(1.0)
