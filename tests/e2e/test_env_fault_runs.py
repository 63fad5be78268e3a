"""Envs that misbehave during real CLI runs (``python -m apex_dask``), a CPU hog beside.

The envs are in ``tests/misbehaving_envs.py`` (on ``PYTHONPATH`` for the CLI and
the Dask workers it starts). Each run checks the exit code, the one stderr
line, and that every process the CLI started has ended when it returns
(counted by a marker in their environment, ``proctrack.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).parents[2]
TESTS = ROOT / "tests"
sys.path.insert(0, str(TESTS))
sys.path.insert(0, str(TESTS / "e2e"))
sys.path.insert(0, str(TESTS / "runtime"))
from bad_input import SUBMIT, Done, check_console  # noqa: E402
from polling import poll  # noqa: E402
from proctrack import MARK, assert_nothing_left  # noqa: E402

pytestmark = pytest.mark.slow  # CLI runs on an embedded cluster

BASE = ["--set", "topology.local_workers=2", "--quiet"]


@pytest.fixture
def hog():
    proc = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    yield
    proc.kill()
    proc.wait()


def _env(marker: str) -> dict[str, str]:
    path = os.pathsep.join([str(ROOT), str(TESTS), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, MARK: marker}


def _run(marker: str, *args: str, timeout: float = 240) -> Done:
    t0 = time.monotonic()
    proc = subprocess.run(
        [*SUBMIT, *BASE, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=_env(marker),
        cwd=ROOT,
    )
    return Done(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)


def test_an_env_that_raises_now_and_then_is_survived_and_counted(hog, tmp_path):
    # Before: the first exception ended the run (exit 3, "env worker 0 failed"); then,
    # with the per-minute cap (10 per env worker), a fast env failing every 150 steps ended
    # it too (exit 3 at an env worker's 11th error, within seconds). Now the default cap is
    # per 1,000 env steps (10; this env: under 7): survived, however fast it steps.
    out = tmp_path / "run"
    done = _run(
        "env-raises",
        "--set", "env.env_id=misbehaving_envs:RaiseEvery-v0",
        "--set", "env.env_kwargs={every: 150}",
        # a count of steps, not of seconds: on a loaded machine 12 s gave 8 errors a worker
        "--stop-timesteps", "4500", "--stop-time", "150", "--out", str(out),
    )  # fmt: skip
    check_console(done, 0)
    final = json.loads((out / "final.json").read_text())
    assert final["timesteps_total"] >= 4500, final  # stopped by its steps, not the clock
    most = final["env/workers/env_errors/max"]  # rows summarise the env workers' keys
    assert most >= 11, final  # past the old cap, 10 within a minute
    assert final["faults/env_errors"] >= most + final["env/workers/env_errors/min"], final
    assert final["flow/batches_lost"] == 0
    assert_nothing_left("env-raises", grace_s=1.0, what="a run that survived env errors")


def test_nan_from_the_env_ends_at_the_cap_in_one_line_naming_it(hog, tmp_path):
    # Before: exit 3 with "add: priorities must be finite and >= 0" (neither the env nor
    # the value named) and two lines of gymnasium's passive-checker warnings on the console.
    out = tmp_path / "run"
    done = _run(
        "env-nan",
        "--set", "env.env_id=misbehaving_envs:NonFinite-v0",
        "--set", "env.env_kwargs={at: 1}",
        "--stop-time", "120", "--out", str(out),
    )  # fmt: skip
    check_console(done, 3, "'misbehaving_envs:NonFinite-v0'", "non-finite", "env step")
    assert "failed 5 times in a row without completing a step" in done.stderr
    assert "workers.max_consecutive_env_errors=5" in done.stderr
    assert "priorities must be finite" not in done.stderr
    assert "WARN" not in done.stderr + done.stdout
    assert "passive_env_checker" in (out / "apex-dask-submit.log").read_text()
    assert_nothing_left("env-nan", grace_s=1.0, what="a run ended by env errors")


def test_an_env_that_hangs_on_the_workers_is_exit_2_after_the_cluster_started(hog, tmp_path):
    # The CLI's own probe makes it; the workers' (the driver's probe) never return.
    done = _run(
        "env-hangs-on-workers",
        "--set", "env.env_id=misbehaving_envs:HangOnWorker-v0",
        "--set", "env.make_timeout_s=3",
        "--stop-time", "60", "--out", str(tmp_path / "run"),
    )  # fmt: skip
    check_console(done, 2, "HangOnWorker-v0", "env.make_timeout_s=3 s")
    assert_nothing_left("env-hangs-on-workers", grace_s=1.0, what="a run refused once started")


def test_sigterm_with_an_env_worker_stuck_in_a_hung_step_leaves_nothing_running(hog, tmp_path):
    # No env.step_timeout_s: every env's step 50 sleeps an hour (the env threads hang).
    out = tmp_path / "run"
    env = _env("env-hung")
    proc = subprocess.Popen(
        [*SUBMIT, *BASE, "--set", "env.env_id=misbehaving_envs:HangStep-v0"]
        + ["--set", "env.env_kwargs={at: 50}", "--set", "topology.call_timeout_s=10"]
        + ["--stop-time", "300", "--out", str(out)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=ROOT,
        start_new_session=True,
    )
    try:
        poll(lambda: (out / "placement.json").exists(), timeout_s=120)  # actors made
        proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        stdout, stderr = proc.communicate(timeout=180)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    done = Done(proc.returncode, stdout, stderr, took)
    check_console(done, {75, 143})
    assert took < 120, took  # the halt waits topology.call_timeout_s for the hung rollouts
    log = out / "apex-dask-submit.log"
    assert not log.exists() or "killed" not in log.read_text()  # all ended in time
    assert_nothing_left("env-hung", grace_s=1.0, what="a run with a hung env step")
