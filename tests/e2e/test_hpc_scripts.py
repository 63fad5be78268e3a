"""cluster/slurm/apex.sbatch and cluster/pbs/apex.pbs, run for real on this machine.

The stand-ins in ``tests/e2e/shims`` (``sbatch``, ``srun``, ``scancel``,
``qsub``, ``qdel``, ``pbsdsh``) come first on PATH and run each job, step and
task as local processes with the variables the batch system would set, so
the scripts' launch order, scheduler-file hand-off, worker placement and
teardown all execute; only the spread over separate nodes is simulated (fake
host names). Every process started inherits a unique ``APEX_E2E_MARKER``;
none may outlive the job.
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

from apex_dask.runtime.credentials import make_run_credentials

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


def tls_files(folder: Path) -> dict[str, str]:
    """The user's own CA and certificate (made elsewhere), as the APEX_TLS_* variables."""
    creds = make_run_credentials(folder)
    return {
        "APEX_TLS_CA_FILE": str(creds.ca_file),
        "APEX_TLS_CERT": str(creds.cert_file),
        "APEX_TLS_KEY": str(creds.key_file),
    }


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
def test_slurm_hetjob_script_launches_in_order_trains_and_tears_down(tmp_path):
    """The default launch: TLS required with credentials made for the run, on the interface
    named by APEX_INTERFACE (lo here); while it runs, only a client with them gets in."""
    marker, state = uuid.uuid4().hex, tmp_path / "state"
    env = job_env(marker, state, APEX_PRESET="cartpole", APEX_WORKERS_PER_NODE="1")
    env.update(APEX_INTERFACE="lo", APEX_DASHBOARD=":0")
    script = ROOT / "cluster" / "slurm" / "apex.sbatch"
    try:
        proc = submit_and_probe(["sbatch", "--wait", str(script), *PROBED_ARGS], tmp_path, env)
        (submit,) = calls(state, "sbatch")
        job_id = submit["job_id"]
        output = proc.stdout + (tmp_path / f"apex-{job_id}.out").read_text()
        assert proc.returncode == 0, output
        assert proc.stdout.strip() == f"Submitted batch job {job_id}"
        # The script's directives: a GPU component, then CPU nodes.
        gpu_part, cpu_part = submit["components"]
        assert gpu_part["gres"] == "gpu:1" and gpu_part["nodes"] == 1
        assert cpu_part["gres"] is None and cpu_part["nodes"] == 2
        # The learner step runs on component 0 and advertises the GPU; the env-worker
        # step covers component 1's nodes; both come after the scheduler file exists.
        steps = calls(state, "srun")  # started together: their records may come in any order
        assert sorted(step["group"] for step in steps) == ["0", "1"]
        learner_step, env_step = sorted(steps, key=lambda step: step["group"])
        assert learner_step["ntasks"] == 1
        cmd = learner_step["command"]
        assert cmd[1] == "worker" and cmd[cmd.index("--resources") + 1] == "GPU=1"
        assert cmd[cmd.index("--name") + 1] == "learner"
        assert env_step["ntasks"] == 2
        assert "--resources" not in env_step["command"]
        for step in (learner_step, env_step):  # interface and TLS reach every worker
            c = step["command"]
            assert c[c.index("--interface") + 1] == "lo" and c[c.index("--protocol") + 1] == "tls"
        run_dir = tmp_path / f"apex-{job_id}"
        sched_file = str(run_dir / "scheduler.json")
        assert cmd[cmd.index("--scheduler-file") + 1] == sched_file
        assert sched_file in learner_step["existing_paths"]
        assert sched_file in env_step["existing_paths"]
        assert "3 of 3 workers joined; GPU workers ['learner']" in output
        check_trained_run(run_dir, output)
        check_tls_scheduler(run_dir)
        assert_private_credentials(run_dir / "tls")
        assert "TLS required; this run's credentials are in" in output
        assert "ssh -N -L " in output  # how to reach the dashboard from outside
        assert "stopping the Dask cluster" in output
    finally:
        assert_nothing_left(marker)


@pytest.mark.slow
def test_slurm_usr1_checkpoints_requeues_and_the_requeued_job_resumes(tmp_path):
    """SLURM's ``--signal=B:USR1@120`` reaches the batch shell: the driver writes a
    checkpoint and exits 75, the script requeues the job (the ``scontrol`` stand-in
    runs it again with the same id), and the requeued job resumes its run folder. With the
    user's own TLS files, which win over per-run credentials in both instances."""
    import signal
    import threading
    import time

    marker, state = uuid.uuid4().hex, tmp_path / "state"
    env = job_env(marker, state, APEX_PRESET="cartpole", APEX_WORKERS_PER_NODE="1")
    env.update(tls_files(tmp_path / "tls"), APEX_DASHBOARD=":0")
    script = ROOT / "cluster" / "slurm" / "apex.sbatch"
    args = ["--stop-timesteps", "6000", "--set", "report.min_iter_time_s=1", "--quiet"]
    done: dict = {}

    def submit() -> None:
        done["proc"] = subprocess.run(
            ["sbatch", "--wait", str(script), *args],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip

    thread = threading.Thread(target=submit)
    thread.start()
    try:
        deadline = time.monotonic() + 180
        results = None
        while results is None or not results.exists() or not results.read_text().strip():
            assert time.monotonic() < deadline and thread.is_alive(), done
            time.sleep(0.5)
            found = list(tmp_path.glob("apex-*/results/results.jsonl"))
            results = found[0] if found else None
        (submit_call,) = calls(state, "sbatch")
        job_id = submit_call["job_id"]
        shell = int((state / "jobs" / f"{job_id}.pid").read_text())
        os.kill(shell, signal.SIGUSR1)  # what --signal=B:USR1 sends: the batch shell only
        thread.join(timeout=300)
        proc = done["proc"]
        output = proc.stdout + (tmp_path / f"apex-{job_id}.out").read_text()
        assert proc.returncode == 0, output[-3000:]
        assert [c["argv"] for c in calls(state, "scontrol")] == [["requeue", str(job_id)]]
        (requeued,) = calls(state, "requeued")
        assert requeued["exit_code"] == 75  # preempted, with a checkpoint
        assert "preempted with a checkpoint; requeueing job" in output
        assert "resuming the run in" in output
        lines = [json.loads(x) for x in results.read_text().splitlines()]
        iterations = [int(r["iteration"]) for r in lines]
        assert iterations == sorted(set(iterations)), iterations  # continued, not restarted
        assert lines[-1]["timesteps_total"] >= 6000
        resumes = (results.parent / "resumes.jsonl").read_text().splitlines()
        assert len(resumes) == 1
        assert output.count("TLS required, with your credentials") == 2  # each instance
        assert not (results.parent.parent / "tls").exists()  # no per-run files beside them
    finally:
        thread.join(timeout=5)
        assert_nothing_left(marker)


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
