import pickle

import numpy as np
import pytest
import torch
from agent_parts import configs
from gymnasium import spaces

from apex_dask.algo.agents.dqn.learner import Learner

OBS = spaces.Box(-5.0, 5.0, (4,), np.float32)
ACT = spaces.Discrete(2)


def _batch(rng, n=32):
    return {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=n),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "done": np.zeros(n, bool),
        "discount": np.full(n, 0.97, np.float32),
    }


def _learner(**kw):
    seed = kw.pop("seed", 0)
    kw = {"hiddens": (32,), "lr": 1e-2, **kw}
    return Learner(OBS, ACT, *configs("dqn", **kw), seed=seed)


def test_learner_overfits_fixed_batch_so_td_errors_fall():
    rng = np.random.default_rng(0)
    data = _batch(rng, 64)
    weights = np.ones(64, np.float32)
    learner = _learner(target_update_freq=10**9)
    first, metrics = learner.update(data, weights)
    for _ in range(300):
        td, metrics = learner.update(data, weights)
    assert td.dtype == np.float32 and td.shape == (64,)
    assert td.mean() < 0.1 * first.mean()
    assert set(metrics) == {"loss", "mean_q", "grad_norm"}
    assert all(np.isfinite(v) for v in metrics.values())


def test_counters_count_transitions_and_target_copies():
    rng = np.random.default_rng(1)
    learner = _learner(target_update_freq=64)
    data = _batch(rng, 32)
    w = np.ones(32, np.float32)
    learner.update(data, w)
    assert learner.steps_trained == 32 and learner.num_updates == 1
    assert learner.num_target_updates == 0
    # target still the initial copy, online has moved
    assert not torch.equal(learner.target.head.value.weight, learner.online.head.value.weight)
    learner.update(data, w)
    assert learner.steps_trained == 64 and learner.num_target_updates == 1
    for name, p in learner.online.state_dict().items():
        torch.testing.assert_close(learner.target.state_dict()[name], p)
    for _ in range(3):
        learner.update(data, w)
    assert learner.num_target_updates == 2  # at 64 and 128 of 160 transitions


def test_target_stays_fixed_between_copies():
    rng = np.random.default_rng(2)
    learner = _learner(target_update_freq=10**9)
    before = {k: v.clone() for k, v in learner.target.state_dict().items()}
    for _ in range(5):
        learner.update(_batch(rng), np.ones(32, np.float32))
    for k, v in learner.target.state_dict().items():
        torch.testing.assert_close(v, before[k])


def test_get_weights_is_cached_per_version_and_bumps_on_update():
    rng = np.random.default_rng(3)
    learner = _learner()
    v0, w0 = learner.get_weights()
    assert v0 == 0 and learner.version == 0
    assert learner.get_weights()[1] is w0
    assert type(w0) is dict and all(isinstance(a, np.ndarray) for a in w0.values())
    snapshot = {k: a.copy() for k, a in w0.items()}
    learner.update(_batch(rng), np.ones(32, np.float32))
    v1, w1 = learner.get_weights()
    assert v1 == 1 and w1 is not w0
    # the cached copy of version 0 was not changed by the update in place
    for k, a in w0.items():
        np.testing.assert_array_equal(a, snapshot[k])
    assert any(not np.array_equal(w1[k], w0[k]) for k in w0)


def test_same_seed_gives_same_initial_weights():
    a, b, c = _learner(seed=5), _learner(seed=5), _learner(seed=6)
    wa, wb, wc = a.get_weights()[1], b.get_weights()[1], c.get_weights()[1]
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert not all(np.array_equal(wa[k], wc[k]) for k in wa)


def test_state_round_trip_continues_identically():
    rng = np.random.default_rng(4)
    batches = [_batch(rng) for _ in range(6)]
    w = rng.uniform(0.2, 1.0, size=32).astype(np.float32)
    a = _learner(target_update_freq=96)
    for data in batches[:3]:
        a.update(data, w)
    state = pickle.loads(pickle.dumps(a.state_dict()))
    assert type(state) is dict
    b = _learner(seed=99, target_update_freq=96)
    b.load_state_dict(state)
    assert b.counters() == a.counters()
    for data in batches[3:]:
        td_a, m_a = a.update(data, w)
        td_b, m_b = b.update(data, w)
        np.testing.assert_array_equal(td_a, td_b)
        assert m_a == m_b
    assert a.num_target_updates == b.num_target_updates == 2
    wa, wb = a.get_weights(), b.get_weights()
    assert wa[0] == wb[0] == 6
    for k in wa[1]:
        np.testing.assert_array_equal(wa[1][k], wb[1][k])


def test_grad_clip_bounds_the_gradient_norm():
    rng = np.random.default_rng(5)
    learner = _learner(grad_clip=1e-3)
    _, metrics = learner.update(_batch(rng), np.ones(32, np.float32))
    assert metrics["grad_norm"] > 1e-2  # reported before clipping
    clipped = torch.sqrt(sum((p.grad**2).sum() for p in learner.online.parameters()))
    assert clipped.item() == pytest.approx(1e-3, rel=1e-3)


def test_learner_trains_on_uint8_frames():
    space = spaces.Box(0, 255, (10, 10, 3), np.uint8)
    learner = Learner(space, spaces.Discrete(4), *configs("dqn", hiddens=(32,)), seed=0)
    rng = np.random.default_rng(6)
    data = {
        "obs": rng.integers(0, 256, (8, 10, 10, 3), dtype=np.uint8),
        "action": rng.integers(0, 4, 8),
        "reward": np.ones(8, np.float32),
        "next_obs": rng.integers(0, 256, (8, 10, 10, 3), dtype=np.uint8),
        "discount": np.zeros(8, np.float32),
    }
    td, _ = learner.update(data, np.ones(8, np.float32))
    assert td.shape == (8,)


def test_device_auto_resolves_and_num_threads_applies():
    before = torch.get_num_threads()
    try:
        learner = Learner(OBS, ACT, *configs("dqn", hiddens=(8,), device="auto", num_threads=1))
        assert torch.get_num_threads() == 1
        assert learner.device == ("cuda" if torch.cuda.is_available() else "cpu")
    finally:
        torch.set_num_threads(before)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_learner_matches_cpu_learner():
    rng = np.random.default_rng(7)
    data, w = _batch(rng), np.ones(32, np.float32)
    cpu, gpu = _learner(), _learner(device="cuda")
    td_c, _ = cpu.update(data, w)
    td_g, _ = gpu.update(data, w)
    np.testing.assert_allclose(td_c, td_g, rtol=1e-4, atol=1e-5)
    state = gpu.state_dict()
    assert all(isinstance(a, np.ndarray) for a in state["online"].values())
    cpu2 = _learner()
    cpu2.load_state_dict(state)
    assert cpu2.version == 1
