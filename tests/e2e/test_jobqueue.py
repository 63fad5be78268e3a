"""``--cluster slurm|pbs``: the dask-jobqueue glue in apex_dask.cli.jobqueue.

Offline: the rendered job scripts (GPU request and GPU resource on the learner
job only), option parsing and the one-line error without ``sbatch``/``qsub``.
Live, PBS: a real PBSCluster whose jobs the ``tests/e2e/shims`` stand-ins run as
local processes -- the learner job joins with the GPU resource, the scheduler
serves the Ape-X page (the preload ran), and ``close()`` cancels every job
(no process outlives it). SLURM runs against a real slurmctld instead
(``test_slurm.py``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from proctrack import MARK, processes_marked
from tlsprobe import assert_outsiders_refused, assert_private_credentials

from apex_dask.cli.jobqueue import (
    LEARNER_JOB_NAME,
    PRELOAD_MODULE,
    JobqueueError,
    jobqueue_job_scripts,
    make_jobqueue_cluster,
    parse_jobqueue_opts,
    wait_for_jobqueue_workers,
)
from apex_dask.config import ApexConfig

SHIMS = Path(__file__).resolve().parent / "shims"
BIN = Path(sys.executable).parent
SMALL = {"cores": 2, "memory": "2GB", "learner_cores": 1, "learner_memory": "2GB"}


# --------------------------------------------------------------------------- offline
@pytest.mark.parametrize(
    ("kind", "gpu_request", "prefix"),
    [("slurm", "#SBATCH --gres=gpu:1", "#SBATCH"), ("pbs", ":ngpus=1:", "#PBS")],
)
def test_only_the_learner_job_requests_a_gpu_and_advertises_it(kind, gpu_request, prefix):
    scripts = jobqueue_job_scripts(
        kind, 3, ApexConfig.preset("cartpole"), queue="cpu", learner_queue="gpu", **SMALL
    )
    learner, env = scripts["learner"], scripts["env"]
    assert gpu_request in learner and gpu_request not in env
    assert "--resources GPU=1" in learner and "--resources" not in env
    assert f"--name {LEARNER_JOB_NAME}" in learner
    assert f"{prefix} -q gpu" in learner or f"{prefix} -p gpu" in learner
    assert f"{prefix} -q cpu" in env or f"{prefix} -p cpu" in env
    assert "--nworkers 2 " in env and "--nthreads 1 " in env  # one thread per env-worker process
    for script in (learner, env):
        assert "--death-timeout 120" in script  # jobs end when the driver's scheduler is gone


def test_gpus_zero_makes_a_cpu_learner_job():
    learner = jobqueue_job_scripts("slurm", 1, gpus=0, **SMALL)["learner"]
    assert "gres" not in learner and "--resources" not in learner


def test_options_parse_with_types_and_repeated_list_keys():
    opts = parse_jobqueue_opts(
        ["cores=16", "queue=short", "prologue=module load cuda", "prologue=source env/bin/activate"]
        + ["processes=none", "death-timeout-s=30"]
    )
    assert opts == {
        "cores": 16,
        "queue": "short",
        "prologue": ("module load cuda", "source env/bin/activate"),
        "processes": None,
        "death_timeout_s": 30.0,
    }
    script = jobqueue_job_scripts("slurm", 1, **opts)["env"]
    assert "module load cuda\nsource env/bin/activate\n" in script


def test_lifetime_and_its_stagger_reach_only_the_env_worker_jobs():
    opts = parse_jobqueue_opts(["lifetime=50m", "lifetime-stagger=5m"])
    scripts = jobqueue_job_scripts("slurm", 1, **opts, **SMALL)
    assert "--lifetime 50m --lifetime-stagger 5m" in scripts["env"]
    assert "--lifetime" not in scripts["learner"]


@pytest.mark.parametrize(
    ("pairs", "needle"),
    [
        (["partition=gpu"], "unknown jobqueue option 'partition'"),
        (["cores=many"], "cores='many' must be an integer"),
        (["cores"], "must look like key=value"),
        (["processes=9", "cores=8"], "processes=9 must be between 1 and cores (8)"),
        (["lifetime=soon"], "lifetime='soon' must be a positive duration such as 50m"),
        (["lifetime_stagger=5m"], "lifetime_stagger='5m' needs lifetime"),
        (["lifetime=5m", "lifetime_stagger=10m"], "must be shorter than lifetime='5m'"),
    ],
)
def test_bad_options_are_one_line_errors(pairs, needle):
    with pytest.raises(JobqueueError) as info:
        jobqueue_job_scripts("slurm", 1, **parse_jobqueue_opts(pairs))
    assert needle in str(info.value) and "\n" not in str(info.value)


@pytest.mark.parametrize(("kind", "binary"), [("slurm", "sbatch"), ("pbs", "qsub")])
def test_missing_submit_command_is_a_one_line_error_before_anything_starts(
    kind, binary, tmp_path, monkeypatch
):
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty folder: no batch system here
    started = time.monotonic()
    with pytest.raises(JobqueueError) as info:
        make_jobqueue_cluster(kind, 2, ApexConfig.preset("cartpole"))
    message = str(info.value)
    assert message.startswith(f"{binary} not found on PATH: --cluster {kind} submits")
    assert "\n" not in message
    assert time.monotonic() - started < 2  # raised before a scheduler was started


def test_cli_reports_missing_sbatch_in_one_line(tmp_path):
    # PATH is an empty folder: sbatch is missing whether or not the machine has SLURM (even
    # where this Python lives in /usr/bin beside it).
    (tmp_path / "empty").mkdir()
    env = dict(os.environ, PATH=str(tmp_path / "empty"))
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "apex_dask",
            "--cluster",
            "slurm",
            "--jobs",
            "2",
            "--preset",
            "cartpole",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("apex-dask-submit: error: sbatch not found on PATH")


# --------------------------------------------------------------------------- live, shimmed


def kill_shim_jobs(state: Path) -> None:
    for pid_file in (state / "jobs").glob("*.pid"):
        try:
            os.killpg(int(pid_file.read_text()), signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def shimmed_batch_system(tmp_path, monkeypatch):
    """qsub/qdel stand-ins first on PATH; yields (state folder, marker)."""
    marker, state = uuid.uuid4().hex, tmp_path / "state"
    monkeypatch.setenv("PATH", os.pathsep.join([str(SHIMS), str(BIN), os.environ["PATH"]]))
    monkeypatch.setenv("APEX_SHIM_STATE", str(state))
    monkeypatch.setenv(MARK, marker)  # inherited by the shims and every job they start
    monkeypatch.chdir(tmp_path)  # qsub writes the job's output to the submit folder
    yield state, marker
    deadline = time.monotonic() + 5
    while (left := processes_marked(marker)) and time.monotonic() < deadline:
        time.sleep(0.2)
    kill_shim_jobs(state)
    assert not left, [" ".join(p.cmdline())[:160] for p in left]


@pytest.mark.slow
def test_jobqueue_cluster_runs_gpu_learner_job_with_preloaded_scheduler_and_cancels_jobs(
    shimmed_batch_system,
):
    from apex_dask.runtime.preload import page_available

    kind, submit, cancel, gpu_request = "pbs", "qsub", "qdel", ":ngpus=1:"
    state, _ = shimmed_batch_system
    cluster = make_jobqueue_cluster(
        kind, 1, ApexConfig.preset("cartpole"), dashboard_address=":0", **SMALL
    )
    try:
        assert cluster.scheduler_spec["options"]["preload"] == [PRELOAD_MODULE]
        assert len(cluster.plan) == 3  # the learner job + one job of 2 worker processes
        wait_for_jobqueue_workers(cluster, timeout_s=90)
        workers = {w["name"]: w for w in cluster.scheduler_info["workers"].values()}
        assert workers[LEARNER_JOB_NAME]["resources"] == {"GPU": 1.0}
        others = [w for name, w in workers.items() if name != LEARNER_JOB_NAME]
        assert len(others) == 2 and all(not w.get("resources") for w in others)
        assert page_available(cluster.scheduler)  # the preload registered /apex
        # TLS by default, with credentials made for the run: outsiders are refused.
        (tls,) = Path.cwd().glob("apex-tls-*")
        assert_private_credentials(tls)
        assert_outsiders_refused(cluster.scheduler_address)
        # What the batch system received: two scripts, only the learner's asks for a GPU.
        scripts = [p.read_text() for p in sorted((state / "jobs").glob("*.script"))]
        assert len(scripts) == 2
        (learner_script,) = [t for t in scripts if "--resources GPU=1" in t]
        assert gpu_request in learner_script
        assert all(gpu_request not in t for t in scripts if t is not learner_script)
    finally:
        cluster.close()
    records = [json.loads(x) for x in (state / "calls.jsonl").read_text().splitlines()]
    submitted = [str(c["job_id"]).split(".")[0] for c in records if c["tool"] == submit]
    cancelled = [c["argv"][0] for c in records if c["tool"] == cancel]
    assert len(submitted) == 2 and sorted(cancelled) == sorted(submitted)


@pytest.mark.parametrize("kind", ["slurm", "pbs"])
def test_tls_and_interface_reach_every_job_script(kind, tmp_path):
    files = {name: str(tmp_path / f"{name}.pem") for name in ("ca", "cert", "key")}
    for path in files.values():
        Path(path).write_text("PEM")  # rendered offline: nothing reads them
    scripts = jobqueue_job_scripts(
        kind, 2, None, interface="ib0", tls_ca_file=files["ca"], tls_cert=files["cert"],
        tls_key=files["key"], **SMALL,
    )  # fmt: skip
    for script in scripts.values():
        assert "--interface ib0" in script and "--protocol tls://" in script
        assert f"--tls-ca-file {files['ca']}" in script
        assert f"--tls-cert {files['cert']}" in script and f"--tls-key {files['key']}" in script


def test_tls_options_go_together():
    with pytest.raises(JobqueueError, match="go together") as err:
        jobqueue_job_scripts("slurm", 1, None, tls_ca_file="ca.pem", **SMALL)
    assert "\n" not in str(err.value)


def test_scripts_require_tls_by_default_with_the_run_credentials(tmp_path):
    scripts = jobqueue_job_scripts("slurm", 1, None, tls_dir=str(tmp_path / "tls"), **SMALL)
    for script in scripts.values():
        assert "--protocol tls://" in script
        assert f"--tls-ca-file {tmp_path / 'tls' / 'ca.pem'}" in script
    assert not (tmp_path / "tls").exists()  # rendered offline: nothing made


def test_tls_off_gives_plain_tcp_with_one_warning_line(tmp_path, capsys, monkeypatch):
    from apex_dask.cli.jobqueue_options import options_from, with_run_tls

    monkeypatch.setenv("APEX_TLS", "off")
    o = with_run_tls(options_from({"tls_dir": str(tmp_path / "tls")}), make=True)
    assert o.tls_ca_file is None and not (tmp_path / "tls").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and "open to anyone who can reach its nodes" in lines[0]
    scripts = jobqueue_job_scripts("pbs", 1, None, **SMALL)
    assert all("tls" not in script for script in scripts.values())
    with pytest.raises(JobqueueError, match="tls=off and tls_"):
        jobqueue_job_scripts("slurm", 1, None, tls="off", tls_ca_file="a", tls_cert="b",
                             tls_key="c", **SMALL)  # fmt: skip
