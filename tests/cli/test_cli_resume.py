"""``--resume DIR``: the newest complete checkpoint, its config, and the keys that may change."""

from __future__ import annotations

import pytest

from apex_dask.cli.checks import UsageError
from apex_dask.cli.main import build_parser
from apex_dask.cli.resume import resolve_resume
from apex_dask.config import ApexConfig
from apex_dask.experiment.checkpoints.store import save_checkpoint


def resume(*argv: str):
    return resolve_resume(build_parser().parse_args(["--resume", *argv]))


@pytest.fixture
def run_dir(tmp_path):
    """A run folder with checkpoints 9 and 10 and a newer one still being written."""
    cfg = ApexConfig.preset("cartpole").override({"seed": 11, "dqn.lr": 2e-4})
    for n, lr in ((9, 1e-3), (10, 2e-4)):
        meta = {"config": cfg.override({"dqn.lr": lr}).to_dict()}
        save_checkpoint(tmp_path / "checkpoints" / f"ckpt-{n:06d}", {"p": {"x": n}}, metadata=meta)
    (tmp_path / "checkpoints" / "ckpt-000011").mkdir()  # no manifest yet: not complete
    return tmp_path


def test_resume_takes_the_newest_complete_checkpoint_and_its_config(run_dir):
    cfg, point = resume(str(run_dir), "--stop-time", "60", "--set", "checkpoint.keep=3")
    assert point.checkpoint == run_dir / "checkpoints" / "ckpt-000010"
    assert cfg.agent.lr == 2e-4 and cfg.seed == 11  # the stored config, not the preset's
    assert cfg.stop.time_s == 60 and cfg.checkpoint.keep == 3
    assert point.overrides == {"checkpoint.keep": "3", "stop.time_s": 60.0}


def test_resume_accepts_a_key_at_the_runs_own_value_and_refuses_a_change(run_dir):
    cfg, point = resume(str(run_dir), "--set", "seed=11")  # a requeued job repeats its flags
    assert cfg.seed == 11 and point.overrides == {}
    with pytest.raises(UsageError, match="--set dqn.lr: a resumed run keeps its config"):
        resume(str(run_dir), "--set", "dqn.lr=0.1")


def test_resume_without_a_checkpoint_or_with_a_preset_is_one_line(tmp_path):
    with pytest.raises(UsageError, match="no checkpoint in .*nothing to resume") as err:
        resume(str(tmp_path))
    assert "\n" not in str(err.value)
    with pytest.raises(UsageError, match="drop --preset/--config"):
        resume(str(tmp_path), "--preset", "cartpole")
