"""apex-dask-eval refuses bad input in one line (exit 2) before any cluster starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from trained_runs import cartpole_run, cartpole_weights, pendulum_run

from apex_dask.cli.evaluate import main
from apex_dask.cli.outdir import write_text
from apex_dask.cli.runfolder import load_run
from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoints.store import save_checkpoint

EVAL = str(Path(sys.executable).parent / "apex-dask-eval")


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory) -> Path:
    return cartpole_run(tmp_path_factory.mktemp("runs") / "cp")


def one_line(capsys, argv: list[str], *needles: str) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    lines = [x for x in err.splitlines() if x.strip()]
    assert len(lines) == 1, err
    assert lines[0].startswith("apex-dask-eval: error:"), lines[0]
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.mark.parametrize(
    ("flags", "needles"),
    [
        (["--episodes", "0"], ["--episodes 0", "--export"]),
        (["--episodes", "-3"], ["--episodes -3"]),
        (["--epsilon", "1.5"], ["--epsilon 1.5", "[0, 1]"]),
        (["--epsilon", "nan"], ["--epsilon nan"]),
        (["--workers", "0"], ["--workers 0"]),
        (["--workers", "2", "--scheduler", "tcp://127.0.0.1:1"], ["--workers", "embedded"]),
        (["--video", "v", "--video-episodes", "5", "--episodes", "2"], ["--video-episodes 5"]),
        (["--scheduler", "tcp://127.0.0.1:1", "--scheduler-file", "x"], ["exclude each other"]),
        (["--scheduler-file", "/nonexistent/s.json"], ["/nonexistent/s.json", "does not exist"]),
        (["--connect-timeout", "-1"], ["--connect-timeout"]),
    ],
)
def test_bad_flags_are_one_line(capsys, run_dir, flags, needles):
    one_line(capsys, [str(run_dir), *flags], *needles)


def test_missing_and_foreign_folders(capsys, tmp_path):
    one_line(capsys, [str(tmp_path / "nope")], "does not exist", "--out folder")
    (tmp_path / "notes.txt").write_text("x")
    one_line(capsys, [str(tmp_path / "notes.txt")], "is a file")
    one_line(capsys, [str(tmp_path)], "no config.yaml", "--out folder")


def test_a_run_without_weights_points_at_checkpoint(capsys, tmp_path):
    write_text(tmp_path / "config.yaml", ApexConfig.preset("cartpole").to_yaml())
    one_line(capsys, [str(tmp_path)], "no weights.npz", "no checkpoint")
    save_checkpoint(
        tmp_path / "checkpoints" / "ckpt-000001",
        {"learner": {"online": cartpole_weights(), "counters": {"version": 5}}},
        metadata={"config": ApexConfig.preset("cartpole").to_dict()},
    )
    one_line(capsys, [str(tmp_path)], "no weights.npz", "--checkpoint")


def test_weights_that_do_not_fit_the_config_name_the_tensor(capsys, tmp_path):
    run = cartpole_run(tmp_path / "r")
    cfg = ApexConfig.preset("cartpole").override({"dqn.hiddens": [64]})
    write_text(run / "config.yaml", cfg.to_yaml())
    line = one_line(capsys, [str(run)], "does not fit", "dqn.hiddens=[64]")
    assert "trunk.0.weight" in line or "trunk.2" in line


def test_dpg_weights_that_do_not_fit_name_the_dpg_keys(capsys, tmp_path):
    run = pendulum_run(tmp_path / "pd")
    cfg = ApexConfig.preset("pendulum").override({"dpg.critic_hiddens": [32, 32]})
    write_text(run / "config.yaml", cfg.to_yaml())
    line = one_line(capsys, [str(run)], "does not fit", "algo dpg", "dpg.critic_hiddens=[32, 32]")
    assert "critic.q1.0.weight" in line


def test_pickled_weights_are_refused_not_loaded(capsys, tmp_path):
    run = cartpole_run(tmp_path / "r")
    marker = tmp_path / "unpickled"
    np.savez(run / "weights.npz", __version__=np.asarray(1), w=np.array([_Boom(marker)], object))
    one_line(capsys, [str(run)], "weights.npz", "not a weights file")
    assert not marker.exists()


class _Boom:
    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self):
        return (Path.touch, (self.path,))


def test_an_env_that_is_not_installed_is_one_line(capsys, tmp_path):
    run = cartpole_run(tmp_path / "r")
    cfg = ApexConfig.preset("cartpole")
    text = cfg.to_yaml().replace("CartPole-v1", "no_such_pkg.envs:Thing-v0")
    write_text(run / "config.yaml", text)
    one_line(capsys, [str(run)], "no_such_pkg.envs", "cannot be imported")


def test_checkpoints_load_verified_newest_or_named(capsys, tmp_path):
    run = cartpole_run(tmp_path / "r")
    cfg = ApexConfig.preset("cartpole").to_dict()
    for n, version in ((1, 10), (2, 20)):
        save_checkpoint(
            run / "checkpoints" / f"ckpt-00000{n}",
            {"learner": {"online": cartpole_weights(), "counters": {"version": version}}},
            metadata={"config": cfg},
        )
    assert load_run(str(run), "latest").version == 20
    named = load_run(str(run), "ckpt-000001")
    assert (named.version, named.source) == (10, "checkpoints/ckpt-000001")
    one_line(capsys, [str(run), "--checkpoint", "ckpt-000009"], "ckpt-000009", "ckpt-000001")
    part = run / "checkpoints" / "ckpt-000002" / "learner.npz"
    part.write_bytes(part.read_bytes()[:-10] + b"0123456789")
    one_line(capsys, [str(run), "--checkpoint"], "learner.npz", "checksum")


def test_the_console_script_is_installed_and_says_one_line(tmp_path):
    proc = subprocess.run(
        [EVAL, str(tmp_path / "missing")],
        capture_output=True,
        text=True,
        timeout=120,
        env=os.environ.copy(),
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("apex-dask-eval: error: run folder")
