"""The exported greedy policy loads with plain torch and acts as the learner's network."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
from agent_parts import observations
from gymnasium import spaces
from trained_runs import cartpole_run, minatar_run, pendulum_model, pendulum_run

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.networks import build_q_network, q_network
from apex_dask.algo.agents.registry import make_policy
from apex_dask.algo.agents.spec import AgentSpec
from apex_dask.algo.play.export import export_policy
from apex_dask.cli.evaluate import main

# A process that never imports apex_dask: only torch, numpy and the files.
LOADER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import torch
    policy = torch.jit.load(sys.argv[1])
    obs = np.load(sys.argv[2])
    batch = policy(torch.as_tensor(obs)).tolist()
    singles = [policy(torch.as_tensor(o)).tolist() for o in obs[:50]]
    assert not any(m == "apex_dask" or m.startswith("apex_dask.") for m in sys.modules)
    print(json.dumps({"batch": batch, "singles": singles}))
    """
)


def load_elsewhere(program: Path, obs: np.ndarray, tmp_path: Path) -> dict:
    np.save(tmp_path / "obs.npy", obs)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [sys.executable, "-I", "-c", LOADER, str(program), str(tmp_path / "obs.npy")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def network_actions(net: torch.nn.Module, obs: np.ndarray, start: int = 0) -> list[int]:
    with torch.no_grad():
        return (net(torch.as_tensor(obs)).argmax(dim=1) + start).tolist()


CASES = {
    "vector": (spaces.Box(-np.inf, np.inf, (4,), np.float32), spaces.Discrete(2), (64, 64)),
    "minatar-like bool grid (HWC)": (
        spaces.Box(0, 1, (10, 10, 4), bool),
        spaces.Discrete(6),
        (32,),
    ),
    "uint8 frames scaled by 1/255": (
        spaces.Box(0, 255, (4, 40, 40), np.uint8),
        spaces.Discrete(5, start=1),
        (32,),
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_exported_policy_agrees_on_1000_observations(tmp_path, case):
    obs_space, act_space, hiddens = CASES[case]
    torch.manual_seed(3)
    net = build_q_network(obs_space, act_space, hiddens, dueling=True).eval()
    with torch.no_grad():  # weights far from the near-constant initial net, as trained ones are
        for p in net.parameters():
            p.normal_(0.0, 0.5)
    spec = AgentSpec("dqn", DQNConfig(hiddens=hiddens))
    program, meta = export_policy(
        tmp_path / "p.pt", spec, obs_space, act_space, module_weights(net)
    )
    obs = observations(obs_space, 1000, seed=1)
    want = network_actions(net, obs, int(act_space.start))
    got = load_elsewhere(program, obs, tmp_path)
    assert len(set(want)) > 1, "the check needs more than one action to mean anything"
    assert got["batch"] == want
    assert got["singles"] == want[:50]
    doc = json.loads(meta.read_text())
    assert doc["observation_space"]["shape"] == list(obs_space.shape)
    assert doc["action_space"] == {
        "type": "Discrete",
        "n": int(act_space.n),
        "start": int(act_space.start),
    }
    if obs_space.dtype == np.uint8:
        assert any("1/255" in x or "0.003921568627" in x for x in doc["inside"]), doc["inside"]


HEADS = {
    "c51 + noisy, vector": (
        spaces.Box(-np.inf, np.inf, (4,), np.float32),
        spaces.Discrete(3),
        DQNConfig(hiddens=(64,), num_atoms=51, noisy=True),
    ),
    "hl_gauss + layer norm, minatar-like grid": (
        spaces.Box(0, 1, (10, 10, 4), bool),
        spaces.Discrete(6),
        DQNConfig(hiddens=(32,), loss="hl_gauss", layer_norm=True),
    ),
    "impala c51 + noisy, uint8 frames": (
        spaces.Box(0, 255, (4, 40, 40), np.uint8),
        spaces.Discrete(5, start=1),
        DQNConfig(hiddens=(32,), encoder="impala", num_atoms=11, noisy=True),
    ),
}


@pytest.mark.parametrize("case", sorted(HEADS))
def test_exported_policy_of_each_head_acts_as_the_eval_policy_on_1000_observations(tmp_path, case):
    """The argmax of the expected value under the mean weights, in the program and in
    ``apex-dask-eval``'s policy alike."""
    obs_space, act_space, options = HEADS[case]
    torch.manual_seed(4)
    net = q_network(obs_space, act_space, options).eval()
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.5)
    weights = module_weights(net)
    spec = AgentSpec("dqn", options)
    program, meta = export_policy(tmp_path / "p.pt", spec, obs_space, act_space, weights)
    obs = observations(obs_space, 1000, seed=6)
    policy = make_policy(spec, obs_space, act_space, weights)
    want = [policy.act(o) for o in obs]
    assert want == network_actions(net, obs, int(act_space.start))
    assert len(set(want)) > 1, "the check needs more than one action to mean anything"
    got = load_elsewhere(program, obs, tmp_path)
    assert got["batch"] == want and got["singles"] == want[:50]
    inside = " ".join(json.loads(meta.read_text())["inside"])
    assert "expected value" in inside and ("mean weights" in inside) == options.noisy


def test_cli_export_of_a_run_without_playing(tmp_path, capsys):
    run = cartpole_run(tmp_path / "cp")
    target = tmp_path / "out" / "cartpole.pt"
    assert main([str(run), "--export", str(target), "--episodes", "0"]) == 0
    assert "exported the greedy policy" in capsys.readouterr().out
    doc = json.loads(Path(str(target) + ".json").read_text())
    assert doc["env_id"] == "CartPole-v1"
    assert doc["weights_version"] == 42 and doc["outside"] == []
    # the controller the weights encode: right when 0.01 x + 0.05 x' + th + 0.5 th' > 0
    obs = observations(spaces.Box(-np.inf, np.inf, (4,), np.float32), 1000, seed=2)
    want = (obs @ np.array([0.01, 0.05, 1.0, 0.5], np.float32) > 0).astype(int).tolist()
    assert load_elsewhere(target, obs, tmp_path)["batch"] == want


def test_cli_export_of_a_minatar_run_matches_its_network(tmp_path):
    run = minatar_run(tmp_path / "ma")
    target = tmp_path / "ma.pt"
    assert main([str(run), "--export", str(target), "--episodes", "0"]) == 0
    from apex_dask.algo.envs.factory import make_env_factory
    from apex_dask.cli.runfolder import load_run

    trained = load_run(str(run))
    env = make_env_factory(trained.config.env.env_id)()
    space, actions = env.observation_space, env.action_space
    env.close()
    net = build_q_network(space, actions, trained.config.agent.hiddens)
    net.load_state_dict({k: torch.as_tensor(v) for k, v in trained.weights.items()})
    obs = observations(space, 1000, seed=4)
    assert load_elsewhere(target, obs, tmp_path)["batch"] == network_actions(net.eval(), obs)


def test_cli_export_of_a_dpg_run_is_its_actor(tmp_path, capsys):
    run = pendulum_run(tmp_path / "pd")
    target = tmp_path / "pendulum.pt"
    assert main([str(run), "--export", str(target), "--episodes", "0"]) == 0
    assert "exported the greedy policy" in capsys.readouterr().out
    doc = json.loads(Path(str(target) + ".json").read_text())
    assert doc["algo"] == "dpg" and doc["env_id"] == "Pendulum-v1"
    assert doc["action_space"] == {
        "type": "Box",
        "shape": [1],
        "dtype": "float32",
        "low": -2,
        "high": 2,
    }
    obs = observations(spaces.Box(-np.inf, np.inf, (3,), np.float32), 1000, seed=5)
    with torch.no_grad():
        want = pendulum_model().actor(torch.as_tensor(obs)).numpy()
    got = load_elsewhere(target, obs, tmp_path)
    batch = np.asarray(got["batch"], np.float32)
    assert batch.shape == (1000, 1)
    np.testing.assert_allclose(batch, want, atol=1e-5)
    np.testing.assert_allclose(np.asarray(got["singles"], np.float32), want[:50], atol=1e-5)
    assert batch.min() >= -2.0 and batch.max() <= 2.0 and batch.std() > 0.5
