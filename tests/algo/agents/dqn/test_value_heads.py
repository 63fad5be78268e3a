"""The value heads' maths against values computed by hand or with plain Python in the test:
C51's projection and loss, HL-Gauss's target and loss, and their numpy twins (the env
workers' priorities)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.heads import (
    bin_edges,
    c51_priorities_numpy,
    categorical_projection,
    categorical_projection_numpy,
    hl_gauss_target,
    support,
)
from apex_dask.algo.agents.dqn.loss import c51_loss, hl_gauss_loss

ATOMS3 = np.array([-1.0, 0.0, 1.0], np.float32)


def project_by_loops(probs, reward, discount, atoms):
    """C51's Algorithm 1, one atom at a time (plain Python)."""
    n = len(atoms)
    v_min, v_max = float(atoms[0]), float(atoms[-1])
    dz = (v_max - v_min) / (n - 1)
    out = []
    for p, r, d in zip(probs, reward, discount, strict=True):
        m = [0.0] * n
        for j in range(n):
            tz = min(max(float(r) + float(d) * float(atoms[j]), v_min), v_max)
            b = (tz - v_min) / dz
            lo, up = math.floor(b), math.ceil(b)
            if lo == up:
                m[lo] += float(p[j])
            else:
                m[lo] += float(p[j]) * (up - b)
                m[up] += float(p[j]) * (b - lo)
        out.append(m)
    return np.array(out)


def test_projection_of_three_cases_computed_by_hand():
    probs = np.array([[0.2, 0.5, 0.3]] * 3, np.float32)
    reward = np.array([0.5, 2.0, -0.25], np.float32)
    discount = np.array([0.5, 0.9, 0.0], np.float32)  # a split, a clip, a terminal
    want = np.array([[0.0, 0.45, 0.55], [0.0, 0.0, 1.0], [0.25, 0.75, 0.0]])
    t = categorical_projection(
        torch.from_numpy(probs),
        torch.from_numpy(reward),
        torch.from_numpy(discount),
        torch.from_numpy(ATOMS3),
    )
    np.testing.assert_allclose(t.numpy(), want, atol=1e-6)
    np.testing.assert_allclose(
        categorical_projection_numpy(probs, reward, discount, ATOMS3), want, atol=1e-6
    )


def test_projection_matches_the_loops_and_keeps_mass_on_51_atoms():
    rng = np.random.default_rng(0)
    atoms = support(DQNConfig(num_atoms=51))
    assert atoms.shape == (51,) and atoms[0] == -10 and atoms[-1] == 10
    probs = rng.dirichlet(np.ones(51), size=64).astype(np.float32)
    reward = rng.normal(0, 4, 64).astype(np.float32)
    discount = rng.choice([0.0, 0.97, 0.99**3], 64).astype(np.float32)
    want = project_by_loops(probs, reward, discount, atoms)
    got = categorical_projection(*map(torch.from_numpy, (probs, reward, discount, atoms)))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    np.testing.assert_allclose(
        categorical_projection_numpy(probs, reward, discount, atoms), want, atol=1e-5
    )
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-5)
    # inside the support the projection keeps the expected value
    inside = (np.abs(reward) + 10 * discount) < 10
    tz_mean = reward + discount * (probs * atoms).sum(1)
    np.testing.assert_allclose((want * atoms).sum(1)[inside], tz_mean[inside], atol=1e-4)


def _table_nets(rng, n_states, n_actions, k):
    """``logits`` callables over a table: obs are state indices."""
    online = torch.tensor(rng.normal(size=(n_states, n_actions, k)), dtype=torch.float32)
    target = torch.tensor(rng.normal(size=(n_states, n_actions, k)), dtype=torch.float32)
    online.requires_grad_(True)
    return online, target, (lambda obs: online[obs.long()]), (lambda obs: target[obs.long()])


def _log_softmax(x):
    x = np.asarray(x, np.float64)
    e = np.exp(x - x.max())
    return np.log(e / e.sum())


