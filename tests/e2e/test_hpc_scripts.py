"""cluster/pbs/apex.pbs run for real on this machine, through PBS stand-ins.

Debian has no PBS server, so the stand-ins in ``tests/e2e/shims`` (``qsub``,
``qdel``, ``pbsdsh``) come first on PATH and run each job and task as local
processes with the variables PBS would set: the script's launch order,
scheduler-file hand-off, worker placement and teardown all execute; only the
spread over separate nodes is simulated (fake host names). Every process
started inherits a unique ``APEX_E2E_MARKER``; none may outlive the job.
cluster/slurm/apex.sbatch runs against a real SLURM in ``test_slurm.py``.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from proctrack import MARK, assert_nothing_left
from tlsprobe import assert_only_the_run_gets_in, assert_private_credentials

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from polling import poll  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
SHIMS = Path(__file__).resolve().parent / "shims"
BIN = Path(sys.executable).parent
# A run probed from outside while it trains: it lasts long enough for the probes (they start
# once the scheduler file exists, before the workers join) on a fast or a loaded machine.
PROBED_ARGS = ["--stop-time", "18", "--set", "report.min_iter_time_s=1", "--quiet"]


def job_env(marker: str, state: Path, **extra: str) -> dict[str, str]:
    return dict(
        os.environ,
        PATH=os.pathsep.join([str(SHIMS), str(BIN), os.environ["PATH"]]),
        APEX_SHIM_STATE=str(state),
        **{MARK: marker},
        **extra,
    )


def check_tls_scheduler(run_dir: Path, host: str = r"127\.0\.0\.1") -> None:
    """The scheduler listened on tls:// (on ``host``: the loopback interface the test chose)."""
    log = (run_dir / "scheduler.log").read_text()
    assert re.search(rf"Scheduler at:\s+tls://{host}:", log), log[-2000:]


def calls(state: Path, tool: str) -> list[dict]:
    lines = (state / "calls.jsonl").read_text().splitlines()
    return [c for c in map(json.loads, lines) if c["tool"] == tool]


def submit_and_probe(
    argv: list[str], cwd: Path, env: dict[str, str]
) -> subprocess.CompletedProcess:
    """Submit a job that blocks until it ends; while it trains, probe its scheduler from
    outside (only a client with the run's credentials gets in); then its completed process."""
    job = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True)  # fmt: skip
    sched = poll(lambda: next(iter(cwd.glob("apex-*/scheduler.json")), None), 120)
    poll(lambda: sched.stat().st_size > 0, 30)
    assert_only_the_run_gets_in(sched)
    stdout, stderr = job.communicate(timeout=180)
    return subprocess.CompletedProcess(job.args, job.returncode, stdout, stderr)


def check_trained_run(run_dir: Path, output: str) -> None:
    for log in ("scheduler.log", "learner.log"):
        assert (run_dir / log).exists()
    run_dir = run_dir / "results"  # apex-dask-submit's --out (it refuses a folder holding files)
    results = [json.loads(x) for x in (run_dir / "results.jsonl").read_text().splitlines()]
    assert results and results[-1]["timesteps_total"] >= 3000, output
    assert results[-1]["learner/steps_trained"] > 0
    placement = json.loads((run_dir / "placement.json").read_text())
    assert placement["learner"]["name"] == "learner"  # the worker started with GPU=1
    assert placement["learner"]["resources"] == {"GPU": 1.0}
    assert all(w["name"] != "learner" for w in placement["env_workers"])
    assert (run_dir / "weights.npz").stat().st_size > 0


@pytest.mark.slow
def test_pbs_script_starts_env_workers_with_pbsdsh_trains_and_tears_down(tmp_path):
    """The default launch: TLS required with credentials made for the run (pbsdsh tasks get
    the settings in their env); while it runs, only a client with them gets in."""
    marker, state = uuid.uuid4().hex, tmp_path / "state"
    env = job_env(marker, state)
    script = ROOT / "cluster" / "pbs" / "apex.pbs"
    settings = (
        "APEX_PRESET=cartpole,APEX_WORKERS_PER_NODE=1,APEX_DASHBOARD=:0,APEX_ARGS="
        + " ".join(PROBED_ARGS)
    )
    try:
        proc = submit_and_probe(
            ["qsub", "-W", "block=true", "-v", settings, str(script)], tmp_path, env
        )
        (submit,) = calls(state, "qsub")
        job_id = submit["job_id"]
        seq = job_id.split(".")[0]
        output = proc.stdout + (tmp_path / f"apex.o{seq}").read_text()
        assert proc.returncode == 0, output
        # One pbsdsh task per CPU host, each at that host's first line of the node
        # file, with an absolute program and the (already written) scheduler file.
        vnodes = Path(submit["nodefile"]).read_text().split()
        hosts = list(dict.fromkeys(vnodes))
        assert len(hosts) == 3
        tasks = calls(state, "pbsdsh")
        assert sorted(t["targets"][0] for t in tasks) == hosts[1:]
        run_dir = tmp_path / f"apex-{seq}"
        for task in tasks:
            index = int(task["argv"][task["argv"].index("-n") + 1])
            assert vnodes[index] == task["targets"][0] and vnodes.index(vnodes[index]) == index
            assert os.path.isabs(task["command"][0])
            assert "--protocol" in task["command"]  # TLS settings travel in the task's env
            key = run_dir / "tls" / "key.pem"
            assert f"DASK_DISTRIBUTED__COMM__TLS__WORKER__KEY={key}" in task["argv"]
            assert "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION=True" in task["argv"]
            assert str(run_dir / "scheduler.json") in task["existing_paths"]
        assert "3 of 3 workers joined; GPU workers ['learner']" in output
        check_trained_run(run_dir, output)
        check_tls_scheduler(run_dir, host=r"[^:\s]+")  # no APEX_INTERFACE: the default one
        assert_private_credentials(run_dir / "tls")
        assert "TLS required; this run's credentials are in" in output
    finally:
        assert_nothing_left(marker)


@pytest.mark.parametrize(
    ("script", "message"),
    [
        ("slurm/apex.sbatch", "apex.sbatch: run me with sbatch (no SLURM_JOB_ID)"),
        ("pbs/apex.pbs", "apex.pbs: run me with qsub (no PBS_NODEFILE)"),
    ],
)
def test_job_script_outside_a_job_says_how_to_submit_it(tmp_path, script, message):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PBS_"))}
    proc = subprocess.run(
        ["bash", str(ROOT / "cluster" / script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [message]
    assert list(tmp_path.iterdir()) == []
