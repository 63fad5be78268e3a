"""Noisy nets at the env's speed: the factorised pass, weights formed once per noise
sample, one noise sample per rollout fragment, and NoisyNet's three samples per update."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from agent_parts import configs
from gymnasium import spaces

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.algo.agents.dqn.loss import dqn_loss
from apex_dask.algo.agents.dqn.networks import NumpyMLPQ, q_network
from apex_dask.algo.agents.dqn.numpy_net import _Linear
from apex_dask.algo.agents.dqn.worker import EnvWorker
from apex_dask.algo.agents.noisy import (
    NoisyLinear,
    draw_noise,
    noise_numpy,
    noise_twin,
    noisy_layers,
)
from apex_dask.algo.envs.factory import make_env_factory
from apex_dask.algo.rollout.spec import RolloutSpec

VEC = spaces.Box(-5.0, 5.0, (6,), np.float32)


def test_the_factorised_pass_equals_the_explicit_noisy_weights():
    rng = np.random.default_rng(0)
    w = {
        "l.weight_mu": rng.normal(size=(5, 7)),
        "l.weight_sigma": rng.uniform(0.1, 1.0, size=(5, 7)),
        "l.bias_mu": rng.normal(size=5),
        "l.bias_sigma": rng.uniform(0.1, 1.0, size=5),
    }
    layer = _Linear(w, "l")
    x = rng.normal(size=(11, 7)).astype(np.float32)
    (f_in, f_out) = noise_numpy(rng, [(7, 5)])[0]
    weight = w["l.weight_mu"] + w["l.weight_sigma"] * np.outer(f_out, f_in)
    bias = w["l.bias_mu"] + w["l.bias_sigma"] * f_out
    explicit = x.astype(np.float64) @ weight.T + bias
    np.testing.assert_allclose(layer(x, (f_in, f_out)), explicit, rtol=1e-5, atol=1e-5)
    assert not np.allclose(layer(x, None), explicit, atol=1e-2)  # the noise matters


@pytest.mark.parametrize(
    "options",
    [
        DQNConfig(hiddens=(16, 8), noisy=True),
        DQNConfig(hiddens=(16,), noisy=True, num_atoms=11, layer_norm=True),
        DQNConfig(hiddens=(16,), noisy=True, loss="hl_gauss", num_bins=7, dueling=False),
    ],
)
def test_a_noised_numpy_net_equals_the_noisy_passes_and_torch(options):
    torch.manual_seed(2)
    net = q_network(VEC, spaces.Discrete(4), options)
    np_net = NumpyMLPQ(module_weights(net), options)
    noise = noise_numpy(np.random.default_rng(3), np_net.noise_shapes)
    fixed = np_net.noised(noise)
    assert fixed.noise_shapes == [] and np_net.noise_shapes
    x = np.random.default_rng(4).normal(size=(9, 6)).astype(np.float32)
    np.testing.assert_allclose(fixed.outputs(x), np_net.outputs(x, noise), rtol=1e-5, atol=1e-5)
    for layer, (f_in, f_out) in zip(noisy_layers(net), noise, strict=True):
        layer.set_noise(torch.from_numpy(f_in), torch.from_numpy(f_out))
    net.train()
    with torch.no_grad():
        want = net(torch.from_numpy(x)).numpy()
    np.testing.assert_allclose(fixed.q_values(x), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="noisy layers"):
        np_net.noised(noise[:-1])


def _explicit(layer: NoisyLinear, x: torch.Tensor) -> torch.Tensor:
    w = layer.weight_mu + layer.weight_sigma * torch.outer(layer.noise_out, layer.noise_in)
    return x @ w.T + layer.bias_mu + layer.bias_sigma * layer.noise_out


def test_a_kept_noisy_weight_follows_every_change_of_noise_and_parameters():
    torch.manual_seed(0)
    layer = NoisyLinear(6, 4)
    gen = torch.Generator().manual_seed(1)
    draw_noise(layer, gen)
    x = torch.randn(3, 6)
    with torch.no_grad():
        first = layer(x)
        torch.testing.assert_close(first, _explicit(layer, x))
        assert layer._formed is not None
        draw_noise(layer, gen)  # new noise
        torch.testing.assert_close(layer(x), _explicit(layer, x))
        layer.weight_sigma.mul_(3.0)  # an optimizer step changes a parameter in place
        torch.testing.assert_close(layer(x), _explicit(layer, x))
        layer.bias_mu.add_(1.0)
        torch.testing.assert_close(layer(x), _explicit(layer, x))
    state = {k: v + 0.5 for k, v in layer.state_dict().items()}
    layer.load_state_dict(state)
    with torch.inference_mode():
        torch.testing.assert_close(layer(x), _explicit(layer, x))
    # with gradients on, nothing is kept and the gradient reaches the scales
    out = layer(x).sum()
    out.backward()
    assert layer.weight_sigma.grad is not None and layer.weight_sigma.grad.abs().sum() > 0


class _Recording(EnvWorker):
    """An env worker that checks each noisy acting pass against the numpy net under the
    noise it says it acts with, and counts the noise draws."""

    draws = 0
    checked = 0

    def _draw_noise(self):
        self.draws += 1
        return super()._draw_noise()

    def values(self, obs, noise=False):
        q, kept = super().values(obs, noise)
        if noise and not self._noise_per_pass:
            want, _ = self._numpy_net.values(obs, self._fragment_noise)
            np.testing.assert_allclose(q, want, rtol=1e-5, atol=1e-5)
            self.checked += 1
        return q, kept


def _worker(mode: str, cls=EnvWorker, seed=0):
    cfg = DQNConfig(hiddens=(16,), noisy=True, acting_noise=mode)
    rollout = RolloutSpec(fragment_length=10, num_envs=3, n_step=2, gamma=0.9)
    return cls(make_env_factory("CartPole-v1"), epsilon=0.0, seed=seed, rollout=rollout, config=cfg)


def test_fragment_noise_is_drawn_once_per_fragment_and_used_by_every_pass():
    worker = _worker("fragment", _Recording)
    teacher = _worker("fragment", seed=5)  # other weights, to sync mid-run
    try:
        worker.sample()
        before = worker.draws
        for i in range(4):
            noise = worker._fragment_noise
            worker.sample()
            assert worker.draws == before + i + 1  # one new draw per fragment
            assert worker._fragment_noise is not noise
            for (f_in, f_out), (g_in, g_out) in zip(noise, worker._fragment_noise, strict=True):
                assert not np.allclose(f_in, g_in) and not np.allclose(f_out, g_out)
            if i == 1:
                worker.set_weights(7, module_weights(teacher._net))
        assert worker.checked >= 4 * 10
    finally:
        worker.close()
        teacher.close()


def test_pass_noise_is_drawn_for_every_acting_pass():
    worker = _worker("pass", _Recording)
    try:
        worker.sample()
        before = worker.draws
        worker.sample()
        assert worker.draws - before >= 10  # one per vector step, and the fragment's end
    finally:
        worker.close()


def _batch(rng, n=64):
    return {
        "obs": rng.normal(size=(n, 6)).astype(np.float32),
        "action": rng.integers(0, 4, size=n),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 6)).astype(np.float32),
        "done": np.zeros(n, bool),
        "discount": np.full(n, 0.9, np.float32),
    }


def test_a_noise_twin_shares_parameters_but_not_noise():
    torch.manual_seed(0)
    net = q_network(VEC, spaces.Discrete(4), DQNConfig(hiddens=(16,), noisy=True))
    twin = noise_twin(net)
    for (name, p), (_, q) in zip(net.named_parameters(), twin.named_parameters(), strict=True):
        assert p is q, name
    gen = torch.Generator().manual_seed(0)
    draw_noise(net, gen)
    draw_noise(twin, gen)
    for a, b in zip(noisy_layers(net), noisy_layers(twin), strict=True):
        assert not torch.equal(a.noise_in, b.noise_in)
    net.eval(), twin.eval()
    x = torch.randn(5, 6)
    with torch.no_grad():
        next(net.parameters()).add_(1.0)
        torch.testing.assert_close(net(x), twin(x))


def test_the_learner_uses_three_independent_noise_samples():
    """The update's priorities equal the loss with separate noise for Q(s, a), the argmax
    at s' and the target, and differ from one shared sample for the online net."""
    rng = np.random.default_rng(0)
    data = _batch(rng)
    w = np.ones(64, np.float32)
    learner = Learner(VEC, spaces.Discrete(4), *configs("dqn", hiddens=(32,), noisy=True))
    learner.update(data, w)  # online and target differ from here on
    online = copy.deepcopy(learner.online)
    target = copy.deepcopy(learner.target)
    twin = noise_twin(online)
    gen = torch.Generator()
    gen.set_state(learner._noise.get_state())
    td, _ = learner.update(data, w)
    for net in (online, twin, target):  # the learner's draw order
        draw_noise(net, gen)
    for a, b in zip(noisy_layers(learner.online), noisy_layers(online), strict=True):
        torch.testing.assert_close(a.noise_in, b.noise_in)
    for a, b in zip(noisy_layers(learner.online_next), noisy_layers(twin), strict=True):
        torch.testing.assert_close(a.noise_out, b.noise_out)
    batch = {k: torch.as_tensor(v) for k, v in data.items()}
    weights = torch.as_tensor(w)
    three = dqn_loss(online, target, batch, weights, online_next=twin).td_abs.numpy()
    two = dqn_loss(online, target, batch, weights).td_abs.numpy()
    np.testing.assert_allclose(td, three, rtol=1e-5, atol=1e-5)
    assert not np.allclose(td, two, atol=1e-5)