@pytest.mark.parametrize("double_q", [True, False])
def test_c51_loss_and_priorities_equal_a_computation_in_plain_numpy(double_q):
    rng = np.random.default_rng(1)
    atoms = support(DQNConfig(num_atoms=5, v_min=-2.0, v_max=2.0))
    on_t, tg_t, online, target = _table_nets(rng, 6, 3, 5)
    b = 8
    batch = {
        "obs": torch.tensor(rng.integers(0, 6, b)),
        "next_obs": torch.tensor(rng.integers(0, 6, b)),
        "action": torch.tensor(rng.integers(0, 3, b)),
        "reward": torch.tensor(rng.normal(0, 1, b), dtype=torch.float32),
        "discount": torch.tensor(rng.choice([0.0, 0.9], b), dtype=torch.float32),
    }
    w = torch.tensor(rng.uniform(0.2, 1.0, b), dtype=torch.float32)
    out = c51_loss(online, target, batch, w, torch.from_numpy(atoms), double_q=double_q)
    on, tg = on_t.detach().numpy(), tg_t.numpy()
    ces, qs = [], []
    for i in range(b):
        s, a, s2 = int(batch["obs"][i]), int(batch["action"][i]), int(batch["next_obs"][i])
        chooser = on if double_q else tg
        q_next = [np.exp(_log_softmax(chooser[s2, c])) @ atoms for c in range(3)]
        p_next = np.exp(_log_softmax(tg[s2, int(np.argmax(q_next))]))
        r, d = float(batch["reward"][i]), float(batch["discount"][i])
        m = project_by_loops([p_next], [r], [d], atoms)[0]
        logp = _log_softmax(on[s, a])
        ces.append(-(m * logp).sum())
        qs.append(np.exp(logp) @ atoms)
    np.testing.assert_allclose(out.td_abs.numpy(), ces, rtol=1e-5, atol=1e-6)
    assert float(out.loss.detach()) == pytest.approx(float(np.mean(w.numpy() * ces)), rel=1e-5)
    assert float(out.mean_q) == pytest.approx(float(np.mean(qs)), rel=1e-5, abs=1e-6)
    out.loss.backward()  # the gradient reaches the online table only through (s, a)
    assert on_t.grad is not None and float(on_t.grad.abs().sum()) > 0


def test_c51_worker_priorities_equal_the_loss_with_one_set_of_weights():
    rng = np.random.default_rng(2)
    atoms = support(DQNConfig(num_atoms=7, v_min=-3.0, v_max=3.0))
    on_t, _, online, _ = _table_nets(rng, 5, 4, 7)
    b = 16
    batch = {
        "obs": torch.tensor(rng.integers(0, 5, b)),
        "next_obs": torch.tensor(rng.integers(0, 5, b)),
        "action": torch.tensor(rng.integers(0, 4, b)),
        "reward": torch.tensor(rng.normal(0, 1, b), dtype=torch.float32),
        "discount": torch.tensor(rng.choice([0.0, 0.97], b), dtype=torch.float32),
    }
    out = c51_loss(online, online, batch, torch.ones(b), torch.from_numpy(atoms))
    logp = torch.log_softmax(on_t.detach(), dim=2).numpy()
    taken = logp[batch["obs"].numpy(), batch["action"].numpy()]
    got = c51_priorities_numpy(
        taken,
        logp[batch["next_obs"].numpy()],
        batch["reward"].numpy(),
        batch["discount"].numpy(),
        atoms,
    )
    np.testing.assert_allclose(got, out.td_abs.numpy(), rtol=1e-5, atol=1e-6)


def hl_gauss_by_hand(y, edges, sigma):
    y = min(max(y, float(edges[0])), float(edges[-1]))
    cdf = [0.5 * (1 + math.erf((float(e) - y) / (math.sqrt(2) * sigma))) for e in edges]
    mass = cdf[-1] - cdf[0]
    return [(cdf[k + 1] - cdf[k]) / mass for k in range(len(edges) - 1)]


def test_hl_gauss_target_by_hand():
    o = DQNConfig(loss="hl_gauss", num_bins=2, v_min=-1.0, v_max=1.0)
    edges = bin_edges(o)
    np.testing.assert_array_equal(edges, [-1.0, 0.0, 1.0])
    np.testing.assert_array_equal(support(o), [-0.5, 0.5])
    sigma = 0.75 * 1.0  # the ratio times the bin width
    got = hl_gauss_target(torch.tensor([0.0, 0.5, 3.0]), torch.from_numpy(edges), sigma)
    np.testing.assert_allclose(got[0].numpy(), [0.5, 0.5], atol=1e-7)  # symmetric
    np.testing.assert_allclose(got[1].numpy(), hl_gauss_by_hand(0.5, edges, sigma), atol=1e-6)
    # y = 3 is clipped to v_max = 1: the Gaussian's mass inside [-1, 1] as for y = 1
    np.testing.assert_allclose(got[2].numpy(), hl_gauss_by_hand(1.0, edges, sigma), atol=1e-6)
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-6)


