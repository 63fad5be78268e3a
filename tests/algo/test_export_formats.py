"""Every agent and value head exported as ONNX, ``torch.export`` (.pt2) and TorchScript (.pt),
each file run by its own runtime in a process where neither apex_dask nor gymnasium can
be imported (and, for ONNX, not torch either), acting as the project's greedy policy:

- DQN with each value head (plain, dueling, C51, HL-Gauss, noisy at its mean weights)
  on vector observations and on uint8 frames (input scaling inside the program);
- DPG's actor (float actions within the bounds);
- R2D2 over whole episodes, its recurrent state passed back step by step.

The files are written once per module; one child process per format runs them all.
The quick tier checks a few cases per format; the full matrix is ``slow``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path

import gymnasium as gym
import numpy as np
import pytest
import torch
from agent_parts import observations
from gymnasium import spaces

from apex_dask.algo.agents.base import module_weights
from apex_dask.algo.agents.dpg.config import DPGConfig
from apex_dask.algo.agents.dpg.networks import build_dpg_model
from apex_dask.algo.agents.dqn.config import DQNConfig
from apex_dask.algo.agents.dqn.networks import q_network
from apex_dask.algo.agents.r2d2.config import R2D2Config
from apex_dask.algo.agents.r2d2.networks import RecurrentQNetwork
from apex_dask.algo.agents.registry import make_policy
from apex_dask.algo.agents.spec import AgentSpec
from apex_dask.algo.envs.pomdp import POMDP_CARTPOLE_ID
from apex_dask.algo.play.export import ExportError, export_policy, format_of

FORMATS = {"onnx": ".onnx", "pt2": ".pt2", "torchscript": ".pt"}
BLOCKED = {  # not installed for the child, beyond apex_dask and gymnasium
    "onnx": ["torch", "onnxscript"],
    "pt2": ["onnxruntime", "onnx", "onnxscript", "onnx_ir"],
    "torchscript": ["onnxruntime", "onnx", "onnxscript", "onnx_ir"],
}

VECTOR = spaces.Box(-np.inf, np.inf, (4,), np.float32)
FRAMES = spaces.Box(0, 255, (4, 36, 36), np.uint8)
GRID = spaces.Box(0, 1, (10, 10, 4), bool)  # MinAtar-like, HWC

DQN_HEADS = {
    "plain": {"dueling": False},
    "dueling": {"dueling": True},
    "c51": {"num_atoms": 21},
    "hl_gauss": {"loss": "hl_gauss", "num_bins": 21},
    "noisy": {"noisy": True},
}


def _dqn(obs_name: str, head: str):
    obs_space = {"vector": VECTOR, "frames": FRAMES, "grid": GRID}[obs_name]
    act_space = spaces.Discrete(5, start=1) if obs_name == "frames" else spaces.Discrete(4)
    config = DQNConfig(hiddens=(32,) if obs_name != "vector" else (64, 64), **DQN_HEADS[head])
    torch.manual_seed(11)
    net = q_network(obs_space, act_space, config)
    # far from the near-constant initial net, as trained ones are; a distribution's
    # logits not so large that its softmax saturates (Q at v_max: ties between actions)
    std = 0.5 if head in ("plain", "dueling", "noisy") else 0.15
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, std)
    return AgentSpec("dqn", config), obs_space, act_space, module_weights(net)


def _dpg():
    obs_space = spaces.Box(-np.inf, np.inf, (3,), np.float32)
    act_space = spaces.Box(np.array([-2.0, -1.0], np.float32), np.array([2.0, 1.0], np.float32))
    config = DPGConfig(actor_hiddens=(64, 64), critic_hiddens=(32,))
    torch.manual_seed(12)
    model = build_dpg_model(obs_space, act_space, config.actor_hiddens, config.critic_hiddens, True)
    with torch.no_grad():  # actions spread over the bounds, few at them
        for p in model.parameters():
            p.normal_(0.0, 0.15)
    return AgentSpec("dpg", config), obs_space, act_space, module_weights(model)


R2D2_ENV = POMDP_CARTPOLE_ID  # CartPole without the velocities: the state matters


def _r2d2(image: bool = False):
    if image:
        obs_space, act_space = GRID, spaces.Discrete(3)
        config = R2D2Config(hiddens=(32,), lstm_size=16)
    else:
        env = gym.make(R2D2_ENV)
        obs_space, act_space = env.observation_space, env.action_space
        env.close()
        config = R2D2Config(hiddens=(32,), lstm_size=16)
    torch.manual_seed(13)
    net = RecurrentQNetwork(obs_space, act_space, config)
    with torch.no_grad():
        for p in net.parameters():
            p.normal_(0.0, 0.4)
    return AgentSpec("r2d2", config), obs_space, act_space, module_weights(net)


def build(case: str):
    algo, _, rest = case.partition(":")
    if algo == "dqn":
        obs_name, head = rest.split("/")
        return _dqn(obs_name, head)
    if algo == "dpg":
        return _dpg()
    return _r2d2(image=rest == "grid")


DQN_CASES = [f"dqn:{o}/{h}" for o in ("vector", "frames") for h in DQN_HEADS] + ["dqn:grid/dueling"]
ALL_CASES = [*DQN_CASES, "dpg:vector", "r2d2:vector", "r2d2:grid"]
QUICK = {"dqn:frames/c51", "dpg:vector", "r2d2:vector"}


def greedy_sequences(spec, obs_space, act_space, weights) -> tuple[list[np.ndarray], list]:
    """For a recurrent agent: the observations and the policy's actions over whole
    episodes (R2D2's env; an image space: a random walk of frames) totalling >= 1000 steps,
    its state reset at each episode's start."""
    policy = make_policy(spec, obs_space, act_space, weights)
    episodes, actions = [], []
    if obs_space.dtype == bool:
        for seed in range(4):
            obs = observations(obs_space, 250, seed=100 + seed, std=1.5)
            policy.reset()
            episodes.append(obs)
            actions.append([policy.act(o) for o in obs])
        return episodes, actions
    env = gym.make(R2D2_ENV)
    seed, total = 0, 0
    while total < 1000:
        obs, _ = env.reset(seed=seed)
        policy.reset()
        seq, acts, done = [obs], [], False
        while not done:
            a = policy.act(obs)
            acts.append(a)
            obs, _, terminated, truncated, _ = env.step(a)
            done = terminated or truncated
            if not done:
                seq.append(obs)
        episodes.append(np.stack(seq))
        actions.append(acts)
        seed, total = seed + 1, total + len(acts)
    env.close()
    return episodes, actions


# The child runs with ``python -I -S`` on a copy of this environment's site-packages (links)
# without apex_dask, gymnasium and the other formats' runtimes: for it they are not installed.
CHILD = textwrap.dedent(
    """
    import importlib.util, json, sys
    kind, jobs_path, site, blocked = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4]
    sys.path.insert(0, site)
    missing = [n for n in blocked.split(",") if importlib.util.find_spec(n) is None]
    assert missing == blocked.split(","), f"importable here: {set(blocked.split(',')) - set(missing)}"
    import numpy as np

    if kind == "onnx":
        import onnxruntime

        def load(path):
            options = onnxruntime.SessionOptions()
            options.intra_op_num_threads = options.inter_op_num_threads = 1
            session = onnxruntime.InferenceSession(
                path, options, providers=["CPUExecutionProvider"]
            )
            names = [i.name for i in session.get_inputs()]
            return lambda *xs: session.run(None, dict(zip(names, xs)))
    else:
        import torch

        torch.set_num_threads(1)

        def load(path):
            if kind == "pt2":
                program = torch.export.load(path).module()
            else:
                program = torch.jit.load(path)

            def run(*xs):
                with torch.no_grad():
                    out = program(*(torch.from_numpy(np.ascontiguousarray(x)) for x in xs))
                out = out if isinstance(out, (tuple, list)) else (out,)
                return [o.numpy() for o in out]

            return run

    results = {}
    for job in json.load(open(jobs_path)):
        run = load(job["file"])
        if job["state"]:  # whole episodes, the state passed back
            got = []
            for path in job["episodes"]:
                state = [np.zeros(s, np.float32) for s in job["state"]]
                acts = []
                for o in np.load(path):
                    action, *state = run(o[None], *state)
                    acts.append(action[0].tolist())
                got.append(acts)
            results[job["case"]] = {"episodes": got}
        else:
            obs = np.load(job["obs"])
            batch = run(obs)[0].tolist()
            singles = [run(o[None])[0][0].tolist() for o in obs[:20]]
            results[job["case"]] = {"batch": batch, "singles": singles}
    print(json.dumps({"results": results, "modules": sorted({m.split(".")[0] for m in sys.modules})}))
    """
)


def _key(name: str) -> str:
    return name.split("-")[0].split(".")[0].lower().replace("-", "_")


def site_without(folder: Path, blocked: list[str]) -> Path:
    """``folder``: links to every entry of this environment's site-packages but those of
    the ``blocked`` distributions (and the editable installs' path hooks)."""
    site = Path(sysconfig.get_paths()["purelib"])
    folder.mkdir()
    for entry in site.iterdir():
        key = _key(entry.name)
        if key in blocked or key.startswith("__editable__") or entry.suffix == ".pth":
            continue
        (folder / entry.name).symlink_to(entry)
    return folder


def run_child(kind: str, jobs: list[dict], folder: Path) -> dict:
    jobs_path = folder / f"jobs-{kind}.json"
    jobs_path.write_text(json.dumps(jobs))
    blocked = ["apex_dask", "gymnasium", *BLOCKED[kind]]
    site = site_without(folder / f"site-{kind}", blocked)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON")}
    env["OMP_NUM_THREADS"] = "1"
    # torch 2.13 warns that torch.jit.load is deprecated; the other runtimes must not
    strict = [] if kind == "torchscript" else ["-W", "error::DeprecationWarning"]
    proc = subprocess.run(
        [
            sys.executable,
            "-I",
            "-S",
            *strict,
            "-c",
            CHILD,
            kind,
            str(jobs_path),
            str(site),
            ",".join(blocked),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        timeout=600,
        cwd=folder,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    out = json.loads(proc.stdout)
    assert not set(out["modules"]) & set(blocked), out["modules"]
    return out["results"]


class Exported:
    """Each case's files in each format, and what the project's greedy policy did."""

    def __init__(self, cases: list[str], folder: Path) -> None:
        self.folder, self.want, self.docs, self.jobs = folder, {}, {}, {k: [] for k in FORMATS}
        for case in cases:
            spec, obs_space, act_space, weights = build(case)
            slug = case.replace(":", "-").replace("/", "-")
            job: dict = {"case": case, "state": []}
            if spec.algo == "r2d2":
                episodes, actions = greedy_sequences(spec, obs_space, act_space, weights)
                job["episodes"] = []
                for i, seq in enumerate(episodes):
                    np.save(folder / f"{slug}-ep{i}.npy", seq)
                    job["episodes"].append(str(folder / f"{slug}-ep{i}.npy"))
                self.want[case] = actions
            else:
                obs = observations(obs_space, 1000, seed=len(slug), std=1.5)
                np.save(folder / f"{slug}.npy", obs)
                job["obs"] = str(folder / f"{slug}.npy")
                policy = make_policy(spec, obs_space, act_space, weights)
                self.want[case] = [policy.act(o) for o in obs]
            for kind, suffix in FORMATS.items():
                path, meta = export_policy(
                    folder / f"{slug}{suffix}", spec, obs_space, act_space, weights
                )
                doc = json.loads(meta.read_text())
                self.docs[case, kind] = doc
                state = [[1, *s["shape"]] for s in doc["state"]]
                self.jobs[kind].append({**job, "file": str(path), "state": state})
        self.got = {kind: run_child(kind, self.jobs[kind], folder) for kind in FORMATS}


def exported(cases: list[str], folder: Path) -> Exported:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one observation at a time: threads only contend
    try:
        return Exported(cases, folder)
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    return exported(sorted(QUICK), tmp_path_factory.mktemp("quick"))


@pytest.fixture(scope="module")
def full(tmp_path_factory):
    return exported(ALL_CASES, tmp_path_factory.mktemp("full"))


def check_case(exported: Exported, case: str, kind: str) -> None:
    want, got, doc = exported.want[case], exported.got[kind][case], exported.docs[case, kind]
    if case.startswith("r2d2"):
        assert sum(len(a) for a in want) >= 1000
        assert len(set(a for ep in want for a in ep)) > 1, "needs more than one action"
        assert got["episodes"] == want
        assert [s["input"] for s in doc["state"]] == ["h", "c"]
        return
    assert len(want) == 1000
    if case.startswith("dpg"):
        want_a = np.asarray(want, np.float32)
        np.testing.assert_allclose(np.asarray(got["batch"], np.float32), want_a, atol=1e-5)
        np.testing.assert_allclose(np.asarray(got["singles"]), want_a[:20], atol=1e-5)
        spread = want_a.std(axis=0) / np.array([2.0, 1.0])
        assert spread.min() > 0.03, "the actions should vary over the range"
        return
    assert len(set(want)) > 1, "the check needs more than one action to mean anything"
    assert got["batch"] == want
    assert got["singles"] == want[:20]
    if kind != "torchscript":
        assert doc["batch"] == {"dynamic": True, "min": 1}, doc["batch"]
        assert doc["inputs"][0]["shape"][0] == "batch"


@pytest.mark.parametrize("kind", sorted(FORMATS))
@pytest.mark.parametrize("case", sorted(QUICK))
def test_each_format_acts_as_the_greedy_policy_in_its_own_runtime(quick, case, kind):
    check_case(quick, case, kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", sorted(FORMATS))
@pytest.mark.parametrize("case", ALL_CASES)
def test_every_agent_and_head_in_every_format(full, case, kind):
    check_case(full, case, kind)


def test_the_json_says_how_to_call_each_format(quick):
    for (case, kind), doc in quick.docs.items():
        assert doc["file_format"] == kind and doc["format"] == "apex-dask-policy/2"
        assert doc["inputs"][0]["name"] == "obs"
        assert doc["outputs"][0]["name"] == "action"
        runtime = {"onnx": "onnxruntime", "pt2": "torch.export.load", "torchscript": "torch.jit"}
        assert runtime[kind] in doc["load"], doc["load"]
        if case == "dqn:frames/c51":
            assert doc["inputs"][0]["dtype"] == "uint8"
            assert any("input scaling" in line for line in doc["inside"]), doc["inside"]
        if case.startswith("r2d2"):
            assert [o["name"] for o in doc["outputs"]] == ["action", "h_out", "c_out"]
            assert doc["state"][0]["at_episode_start"] == "zeros"


def test_the_format_follows_the_suffix_or_the_flag():
    assert format_of("a.onnx") == "onnx" and format_of("b.PT2") == "pt2"
    assert format_of("c.pt") == "torchscript" and format_of("d.bin", "onnx") == "onnx"
    assert format_of("e.pt", ".pt2") == "pt2"
    with pytest.raises(ExportError, match=r"\*\.onnx, \*\.pt2 or \*\.pt"):
        format_of("policy.model")
    with pytest.raises(ExportError, match="unknown export format 'tflite'"):
        format_of("p.onnx", "tflite")
