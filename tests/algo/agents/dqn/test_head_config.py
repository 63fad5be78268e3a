"""The value-head and encoder keys in the config: where they live, how they reach the
agent's options, the combinations refused before start (one line each), and the
exploration of noisy nets."""

from __future__ import annotations

import numpy as np
import pytest
from gymnasium import spaces

from apex_dask.algo.agents.dqn.builder import BUILDER as DQN
from apex_dask.config import ApexConfig, ConfigError


def test_the_keys_reach_the_agents_options():
    cfg = ApexConfig.preset("minatar").override(
        {
            "dqn.num_atoms": 51,
            "dqn.v_min": -20,
            "dqn.v_max": 20,
            "dqn.noisy": True,
            "dqn.sigma0": 0.4,
            "dqn.layer_norm": True,
            "dqn.encoder": "impala",
            "dqn.impala_scale": 2,
        }
    )
    o = DQN.agent_spec(cfg).config
    assert (o.num_atoms, o.v_min, o.v_max, o.noisy, o.sigma0) == (51, -20.0, 20.0, True, 0.4)
    assert (o.layer_norm, o.encoder, o.impala_scale, o.head, o.num_outputs) == (
        True, "impala", 2, "c51", 51,
    )  # fmt: skip
    hl = DQN.agent_spec(cfg.override({"dqn.num_atoms": 1, "dqn.loss": "hl_gauss"}))
    assert hl.config.head == "hl_gauss" and hl.config.num_outputs == 51
    assert "dqn.num_atoms=51" in DQN.network_keys(cfg)
    assert "dqn.impala_scale=2" in DQN.network_keys(cfg)
    docs = ApexConfig.field_docs()
    for key in ("num_atoms", "v_min", "v_max", "noisy", "sigma0", "loss", "num_bins"):
        assert docs[f"dqn.{key}"], key
    assert "RLlib" in docs["dqn.num_atoms"] and docs["workers.epsilon_with_noisy"]


@pytest.mark.parametrize(
    ("overrides", "needles"),
    [
        (
            {"dqn.num_atoms": 51, "dqn.loss": "hl_gauss"},
            ["dqn.loss='hl_gauss' is invalid", "dqn.num_atoms=51", "dqn.loss=huber"],
        ),
        ({"dqn.loss": "mse"}, ["dqn.loss='mse'", "huber, hl_gauss"]),
        ({"dqn.num_atoms": 0}, ["dqn.num_atoms=0", ">= 1"]),
        ({"dqn.num_atoms": 51, "dqn.v_min": 3.0, "dqn.v_max": 3.0}, ["v_max=3.0"]),
        ({"dqn.loss": "hl_gauss", "dqn.v_min": 1.0, "dqn.v_max": -1.0}, ["v_max"]),
        ({"dqn.loss": "hl_gauss", "dqn.num_bins": 1}, ["dqn.num_bins=1", ">= 2"]),
        ({"dqn.loss": "hl_gauss", "dqn.hl_gauss_sigma_ratio": 0.0}, ["sigma_ratio"]),
        ({"dqn.noisy": True, "dqn.sigma0": -0.1}, ["dqn.sigma0=-0.1", "> 0"]),
        ({"dqn.encoder": "resnet"}, ["dqn.encoder='resnet'", "auto, impala"]),
        ({"dqn.impala_scale": 0}, ["dqn.impala_scale=0"]),
    ],
)
def test_combinations_that_make_no_sense_are_one_line(overrides, needles):
    with pytest.raises(ConfigError) as err:
        ApexConfig.preset("cartpole").override(overrides)
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_sensible_combinations_pass_and_unused_keys_are_harmless():
    base = ApexConfig.preset("cartpole")
    for overrides in (
        {"dqn.num_atoms": 51, "dqn.noisy": True, "dqn.dueling": False},
        {"dqn.loss": "hl_gauss", "dqn.layer_norm": True, "dqn.double_q": False},
        {"dqn.num_bins": 1},  # no HL-Gauss: not read
        {"dqn.v_min": 5.0, "dqn.v_max": -5.0},  # no support: not read
    ):
        base.override(overrides)


def test_noisy_nets_explore_with_their_noise_alone_unless_asked():
    cfg = ApexConfig.preset("minatar")
    ladder = DQN.exploration_ladder(cfg, 8)
    assert ladder[0] == pytest.approx(0.4) and np.all(ladder > 0)
    noisy = cfg.override({"dqn.noisy": True})
    np.testing.assert_array_equal(DQN.exploration_ladder(noisy, 8), np.zeros(8))
    both = noisy.override({"workers.epsilon_with_noisy": True})
    np.testing.assert_array_equal(DQN.exploration_ladder(both, 8), ladder)


def test_the_impala_encoder_is_refused_for_vectors_and_taken_for_images():
    impala = DQN.agent_spec(ApexConfig().override({"dqn.encoder": "impala"})).config
    vector, grid = spaces.Box(-1, 1, (4,), np.float32), spaces.Box(0, 1, (10, 10, 4), bool)
    problem = DQN.check_spaces(vector, spaces.Discrete(2), impala)
    assert problem is not None and "dqn.encoder=auto" in problem and "\n" not in problem
    assert DQN.check_spaces(grid, spaces.Discrete(2), impala) is None
    assert DQN.check_spaces(vector, spaces.Discrete(2)) is None  # the spaces alone
