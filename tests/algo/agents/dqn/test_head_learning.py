"""The learner with every value head, torso and encoder: a checkpoint round trip (npz files
on disk) gives a bit-identical next update, the pipelined batch path (the GPU's, run
on CPU) gives the plain path's results one update later, and each head learns."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_parts import configs
from gymnasium import spaces

from apex_dask.algo.agents.dqn.learner import Learner
from apex_dask.experiment.checkpoints.store import load_checkpoint, save_checkpoint

VEC = spaces.Box(-5.0, 5.0, (4,), np.float32)
GRID = spaces.Box(0, 255, (10, 10, 3), np.uint8)
ACT = spaces.Discrete(3)
HEADS = {
    "scalar": (VEC, {}),
    "c51": (VEC, {"num_atoms": 51}),
    "hl_gauss": (VEC, {"loss": "hl_gauss", "num_bins": 31}),
    "c51_noisy": (VEC, {"num_atoms": 51, "noisy": True}),
    "noisy_layer_norm": (VEC, {"noisy": True, "layer_norm": True}),
    "impala_hl_gauss_ln": (GRID, {"encoder": "impala", "loss": "hl_gauss", "layer_norm": True}),
    "conv_c51_noisy": (GRID, {"num_atoms": 11, "noisy": True}),
}


@pytest.fixture(autouse=True)
def _flush_denormals():
    """As the learner thread does (denormals in Adam's state are slow on x86)."""
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


def batch(space: spaces.Box, rng: np.random.Generator, n: int = 16) -> dict[str, np.ndarray]:
    def obs() -> np.ndarray:
        if space.dtype == np.uint8:
            return rng.integers(0, 256, (n, *space.shape), dtype=np.uint8)
        return rng.normal(size=(n, *space.shape)).astype(np.float32)

    return {
        "obs": obs(),
        "next_obs": obs(),
        "action": rng.integers(0, ACT.n, n),
        "reward": rng.normal(0, 2, n).astype(np.float32),
        "discount": rng.choice([0.0, 0.97], n).astype(np.float32),
    }


def learner(head: str, seed: int = 0, **kw) -> Learner:
    space, extra = HEADS[head]
    keys = {"hiddens": (32,), "lr": 1e-2, "target_update_freq": 32, **extra, **kw}
    return Learner(space, ACT, *configs("dqn", **keys), seed=seed)


def weights(lr: Learner) -> dict[str, np.ndarray]:
    return lr.get_weights()[1]


@pytest.mark.parametrize("head", list(HEADS))
def test_a_checkpoint_round_trip_gives_a_bit_identical_next_update(head, tmp_path):
    space = HEADS[head][0]
    rng = np.random.default_rng(0)
    batches = [batch(space, rng) for _ in range(5)]
    w = rng.uniform(0.3, 1.0, 16).astype(np.float32)
    a = learner(head)
    for data in batches[:3]:
        a.update(data, w)
    path = save_checkpoint(tmp_path / "ckpt", {"learner": a.state_dict()})
    b = learner(head, seed=9)  # other initial weights and noise: all must come from the file
    b.load_state_dict(load_checkpoint(path)[0]["learner"])
    assert b.counters() == a.counters()
    for data in batches[3:]:  # a target copy after the first (every 32 transitions)
        td_a, m_a = a.update(data, w)
        td_b, m_b = b.update(data, w)
        np.testing.assert_array_equal(td_a, td_b)
        assert m_a == m_b
    wa, wb = weights(a), weights(b)
    assert all(np.array_equal(wa[k], wb[k]) for k in wa)
    assert a.num_target_updates == b.num_target_updates == 2


def test_without_its_noise_state_a_noisy_learner_would_make_another_update(tmp_path):
    rng = np.random.default_rng(1)
    data, w = batch(VEC, rng), np.ones(16, np.float32)
    a = learner("c51_noisy")
    a.update(data, w)
    state = a.state_dict()
    assert state["noise_rng"].dtype == np.uint8
    del state["noise_rng"]  # a checkpoint of a learner without noise, say
    b = learner("c51_noisy", seed=9)
    b.load_state_dict(state)
    assert not np.array_equal(a.update(data, w)[0], b.update(data, w)[0])


@pytest.mark.parametrize("head", ["c51", "hl_gauss", "c51_noisy", "impala_hl_gauss_ln"])
def test_pipelined_updates_match_plain_updates_for_each_head(head):
    space = HEADS[head][0]
    rng = np.random.default_rng(2)
    batches = [batch(space, rng) for _ in range(3)]
    w = np.ones(16, np.float32)
    plain, piped = learner(head, pipeline=False), learner(head, pipeline=True)
    expected = [plain.update(d, w) for d, w in ((d, w) for d in batches)]
    got = []
    for i, d in enumerate(batches):
        done = piped.submit(d, w, tag=i)
        assert [r.tag for r in done] == ([] if i == 0 else [i - 1])  # one update later
        got += done
    got += piped.drain()
    for (td, m), r in zip(expected, got, strict=True):
        np.testing.assert_allclose(r.td_abs, td, rtol=1e-4, atol=1e-5)
        assert r.loss == pytest.approx(m["loss"], rel=1e-4)


@pytest.mark.parametrize("head", ["c51", "hl_gauss", "c51_noisy", "conv_c51_noisy"])
def test_each_head_fits_a_fixed_batch(head):
    space = HEADS[head][0]
    rng = np.random.default_rng(3)
    data = batch(space, rng, 32)
    data["discount"][:] = 0.0  # fixed targets: the rewards
    w = np.ones(32, np.float32)
    lr = learner(head)
    first = [lr.update(data, w)[1]["loss"] for _ in range(3)]
    for _ in range(40):
        last = lr.update(data, w)[1]
    assert last["loss"] < 0.7 * np.mean(first)
    mean_q = float(np.mean(data["reward"]))  # Q(s, a) -> R on this batch
    assert abs(last["mean_q"] - mean_q) < 0.5


def test_bf16_autocast_and_channels_last_with_c51_on_cpu():
    lr = learner("conv_c51_noisy", amp="bf16", memory_format="channels_last")
    rng = np.random.default_rng(4)
    td, m = lr.update(batch(GRID, rng), np.ones(16, np.float32))
    assert np.all(np.isfinite(td)) and np.isfinite(m["loss"])
    assert torch.isfinite(
        torch.stack([p.detach().float().sum() for p in lr.online.parameters()])
    ).all()
