"""A broken law or a failed background task, through ``apex-dask-submit``: the exit
code, the one line that names it, the checkpoint the run leaves, and the counts.

Faults come from failpoints (``runtime/actors/failpoints.py``) set in the
environment, so the embedded cluster's worker processes inherit them.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def submit(out: Path, failpoints: str, *extra: str) -> subprocess.CompletedProcess:
    cmd = [
        str(BIN / "apex-dask-submit"),
        "--preset", "cartpole", "--out", str(out), "--quiet",
        "--set", "report.min_iter_time_s=1", "--set", "topology.local_workers=2",
        "--set", "checkpoint.interval_s=5",
        *extra,
    ]  # fmt: skip
    env = {**os.environ, "APEX_FAILPOINTS": failpoints}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=420, env=env)


def error_lines(proc: subprocess.CompletedProcess) -> list[str]:
    return [x for x in proc.stderr.splitlines() if x.startswith("apex-dask-submit: error:")]


def checkpoints(out: Path) -> list[Path]:
    return sorted(p.parent for p in (out / "checkpoints").glob("ckpt-*/manifest.json"))


def test_a_broken_law_with_strict_invariants_is_exit_3_one_line_and_a_checkpoint(tmp_path):
    out = tmp_path / "run"
    proc = submit(
        out, "drop_rollout_every=5", "--set", "report.strict_invariants=true", "--stop-time", "300"
    )
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = error_lines(proc)
    assert "invariant violated: rollouts" in line and "stored" in line, line
    assert "Traceback" not in proc.stderr
    named = line.rsplit("checkpoint ", 1)[-1].split()[0]
    assert Path(named) in checkpoints(out), (named, checkpoints(out))
    final = json.loads((out / "final.json").read_text())
    assert final["health/invariant_violations/rollouts"] >= 1
    # the checkpoint the line names resumes: a fresh run without the fault goes on from it
    again = subprocess.run(
        [str(BIN / "apex-dask-submit"), "--resume", str(out), "--quiet", "--stop-timesteps", "1"],
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_restart_task_that_fails_once_is_counted_and_the_run_finishes(tmp_path):
    out = tmp_path / "run"
    # a fixed time with a checkpoint every 5 s: the job's turns come whatever the speed
    proc = submit(out, "task:driver.checkpoints", "--stop-time", "25")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert error_lines(proc) == []
    warned = [x for x in proc.stderr.splitlines() if "driver.checkpoints" in x]
    assert len(warned) == 1 and "warning" in warned[0], proc.stderr
    final = json.loads((out / "final.json").read_text())
    assert final["health/task_failures/driver.checkpoints"] == 1
    assert final["health/task_failures"] == 1
    assert final["health/invariant_violations"] == 0
    assert checkpoints(out), "the restarted checkpoint job wrote no checkpoint"


def test_an_end_task_that_fails_ends_the_run_with_exit_3_naming_it(tmp_path):
    out = tmp_path / "run"
    proc = submit(out, "task:learner.thread", "--stop-time", "300")
    assert proc.returncode == 3, proc.stdout + proc.stderr
    [line] = error_lines(proc)
    assert "the learner thread failed" in line and "InjectedFault" in line, line
    named = line.rsplit("checkpoint ", 1)[-1].split()[0]
    assert Path(named) in checkpoints(out), (named, checkpoints(out))
    # the embedded workers log to this terminal: the learner's traceback is its log's; the
    # CLI's own goes to the run's log file, not the terminal
    assert "apex_dask.runtime.errors.BackgroundTaskFailed" not in proc.stderr
    assert "BackgroundTaskFailed" in (out / "apex-dask-submit.log").read_text()
    final = json.loads((out / "final.json").read_text())
    assert final["health/task_failures/learner.thread"] == 1
    assert final["health/task_failures"] == 1
