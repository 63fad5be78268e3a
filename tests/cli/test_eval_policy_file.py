"""``apex-dask-eval --policy FILE`` plays an exported ``.onnx``, ``.pt2`` or ``.pt`` file in its
own runtime, on the env its JSON names: episode for episode what the run's own weights
play (the same seeds, the same epsilon draws). No warning of torch's reaches the user."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from trained_runs import cartpole_run, pendulum_run, pomdp_run

from apex_dask.algo.play.episodes import play_episodes
from apex_dask.algo.play.exported import PolicyFile
from apex_dask.cli.evaluate import main
from apex_dask.cli.runfolder import load_run
from apex_dask.experiment.builder import agent_spec, env_factory

EVAL = str(Path(sys.executable).parent / "apex-dask-eval")
SUFFIXES = {"onnx": ".onnx", "pt2": ".pt2", "torchscript": ".pt"}
RUNS = {"dqn": cartpole_run, "r2d2": pomdp_run, "dpg": pendulum_run}
QUICK = {("dqn", "onnx"), ("r2d2", "pt2"), ("dpg", "torchscript")}


def export_quietly(capsys, run: Path, target: Path, *flags: str) -> dict:
    """Export through the CLI with every warning an error: none may reach the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert main([str(run), "--export", str(target), "--episodes", "0", *flags]) == 0
    out, err = capsys.readouterr()
    assert err == "", err
    assert out.count("\n") == 1 and "exported the greedy policy" in out, out
    return json.loads(Path(str(target) + ".json").read_text())


CASES = [
    pytest.param(algo, kind, marks=() if (algo, kind) in QUICK else pytest.mark.slow)
    for algo in RUNS
    for kind in SUFFIXES
]


@pytest.mark.parametrize(("algo", "kind"), CASES)
def test_an_exported_file_plays_the_runs_episodes(tmp_path, capsys, algo, kind):
    run = RUNS[algo](tmp_path / algo)
    target = tmp_path / f"policy{SUFFIXES[kind]}"
    doc = export_quietly(capsys, run, target)
    assert doc["file_format"] == kind and doc["algo"] == algo
    trained = load_run(str(run))
    factory = env_factory(trained.config)
    exported = PolicyFile.read(target)
    common = {"base_seed": 11, "epsilon": 0.3, "max_steps": trained.config.eval.max_episode_steps}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got = play_episodes(exported.env_factory(), exported, {}, range(4), **common)
    want = play_episodes(factory, agent_spec(trained.config), trained.weights, range(4), **common)
    assert [r["length"] for r in got] == [r["length"] for r in want]
    assert [r["return"] for r in got] == pytest.approx([r["return"] for r in want], rel=1e-6)
    assert len({r["return"] for r in want}) > 1, "epsilon 0.3: the episodes should differ"


def test_the_format_flag_overrides_the_suffix(tmp_path, capsys):
    run = cartpole_run(tmp_path / "cp")
    doc = export_quietly(capsys, run, tmp_path / "policy.bin", "--format", "pt2")
    assert doc["file_format"] == "pt2"
    assert "torch.export.load" in doc["load"]


def one_line(capsys, argv: list[str], *needles: str) -> None:
    assert main(argv) == 2
    lines = [x for x in capsys.readouterr().err.splitlines() if x.strip()]
    assert len(lines) == 1, lines
    assert lines[0].startswith("apex-dask-eval: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])


def test_bad_policy_and_export_flags_are_one_line(tmp_path, capsys):
    run = cartpole_run(tmp_path / "cp")
    one_line(capsys, [], "RUN_DIR", "--policy FILE")
    one_line(capsys, [str(run), "--policy", "x.onnx"], "one of them")
    one_line(capsys, [str(run), "--export", "p.model", "--episodes", "0"], "*.onnx, *.pt2 or *.pt")
    one_line(capsys, [str(run), "--format", "onnx"], "--format goes with --export")
    one_line(capsys, ["--policy", str(tmp_path / "none.onnx")], "no such file", "--export")
    (tmp_path / "p.onnx").write_bytes(b"not a model")
    one_line(capsys, ["--policy", str(tmp_path / "p.onnx")], "p.onnx.json is missing")
    (tmp_path / "p.onnx.json").write_text("{")
    one_line(capsys, ["--policy", str(tmp_path / "p.onnx")], "not valid JSON")
    doc = {"format": "apex-dask-policy/2", "file_format": "onnx", "env_id": "CartPole-v1"}
    doc |= {"observation_space": {"type": "Box", "shape": [4], "dtype": "float32"}}
    doc |= {"action_space": {"type": "Discrete", "n": 2, "start": 0}}
    (tmp_path / "p.onnx.json").write_text(json.dumps(doc))
    one_line(capsys, ["--policy", str(tmp_path / "p.onnx")], "does not load as onnx")
    one_line(capsys, ["--policy", str(tmp_path / "p.onnx"), "--export", "q.pt"], "--export")


def evaluate(*args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([EVAL, *args], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


def newest_report(folder: Path) -> dict:
    return json.loads(sorted(folder.glob("eval-*.json"))[-1].read_text())


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize("algo", ["dqn", "r2d2"])
def test_cli_plays_each_format_as_the_runs_own_evaluation(tmp_path, capsys, algo):
    run = RUNS[algo](tmp_path / "run")
    common = ["--episodes", "6", "--seed", "7", "--epsilon", "0.3", "--workers", "2"]
    evaluate(str(run), *common)
    want = newest_report(run)
    assert len(set(want["returns"])) > 1
    for kind, suffix in SUFFIXES.items():
        target = tmp_path / kind / f"policy{suffix}"
        export_quietly(capsys, run, target)
        video = ["--video", str(tmp_path / "videos"), "--video-episodes", "1"]
        proc = evaluate("--policy", str(target), *common, *(video if kind == "onnx" else ()))
        assert "Warning" not in proc.stderr and "deprecated" not in proc.stderr, proc.stderr
        assert f"6 episodes of {want['env_id']}" in proc.stdout, proc.stdout
        got = newest_report(target.parent)
        assert got["policy"] == str(target) and got["weights_version"] == want["weights_version"]
        assert got["returns"] == want["returns"], kind
        assert got["lengths"] == want["lengths"], kind
        if kind == "onnx":
            assert len(got["videos"]) == 1 and Path(got["videos"][0]).stat().st_size > 0