def test_hl_gauss_target_on_51_bins_centres_on_the_value():
    o = DQNConfig(loss="hl_gauss", num_bins=51)
    edges, centers = bin_edges(o), support(o)
    zeta = 20.0 / 51
    ys = np.array([-9.0, -2.5, 0.0, 0.3, 7.7], np.float32)
    got = hl_gauss_target(torch.from_numpy(ys), torch.from_numpy(edges), 0.75 * zeta).numpy()
    for row, y in zip(got, ys, strict=True):
        np.testing.assert_allclose(row, hl_gauss_by_hand(float(y), edges, 0.75 * zeta), atol=1e-5)
        assert row @ centers == pytest.approx(float(y), abs=0.01)  # far from the edges
        assert (row > 1e-3).sum() <= 8  # sigma 0.75 bin widths: a few bins carry the mass


@pytest.mark.parametrize("double_q", [True, False])
def test_hl_gauss_loss_and_priorities_equal_a_computation_in_plain_numpy(double_q):
    rng = np.random.default_rng(3)
    o = DQNConfig(loss="hl_gauss", num_bins=9, v_min=-3.0, v_max=3.0)
    edges, centers = bin_edges(o), support(o)
    sigma = 0.75 * 6.0 / 9
    on_t, tg_t, online, target = _table_nets(rng, 6, 3, 9)
    b = 8
    batch = {
        "obs": torch.tensor(rng.integers(0, 6, b)),
        "next_obs": torch.tensor(rng.integers(0, 6, b)),
        "action": torch.tensor(rng.integers(0, 3, b)),
        "reward": torch.tensor(rng.normal(0, 2, b), dtype=torch.float32),
        "discount": torch.tensor(rng.choice([0.0, 0.9], b), dtype=torch.float32),
    }
    w = torch.tensor(rng.uniform(0.2, 1.0, b), dtype=torch.float32)
    out = hl_gauss_loss(
        online,
        target,
        batch,
        w,
        torch.from_numpy(centers),
        torch.from_numpy(edges),
        sigma,
        double_q=double_q,
    )
    on, tg = on_t.detach().numpy(), tg_t.numpy()

    def q(table, s):
        return [np.exp(_log_softmax(table[s, c])) @ centers for c in range(3)]

    ces, tds = [], []
    for i in range(b):
        s, a, s2 = int(batch["obs"][i]), int(batch["action"][i]), int(batch["next_obs"][i])
        best = int(np.argmax(q(on if double_q else tg, s2)))
        y = float(batch["reward"][i]) + float(batch["discount"][i]) * q(tg, s2)[best]
        logp = _log_softmax(on[s, a])
        ces.append(-(np.array(hl_gauss_by_hand(y, edges, sigma)) * logp).sum())
        tds.append(abs(np.exp(logp) @ centers - y))
    np.testing.assert_allclose(out.td_abs.numpy(), tds, rtol=1e-5, atol=1e-5)
    assert float(out.loss.detach()) == pytest.approx(float(np.mean(w.numpy() * ces)), rel=1e-5)


def test_projection_on_the_atoms_and_at_the_bounds_matches_the_loops():
    """Targets that land exactly on atoms (all mass to one atom), on v_min / v_max and
    beyond them (clipped), and terminal items: the scatter against Algorithm 1."""
    atoms = support(DQNConfig(num_atoms=51))  # dz = 0.4
    rng = np.random.default_rng(5)
    probs = rng.dirichlet(np.ones(51), size=10).astype(np.float32)
    reward = np.array([0.0, 0.4, -0.8, 10.0, -10.0, 25.0, -25.0, 3.0, 9.8, -9.9], np.float32)
    discount = np.array([1.0, 1.0, 1.0, 0.0, 0.0, 1.0, 1.0, 0.0, 0.0, 0.0], np.float32)
    want = project_by_loops(probs, reward, discount, atoms)
    got = categorical_projection(*map(torch.from_numpy, (probs, reward, discount, atoms)))
    np.testing.assert_allclose(got.numpy(), want, atol=1e-5)
    np.testing.assert_allclose(got.sum(1).numpy(), 1.0, atol=1e-5)
    assert got[3, 50] == pytest.approx(1.0) and got[4, 0] == pytest.approx(1.0)
    near = {"abs": 1e-5}
    assert got[8, 49] == pytest.approx(0.5, **near) and got[8, 50] == pytest.approx(0.5, **near)
    assert got[9, 0] == pytest.approx(0.75, **near) and got[9, 1] == pytest.approx(0.25, **near)
    assert got[0].numpy() == pytest.approx(probs[0], abs=1e-6)  # R = 0, discount 1: itself


