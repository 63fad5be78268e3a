"""R2D2's maths against hand computation: h and its inverse, n-step targets over a
sequence, sequence priorities, burn-in without gradient, the LSTM core's resets."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from gymnasium import spaces

from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.loss import (
    nstep_returns,
    sequence_priorities,
    unroll_with_burn_in,
    value_rescale,
    value_rescale_inv,
)
from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork


def h_by_hand(x: float, eps: float = 1e-3) -> float:
    s = 1.0 if x > 0 else (-1.0 if x < 0 else 0.0)
    return s * (math.sqrt(abs(x) + 1.0) - 1.0) + eps * x


@pytest.mark.parametrize("x", [0.0, 1.0, -1.0, 3.0, -7.5, 100.0, 1e4, -1e5])
def test_value_rescale_matches_the_formula(x):
    got = float(value_rescale(torch.tensor(x, dtype=torch.float64)))
    assert got == pytest.approx(h_by_hand(x), rel=1e-12, abs=1e-12)


def test_value_rescale_inverse_round_trips_both_ways():
    x = torch.linspace(-1e4, 1e4, 20001, dtype=torch.float64)
    assert torch.allclose(value_rescale_inv(value_rescale(x)), x, rtol=1e-9, atol=1e-7)
    y = torch.linspace(-200, 200, 4001, dtype=torch.float64)
    assert torch.allclose(value_rescale(value_rescale_inv(y)), y, rtol=1e-9, atol=1e-9)
    # h compresses: h(100) is about 9.1, not 100
    assert float(value_rescale(torch.tensor(100.0))) == pytest.approx(h_by_hand(100.0), 1e-6)


def returns_by_hand(reward, done, mask, boot, n, gamma):
    """G_t from first principles: walk forward over the real steps."""
    t_len = len(reward)
    out = np.zeros(t_len)
    for t in range(t_len):
        g, k, term = 0.0, 0, False
        while k < n and t + k < t_len and mask[t + k] > 0:
            g += gamma**k * reward[t + k]
            term = term or bool(done[t + k])
            k += 1
        out[t] = g + (0.0 if term else gamma**k * boot[t + k])
    return out


CASES = {
    # reward, done, mask (T = 6), boot (T + 1)
    "mid-episode": ([1, 2, 3, 4, 5, 6], [0] * 6, [1] * 6),
    "terminated at step 3": ([1, 1, 1, 1, 0, 0], [0, 0, 0, 1, 0, 0], [1, 1, 1, 1, 0, 0]),
    "time limit at step 3": ([1, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 0, 0]),
    "front padding": ([0, 0, 2, 1, 1, 1], [0] * 6, [0, 0, 1, 1, 1, 1]),
}


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("n", [1, 3, 5])
def test_nstep_returns_against_hand_computation(case, n):
    reward, done, mask = (np.asarray(a, np.float64) for a in CASES[case])
    boot = np.arange(10.0, 17.0)
    gamma = 0.9
    got = nstep_returns(
        *(torch.tensor(a)[None] for a in (reward, done, mask, boot)), n=n, gamma=gamma
    )[0].numpy()
    want = returns_by_hand(reward, done, mask, boot, n, gamma)
    real = mask > 0
    np.testing.assert_allclose(got[real], want[real], rtol=1e-12)


def test_nstep_returns_one_case_written_out():
    # T = 4, n = 2, gamma 0.5, terminated at step 2 (step 3 is padding)
    r = torch.tensor([[1.0, 2.0, 4.0, 0.0]], dtype=torch.float64)
    d = torch.tensor([[0.0, 0.0, 1.0, 0.0]], dtype=torch.float64)
    m = torch.tensor([[1.0, 1.0, 1.0, 0.0]], dtype=torch.float64)
    v = torch.tensor([[10.0, 20.0, 30.0, 40.0, 50.0]], dtype=torch.float64)
    g = nstep_returns(r, d, m, v, n=2, gamma=0.5)[0]
    assert g[0].item() == 1 + 0.5 * 2 + 0.25 * 30  # bootstraps from o_2
    assert g[1].item() == 2 + 0.5 * 4  # the termination cuts the bootstrap
    assert g[2].item() == 4.0


def test_sequence_priorities_against_hand_computation():
    td = torch.tensor([[0.5, 2.0, 1.0, 9.0], [3.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    trained = torch.tensor([[0.0, 1.0, 1.0, 1.0], [1.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
    p = sequence_priorities(td, trained, eta=0.9).tolist()
    assert p[0] == pytest.approx(0.9 * 9.0 + 0.1 * (2.0 + 1.0 + 9.0) / 3)
    assert p[1] == pytest.approx(0.9 * 3.0 + 0.1 * (3.0 + 1.0) / 2)
    p0 = sequence_priorities(td, trained, eta=0.0).tolist()
    assert p0[0] == pytest.approx(4.0)  # the mean alone


def small_net(seed=0, obs_dim=3, actions=2):
    torch.manual_seed(seed)
    o = R2D2Config(hiddens=(8,), lstm_size=6)
    return RecurrentQNetwork(spaces.Box(-1, 1, (obs_dim,)), spaces.Discrete(actions), o)


def test_no_gradient_reaches_the_burn_in_steps():
    net = small_net()
    b, t, burn = 2, 7, 3
    obs = torch.randn(b, t, 3, requires_grad=True)
    state = tuple(torch.randn(b, 6, requires_grad=True) for _ in range(2))
    first = torch.zeros(b, t)
    first[:, 0] = 1.0
    q = unroll_with_burn_in(net, obs, state, first, burn)
    q[:, burn:].sum().backward()
    assert torch.all(obs.grad[:, :burn] == 0)  # the burn-in's inputs get nothing
    for part in state:  # nor the stored state
        assert part.grad is None or not torch.any(part.grad != 0)
    assert torch.any(obs.grad[:, burn:] != 0)  # the trained steps do
    # without burn-in the same loss reaches step 0: the test can fail
    obs.grad = None
    q = unroll_with_burn_in(net, obs, state, first, 0)
    q[:, burn:].sum().backward()
    assert torch.any(obs.grad[:, :burn] != 0)


def test_burn_in_changes_nothing_in_the_forward_values():
    net = small_net(1)
    obs, first = torch.randn(3, 9, 3), torch.zeros(3, 9)
    first[:, 0] = 1.0
    state = net.initial_state(3)
    with torch.no_grad():
        plain, _ = net.unroll(obs, state, first)
        burned = unroll_with_burn_in(net, obs, state, first, 4)
    assert torch.allclose(plain, burned, atol=1e-6)


def test_unroll_equals_stepping_and_puts_the_state_back_at_first():
    net = small_net(2)
    obs = torch.randn(2, 6, 3)
    stored = tuple(torch.randn(2, 6) for _ in range(2))
    first = torch.zeros(2, 6)
    first[0, 3] = 1.0  # item 0's episode begins at position 3 (front padding before)
    first[1, 0] = 1.0
    with torch.no_grad():
        q, _ = net.unroll(obs, stored, first)
        # item 0 by steps: from position 3 on, the stored state is back in place
        h = (stored[0][:1], stored[1][:1])
        for k in range(3, 6):
            qk, h = net.step(obs[:1, k], h)
            assert torch.allclose(q[0, k], qk[0], atol=1e-6)
        h = (stored[0][1:], stored[1][1:])
        for k in range(6):
            qk, h = net.step(obs[1:, k], h)
            assert torch.allclose(q[1, k], qk[0], atol=1e-6)


@pytest.mark.parametrize("dueling", [True, False])
def test_dueling_head_and_image_torso(dueling):
    o = R2D2Config(hiddens=(16,), lstm_size=8, dueling=dueling)
    net = RecurrentQNetwork(spaces.Box(0, 255, (10, 10, 4), np.uint8), spaces.Discrete(3), o)
    obs = torch.randint(0, 255, (2, 5, 10, 10, 4), dtype=torch.uint8)
    q, state = net.unroll(obs, net.initial_state(2))
    assert q.shape == (2, 5, 3) and state[0].shape == (2, 8)
    assert hasattr(net, "conv") and (hasattr(net, "advantage") == dueling)


@pytest.mark.parametrize(
    "shape, dtype, dueling",
    [((2,), np.float32, True), ((6,), np.float32, False), ((10, 10, 4), np.uint8, True)],
)
def test_network_size_is_the_built_networks_parameter_count(shape, dtype, dueling):
    from apex_dask.algo.agents.r2d2.builder import BUILDER

    o = R2D2Config(hiddens=(16, 8), lstm_size=12, dueling=dueling)
    obs = spaces.Box(0, 255 if dtype == np.uint8 else 1, shape, dtype)
    params, acts = BUILDER.network_size(o, obs, spaces.Discrete(3))
    net = RecurrentQNetwork(obs, spaces.Discrete(3), o)
    assert params == sum(p.numel() for p in net.parameters())
    assert acts > 0


@pytest.mark.parametrize("image", [False, True])
def test_the_fused_cell_step_equals_the_lstm_step(image):
    """The env workers' acting pass (``step_cell``) gives the Q-values and states of
    ``step`` (nn.LSTM) over many steps, within float rounding."""
    torch.manual_seed(0)
    o = R2D2Config(hiddens=(16,), lstm_size=8)
    if image:
        space = spaces.Box(0, 1, (10, 10, 4), bool)
        obs = torch.rand(20, 3, 10, 10, 4) < 0.2
    else:
        space = spaces.Box(-5.0, 5.0, (3,), np.float32)
        obs = torch.randn(20, 3, 3)
    net = RecurrentQNetwork(space, spaces.Discrete(4), o).eval().requires_grad_(False)
    a = b = net.initial_state(3)
    moved = 0.0
    with torch.inference_mode():
        for k in range(20):
            qa, a = net.step(obs[k], a)
            qb, b = net.step_cell(obs[k], b)
            torch.testing.assert_close(qb, qa, rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(b[0], a[0], rtol=1e-5, atol=1e-6)
            torch.testing.assert_close(b[1], a[1], rtol=1e-5, atol=1e-6)
            moved += float(a[1].abs().sum())
    assert moved > 0  # the state carries something
