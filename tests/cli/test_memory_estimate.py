"""The pre-start memory estimate (``apex_dask/cli/memory.py``): every large part, on the
worker that holds it, refused in one line naming the biggest part and its key."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from apex_dask.algo.agents.dpg.builder import BUILDER as DPG
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dqn.builder import BUILDER as DQN
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.cli.checks import EnvSpaces, UsageError
from apex_dask.cli.memory import check_memory, plan_holdings
from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.placement import WorkerInfo, plan_placement

GIB = 2**30
CARTPOLE = EnvSpaces(spaces.Box(-1, 1, (4,), np.float32), spaces.Discrete(2))
ATARI = EnvSpaces(spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6))


@pytest.mark.parametrize(
    ("shape", "hiddens", "dueling"),
    [((4,), (256,), True), ((4, 84, 84), (512,), True), ((84, 84, 4), (64,), False),
     ((10, 10, 4), (128,), True), ((10, 10), (32,), False)],
)  # fmt: skip
def test_network_size_is_the_built_networks_parameter_count(shape, hiddens, dueling):
    obs = spaces.Box(0, 255, shape, np.uint8)
    options = DQNConfig(hiddens=hiddens, dueling=dueling)
    net = DQN.make_network(options, obs, spaces.Discrete(5))
    params, acts = DQN.network_size(options, obs, spaces.Discrete(5))
    assert params == sum(p.numel() for p in net.parameters())
    assert acts >= sum(hiddens) + 5  # every layer's outputs, the head's at least


@pytest.mark.parametrize(
    "shape", [(4,), (10, 10, 4), (4, 84, 84), (12, 12)], ids=["vector", "minatar", "atari", "gray"]
)
@pytest.mark.parametrize(
    "extra",
    [
        {"num_atoms": 51},
        {"noisy": True},
        {"loss": "hl_gauss", "num_bins": 31, "dueling": False},
        {"layer_norm": True},
        {"encoder": "impala", "impala_scale": 2, "layer_norm": True},
        {"encoder": "impala", "num_atoms": 11, "noisy": True, "hiddens": (64, 32)},
    ],
    ids=["c51", "noisy", "hl_gauss", "layer_norm", "impala_ln", "impala_c51_noisy"],
)
def test_network_size_counts_every_head_torso_and_encoder(shape, extra):
    obs = spaces.Box(0, 255, shape, np.uint8)
    if extra.get("encoder") == "impala" and len(shape) == 1:
        pytest.skip("the IMPALA encoder takes images (refused for vectors before start)")
    options = DQNConfig(**{"hiddens": (48,), **extra})
    net = DQN.make_network(options, obs, spaces.Discrete(5))
    params, acts = DQN.network_size(options, obs, spaces.Discrete(5))
    assert params == sum(p.numel() for p in net.parameters())
    assert acts >= sum(options.hiddens) + 5 * options.num_outputs


def test_activations_are_the_outputs_of_each_weighted_layer_by_hand():
    vec = spaces.Box(-1, 1, (4,), np.float32)
    options = DQNConfig(hiddens=(16, 8), dueling=True)
    assert DQN.network_size(options, vec, spaces.Discrete(3))[1] == 16 + 8 + 1 + 3
    image = spaces.Box(0, 255, (4, 84, 84), np.uint8)  # Nature CNN: 20x20x32, 9x9x64, 7x7x64
    convs = 32 * 20 * 20 + 64 * 9 * 9 + 64 * 7 * 7
    assert DQN.network_size(DQNConfig(hiddens=(512,)), image, spaces.Discrete(6))[1] == (
        convs + 512 + 1 + 6
    )
    minatar = spaces.Box(0, 1, (10, 10, 4), np.uint8)  # IMPALA: 10x10 -> 5x5 -> 3x3 -> 2x2
    stages = (16 * 100 + 4 * 16 * 25) + (32 * 25 + 4 * 32 * 9) + (32 * 9 + 4 * 32 * 4)
    impala = DQNConfig(hiddens=(64,), encoder="impala", num_atoms=51, layer_norm=True)
    norms = 16 * 25 + 32 * 9 + 32 * 4 + 64  # each stage's ChannelNorm, the hidden LayerNorm
    assert DQN.network_size(impala, minatar, spaces.Discrete(6))[1] == (
        stages + norms + 64 + 51 + 6 * 51
    )
    box = spaces.Box(-2, 2, (1,), np.float32)
    dpg = DPGConfig(actor_hiddens=(8,), critic_hiddens=(8,), twin_q=True)
    params, acts = DPG.network_size(dpg, spaces.Box(-1, 1, (3,), np.float32), box)
    assert acts == (8 + 1) + 2 * (8 + 1)  # the actor, then both critics
    model = DPG.make_network(dpg, spaces.Box(-1, 1, (3,), np.float32), box)
    assert params == sum(p.numel() for p in model.parameters())


def _plan(cfg: ApexConfig, n: int = 3):
    workers = [WorkerInfo(f"w{i}", str(i), "h") for i in range(n)]
    placement = plan_placement(
        workers,
        num_shards=cfg.replay.num_shards,
        num_env_workers=cfg.workers.num_workers,
        replay_placement=cfg.replay.placement,
    )
    return placement, plan_holdings(cfg, ATARI, placement)


def test_every_large_part_is_counted_on_the_worker_that_holds_it():
    cfg = ApexConfig.preset("atari")
    placement, held = _plan(cfg)
    learner = placement.learner.address
    keys = {p.key for p in held[learner]}
    assert {"replay.capacity", "networks", "learner.batch_size"} <= keys
    others = [a for a in held if a != learner]
    assert others and all({p.key for p in held[a]} == {"workers.num_workers"} for a in others)
    replay = sum(p.nbytes for p in held[learner] if p.key == "replay.capacity")
    assert 12 * GIB < replay < 20 * GIB  # 2M items, 84x84 uint8 frames stored ~1.2 x each
    spread = _plan(cfg.override({"replay.placement": "spread"}))[1]
    assert (
        max(sum(p.nbytes for p in v if p.key == "replay.capacity") for v in spread.values())
        < replay
    )


def _refusal(cfg: ApexConfig, limit: float) -> str:
    placement, held = _plan(cfg)
    with pytest.raises(UsageError) as info:
        check_memory(cfg, ATARI, held, {a: limit for a in held}, {})
    return str(info.value)


@pytest.mark.parametrize(
    ("overrides", "key", "what"),
    [
        ({}, "replay.capacity", "replay.capacity=2,000,000"),
        ({"replay.capacity": 40_000, "replay.learning_starts": 1000, "learner.batch_size": 10_000}, "learner.batch_size",
         "replayed batches"),
        ({"replay.capacity": 40_000, "replay.learning_starts": 1000, "workers.num_workers": 4000}, "workers.num_workers",
         "env worker(s)"),
    ],
)  # fmt: skip
def test_a_config_that_cannot_fit_names_the_biggest_part_its_estimate_and_its_key(
    overrides, key, what
):
    cfg = ApexConfig.preset("atari").override(overrides)
    msg = _refusal(cfg, 4 * GIB)
    assert "\n" not in msg and what in msg and "needs about" in msg
    assert f"lower it, e.g. --set {key}=" in msg and "which has 4.0 GiB" in msg
    advice = dict([msg.rsplit("--set ", 1)[1].split("=")])  # the advice fits
    fixed = cfg.override({key: int(advice[key])})
    placement, held = _plan(fixed)
    check_memory(fixed, ATARI, held, {a: 4 * GIB for a in held}, {})


def test_nothing_is_checked_without_a_limit():
    cfg = ApexConfig.preset("atari")
    placement, held = _plan(cfg)
    check_memory(cfg, ATARI, held, {a: 0 for a in held}, {})


def test_networks_too_big_for_the_learners_worker_are_refused_naming_their_keys():
    """The networks' share comes from the networks themselves (built on torch's meta
    device: no memory); the refusal names the agent's keys that shape them."""
    cfg = ApexConfig.preset("atari").override(
        {"replay.capacity": 40_000, "replay.learning_starts": 1000, "dqn.hiddens": [40_000]}
    )
    msg = _refusal(cfg, 4 * GIB)
    assert "\n" not in msg and "the learner's networks" in msg and "needs about" in msg
    assert "dqn.hiddens=[40000]" in msg and "smaller networks" in msg


def test_the_cli_refuses_networks_that_cannot_fit_before_starting_anything(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    submit = Path(sys.executable).parent / "apex-dask-submit"
    done = subprocess.run(
        [str(submit), "--preset", "cartpole", "--set", "dqn.hiddens=[200000,200000]",
         "--out", str(tmp_path / "run")],
        capture_output=True, text=True, timeout=180,
    )  # fmt: skip
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "the learner's networks" in last and "dqn.hiddens=[200000, 200000]" in last
    assert not (tmp_path / "run").exists() or not any((tmp_path / "run").iterdir())