def _reference_loss(head, online_t, target_t, next_t, batch, w, values, edges=None, sigma=0.0):
    """The distributional losses written out plainly: log-softmax of every action's
    logits, exp for probabilities, the projection one atom at a time."""
    logp = torch.log_softmax(online_t[batch["obs"].long()], dim=2)
    rows = torch.arange(len(batch["action"]))
    logp_taken = logp[rows, batch["action"].long()]
    with torch.no_grad():
        logp_next = torch.log_softmax(target_t[batch["next_obs"].long()], dim=2)
        chooser = torch.log_softmax(next_t[batch["next_obs"].long()], dim=2)
        best = (chooser.exp() * values).sum(-1).argmax(1)
        p_next = logp_next[rows, best].exp()
        if head == "c51":
            m = torch.tensor(
                project_by_loops(
                    p_next.numpy(), batch["reward"].numpy(), batch["discount"].numpy(),
                    values.numpy(),
                ),
                dtype=torch.float32,
            )  # fmt: skip
        else:
            y = batch["reward"] + batch["discount"] * (p_next * values).sum(-1)
            m = hl_gauss_target(y, edges, sigma)
    ce = -(m * logp_taken).sum(1)
    q_taken = (logp_taken.detach().exp() * values).sum(-1)
    td = ce.detach() if head == "c51" else (q_taken - y).abs()
    return (w * ce).mean(), td, q_taken.mean()


@pytest.mark.parametrize("head", ["c51", "hl_gauss"])
def test_the_losses_and_their_gradients_equal_the_plain_reference(head):
    """On random inputs (51 atoms / bins, 4 actions, a separate chooser at s'), the loss,
    the priorities, mean Q and the gradient of the online logits equal the reference."""
    rng = np.random.default_rng(7)
    k, n_actions, n_states, b = 51, 4, 40, 64
    o = DQNConfig(num_atoms=k) if head == "c51" else DQNConfig(loss="hl_gauss", num_bins=k)
    values = torch.from_numpy(support(o))
    edges = torch.from_numpy(bin_edges(o))
    sigma = o.hl_gauss_sigma_ratio * (o.v_max - o.v_min) / o.num_bins
    tables = [
        torch.tensor(rng.normal(0, 2, (n_states, n_actions, k)), dtype=torch.float32)
        for _ in range(3)
    ]
    batch = {
        "obs": torch.tensor(rng.integers(0, n_states, b)),
        "next_obs": torch.tensor(rng.integers(0, n_states, b)),
        "action": torch.tensor(rng.integers(0, n_actions, b)),
        "reward": torch.tensor(rng.normal(0, 4, b), dtype=torch.float32),
        "discount": torch.tensor(rng.choice([0.0, 0.97], b), dtype=torch.float32),
    }
    w = torch.tensor(rng.uniform(0.2, 1.0, b), dtype=torch.float32)
    grads = []
    for fn in ("new", "reference"):
        on = tables[0].clone().requires_grad_(True)
        tg, nx = tables[1], tables[2]
        if fn == "reference":
            loss, td, mean_q = _reference_loss(head, on, tg, nx, batch, w, values, edges, sigma)
        else:
            nets = (lambda x, t=on: t[x.long()], lambda x, t=tg: t[x.long()])
            kwargs = {"online_next": lambda x, t=nx: t[x.long()], "bounds": (o.v_min, o.v_max)}
            if head == "c51":
                out = c51_loss(*nets, batch, w, values, **kwargs)
            else:
                out = hl_gauss_loss(*nets, batch, w, values, edges, sigma, **kwargs)
            loss, td, mean_q = out.loss, out.td_abs, out.mean_q
            got = (float(loss.detach()), td.numpy().copy(), float(mean_q))
        loss.backward()
        grads.append(on.grad.clone())
    want = (float(loss.detach()), td.numpy(), float(mean_q))
    assert got[0] == pytest.approx(want[0], rel=1e-5)
    np.testing.assert_allclose(got[1], want[1], rtol=1e-4, atol=1e-5)
    assert got[2] == pytest.approx(want[2], rel=1e-5, abs=1e-6)
    torch.testing.assert_close(grads[0], grads[1], rtol=1e-4, atol=1e-7)
    assert float(grads[0].abs().sum()) > 0
