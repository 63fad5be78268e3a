"""cluster/slurm/apex.sbatch and ``apex-dask-submit --cluster slurm`` against a real SLURM.

The site (``slurmsite.py``, ``cluster/slurm_site.sh``): slurmctld and munged here,
one slurmd per node in its own network namespace -- gpu1 (partition ``gpu``,
GRES ``gpu``), cpu1 and cpu2 (partition ``cpu``) -- 2 CPUs and 4000 MB each, a
12-hour partition limit, a requeue hold of 6 s (``AuthInfo=cred_expire=5``).

* The heterogeneous job as shipped (only its ``#SBATCH`` sizes and time scaled
  down, in a copy, as a user would): SLURM's ``--signal=B:USR1@40`` before the
  2-minute limit preempts it twice -- checkpoint, exit 75, requeue, resume --
  then a plain ``scancel`` (SIGTERM to every process of the job, SIGKILL
  ``KillWait`` = 10 s later) still leaves a committed checkpoint (the driver
  exits 75; the cancelled job is not requeued) and stops every process on every
  node, and a resubmitted job resumes that checkpoint and trains CartPole to 475
  with the learner on gpu1 and the env workers on cpu1/cpu2. One log holds
  every instance.
* A replay too big for ``checkpoint.grace_s=8`` (``tests/bulky_envs.py``):
  ``scancel --signal=TERM`` (the job's steps only) reaches the driver through the
  shielded workers, which ends inside the grace with a checkpoint of the newest
  items that fit and exits 75 (the job ends: only USR1 requeues it); the job
  resubmitted on the same run folder resumes that checkpoint; a plain
  ``scancel`` then does the same within ``KillWait``.
* ``--cluster slurm`` waits (showing why) for jobs queued behind another one,
  trains to 475 and leaves no job; requests SLURM can never start end in one
  line within seconds; SIGTERM cancels every job it submitted.
* ``--adapt 2:2`` with ``--jobqueue-opt lifetime=40s``: env-worker jobs retire
  themselves, hand their env workers over, and adapt submits new ones that get
  env workers; training goes on with no fault and no job is left.

A requeued heterogeneous job is started only by the backfill scheduler, which
runs when something changed; on this otherwise idle site the test, as the site
admin, pokes it (``scontrol update StartTime=now``) once the hold is over.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
import slurmsite
from proctrack import MARK, assert_nothing_left
from seconduser import assert_kept_out, second_user
from tlsprobe import assert_private_credentials, http_get

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "runtime"))
from polling import poll  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
_REASON = slurmsite.unavailable()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(_REASON is not None, reason=str(_REASON))]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    missing = slurmsite.missing_tools()
    if missing:  # root and namespaces are here: the suite is meant to run these
        pytest.fail(f"SLURM tools missing ({', '.join(missing)}): apt-get install slurm-wlm munge")
    try:
        s = slurmsite.SlurmSite(tmp_path_factory.mktemp("slurm-site"))
    except RuntimeError as first:  # a site whose nodes never reached its controller: once more,
        print(first)  # on a new subnet (its own reason is in the output above)
        s = slurmsite.SlurmSite(tmp_path_factory.mktemp("slurm-site"))
    try:
        yield s
    finally:
        s.stop()


def scaled_copy(dest: Path, time_limit: str) -> Path:
    """apex.sbatch with only its #SBATCH time, signal and sizes edited for this site."""
    text = (ROOT / "cluster" / "slurm" / "apex.sbatch").read_text()
    edits = [
        ("--time=04:00:00", f"--time={time_limit}"),
        # slurmctld checks every 30 s and signals once fewer than 40 + 30 s are left: USR1
        # comes 50-80 s into the 2 minutes (after start-up), at least 40 s before the end.
        ("--signal=B:USR1@120", "--signal=B:USR1@40"),
        ("--cpus-per-task=8", "--cpus-per-task=2"),
        ("--cpus-per-task=32", "--cpus-per-task=1"),
        # The GPU node: scheduler, learner (SLURM's RLIMIT_RSS is Dask's memory limit), driver.
        ("--mem=64G", "--mem=3G"),
        # Each CPU node: its env workers hold torch and bulky_envs' rollouts (~450 MB each);
        # at 1G (512 MiB a worker) a loaded machine took one past the nanny's 95%.
        ("--mem=64G", "--mem=2G"),
    ]
    for old, new in edits:
        assert f"#SBATCH {old}\n" in text, old
        text = text.replace(f"#SBATCH {old}\n", f"#SBATCH {new}\n", 1)
    dest.write_text(text)
    return dest


def submit(site, script: Path, cwd: Path, env: dict[str, str], *args: str) -> str:
    proc = subprocess.run(["sbatch", "--parsable", str(script), *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=30)  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return proc.stdout.strip().split(";")[0].split("+")[0]


ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "BOOT_FAIL"}


def follow(site, job_id: str, log: Path, until, timeout_s: float) -> str:
    """Poll the job's log until ``until(text)``; poke a requeued job once its hold is over."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = log.read_text() if log.exists() else ""
        if until(text):
            return text
        info = site.job(job_id)
        if info.get("JobState") == "PENDING" and info.get("Reason") != "BeginTime":
            site.run("scontrol", "update", f"JobId={job_id}", "StartTime=now")
        state = info.get("JobState")
        assert state not in ENDED, f"job {job_id} {state} ({info}); its log ends:\n{text[-4000:]}"
        assert time.monotonic() < deadline, text[-3000:]
        time.sleep(1)


def results(out: Path) -> list[dict]:
    path = out / "results.jsonl"
    return [json.loads(x) for x in path.read_text().splitlines()] if path.exists() else []


@pytest.mark.timeout(600)
def test_hetjob_is_preempted_twice_survives_scancel_and_resumes_to_475_on_its_nodes(site, tmp_path):
    marker = uuid.uuid4().hex
    env = site.env(APEX_PRESET="cartpole", **{MARK: marker})
    # No reward stop for the preempted job: it must still be training when preempted.
    args = ["--stop-time", "400", "--no-tensorboard"]
    args += ["--set", "checkpoint.grace_s=20", "--set", "report.min_iter_time_s=2"]
    try:
        job = submit(site, scaled_copy(tmp_path / "apex.sbatch", "00:02:00"), tmp_path, env, *args)
        log, run = tmp_path / f"apex-{job}.out", tmp_path / f"apex-{job}"

        def preempted_twice_then_resumed(text: str) -> bool:
            """Two checkpoints written on USR1, and a later instance resumed the second one
            and trained past it (an instance stopped before training requeues without one)."""
            paths = re.findall(r"\(SIGUSR1\); checkpoint (\S+)", text)
            if len(paths) < 2 or f"resumed from {paths[1]}" not in text:
                return False
            done = checkpointed(paths[1])
            return any(r["timesteps_total"] > done for r in results(run / "results"))

        text = follow(site, job, log, preempted_twice_then_resumed, 420)
        last = text.count("apex-dask-submit: preempted (")
        assert site.run("scancel", job).returncode == 0  # SIGTERM, SIGKILL 10 s later
        assert_nothing_left(marker, grace_s=40, what="scancel, on any node")
        poll(lambda: not site.jobs(), 30)
        text = log.read_text()
        # The driver saved before the SIGKILL; the job was not requeued (only USR1 does).
        cancelled = re.findall(r"apex-dask-submit: preempted \(SIGTERM\); checkpoint (\S+)", text)
        assert text.count("apex-dask-submit: preempted (") == last + 1 and cancelled, text[-3000:]
        assert "apex.sbatch: the driver exited 75" in text.split(cancelled[-1])[-1]
        assert "apex.sbatch: stopped by SIGTERM with a checkpoint; not requeued" in text
        # One log for every instance (--open-mode=append), each line marked with its restart.
        assert [f"[restart {k}]" in text for k in range(3)] == [True] * 3, text[-3000:]
        assert not [
            ln for ln in text.splitlines() if ln and not ln.startswith(("[restart ", "slurmstepd"))
        ]
        written = re.findall(
            r"\[restart (\d)\] apex-dask-submit: preempted \(SIGUSR1\); checkpoint (\S+)", text
        )
        resumed = re.findall(r"\[restart (\d)\] apex-dask-submit: resumed from (\S+)", text)
        assert len(written) >= 2, text[-3000:]
        base = checkpointed(written[-1][1])  # read now: later checkpoints may prune it
        before = len(results(run / "results"))  # lines of the first job's three instances
        for k, path in written:  # a later instance resumed from each checkpoint written
            assert any(int(j) > int(k) and p == path for j, p in resumed), (written, resumed)

        # The same run folder, resubmitted with a longer limit: it resumes and trains to 475.
        again = scaled_copy(tmp_path / "apex-longer.sbatch", "00:10:00")
        proc = subprocess.run(
            ["sbatch", "--parsable", "--wait", str(again), *args, "--stop-eval-return", "475"], cwd=tmp_path,
            env=dict(env, APEX_RUN_DIR=str(run)), capture_output=True, text=True, timeout=400,
        )  # fmt: skip
        second = tmp_path / f"apex-{proc.stdout.split()[0].split(';')[0]}.out"
        assert proc.returncode == 0, second.read_text()[-3000:]
        assert "[restart 0] apex.sbatch: resuming the run in" in second.read_text()
        assert f"apex-dask-submit: resumed from {cancelled[-1]}" in second.read_text()
    finally:
        assert_nothing_left(marker, what="the jobs")
    out = run / "results"
    lines = results(out)
    final = json.loads((out / "final.json").read_text())
    assert final["eval/return_mean"] >= 475, final.get("eval/return_mean")
    assert len((out / "resumes.jsonl").read_text().splitlines()) >= 3
    # Counters and replay continue across both requeues: they never fall. The resubmitted
    # job resumes the last checkpoint (the cancelled instance's lines after it are left
    # behind) and continues from there, not from zero.
    assert before >= 3 and len(lines) > before, (before, len(lines))
    for key in ("iteration", "timesteps_total", "learner/steps_trained", "replay/size"):
        values = [r[key] for r in lines[:before] if key in r]
        assert len(values) >= 3 and values == sorted(values), (key, values)
        assert all(r[key] > 0 for r in lines[before:] if key in r), (key, lines[before:])
    assert all(r["timesteps_total"] > base for r in lines[before:]), (base, lines[before:])
    placement = json.loads((out / "placement.json").read_text())
    assert site.node_of(placement["learner"]["address"]) == "gpu1"
    assert placement["learner"]["resources"] == {"GPU": 1.0}
    env_nodes = {site.node_of(w["address"]) for w in placement["env_workers"]}
    assert env_nodes == {"cpu1", "cpu2"}, placement["env_workers"]
    assert re.search(r"Scheduler at:\s+tls://", (run / "scheduler.log").read_text())
    assert_private_credentials(run / "tls")


@pytest.mark.timeout(420)
def test_sbatch_job_keeps_a_second_user_out_and_its_dashboard_on_its_node(site, tmp_path):
    """The job as shipped: its scheduler on gpu1 requires the run's TLS credentials (a
    second local user on the login node is refused, as the scheduler's log says) and its
    dashboard listens on gpu1's loopback only, with the SSH tunnel in the job's log."""
    marker = uuid.uuid4().hex
    env = site.env(APEX_PRESET="cartpole", **{MARK: marker})
    script = scaled_copy(tmp_path / "apex.sbatch", "00:06:00")
    job = submit(site, script, tmp_path, env, "--stop-time", "300", "--no-tensorboard")
    log, run = tmp_path / f"apex-{job}.out", tmp_path / f"apex-{job}"
    try:
        text = follow(site, job, log, lambda t: "then open http://localhost:" in t, 300)
        info = json.loads((run / "scheduler.json").read_text())
        address, port = info["address"], info["services"]["dashboard"]
        assert address.startswith("tls://") and site.node_of(address) == "gpu1", address
        node = site.nodes["gpu1"]
        on_node = http_get(["ip", "netns", "exec", node["ns"]], f"http://127.0.0.1:{port}/apex")
        from_login = http_get([], f"http://{node['address']}:{port}/apex")
        assert on_node == "200" and "Connection refused" in from_login, (on_node, from_login)
        hint = f"ssh -N -L {port}:127.0.0.1:{port} -J <login-node> gpu1"
        assert hint in text, text[-2000:]
        with second_user() as other:
            got = other.outsider(address, run / "tls")
        assert_kept_out(got, scheduler_log=(run / "scheduler.log").read_text())
    finally:
        site.run("scancel", job)
        assert_nothing_left(marker, grace_s=40, what="scancel, on any node")
        poll(lambda: not site.jobs(), 30)


BULKY = [
    "--no-tensorboard", "--stop-time", "600", "--set", "env.env_id=bulky_envs:Bulky-v0",
    "--set", "env.env_kwargs.obs_dim=16384", "--set", "replay.capacity=4000",
    "--set", "replay.learning_starts=64", "--set", "learner.batch_size=8",
    "--set", "dqn.hiddens=[16]", "--set", "learner.min_replay_ratio=null",
    "--set", "learner.max_replay_ratio=null", "--set", "eval.episodes=0",
    "--set", "checkpoint.grace_s=8", "--set", "checkpoint.interval_s=0",
    "--set", "report.min_iter_time_s=2",
]  # fmt: skip


@pytest.mark.timeout(420)
def test_sigterm_to_the_steps_then_scancel_save_what_fits_in_the_grace_and_resume(site, tmp_path):
    marker = uuid.uuid4().hex
    tests = str(ROOT / "tests")  # bulky_envs, for the driver and (exported) every step
    env = site.env(APEX_PRESET="cartpole", PYTHONPATH=tests, **{MARK: marker})
    script = scaled_copy(tmp_path / "apex.sbatch", "00:10:00")
    jobs = [submit(site, script, tmp_path, env, *BULKY)]
    try:
        log, run = tmp_path / f"apex-{jobs[0]}.out", tmp_path / f"apex-{jobs[0]}"
        out = run / "results"

        # ~300 MB of replay, more than 8 s (KillWait - 2, the most a SIGTERM leaves on this
        # site) can write here: an unloaded stop with 4 s wrote about 400 items.
        def filled(text: str) -> bool:
            return bool(results(out)) and results(out)[-1]["replay/size"] >= 2400

        follow(site, jobs[0], log, filled, 240)
        sent = time.monotonic()
        assert site.run("scancel", "--signal=TERM", jobs[0]).returncode == 0  # the steps only
        text = follow(site, jobs[0], log, lambda t: "the driver exited" in t, 60)
        took = time.monotonic() - sent
        assert "the job's steps got SIGTERM (scancel --signal=TERM): passing SIGTERM on" in text
        first = stop_checkpoint(text, restart=0)
        assert took < 8 + 3, took  # the grace; the relay polls every 0.5 s, the log too
        left = json.loads((Path(first) / "manifest.json").read_text())["metadata"]["left_out"]
        assert left and 0 <= left["items_saved"] < left["items_held"], left
        poll(lambda: not site.jobs(), 60)  # the job ended with the driver's 75
        assert "stopped by SIGTERM with a checkpoint; not requeued" in log.read_text()
        ended = site.job(jobs[0])
        assert (ended.get("JobState"), ended.get("ExitCode")) == ("FAILED", "75:0"), ended

        # The same run folder, resubmitted: it resumes the partial checkpoint and trains on.
        jobs.append(submit(site, script, tmp_path, dict(env, APEX_RUN_DIR=str(run)), *BULKY))
        log = tmp_path / f"apex-{jobs[1]}.out"

        def resumed_and_trained(text: str) -> bool:
            return f"apex-dask-submit: resumed from {first}" in text and any(
                r["timesteps_total"] > checkpointed(first) for r in results(out)
            )

        text = follow(site, jobs[1], log, resumed_and_trained, 240)
        assert f"{Path(first).name} was written inside a stop's grace: {left['summary']}" in text
        assert site.run("scancel", jobs[1]).returncode == 0  # SIGTERM to all, SIGKILL 10 s later
        assert_nothing_left(marker, grace_s=40, what="scancel, on any node")
        poll(lambda: not site.jobs(), 30)
        # the resumed replay holds what the first stop kept and what came since: it may
        # fit in the grace whole this time
        second = stop_checkpoint(log.read_text(), restart=0, partial=False)
        assert second != first and checkpointed(second) > checkpointed(first)
    finally:
        for job in jobs:
            site.run("scancel", "--signal=KILL", job)
        assert_nothing_left(marker, what="the jobs")


def stop_checkpoint(text: str, restart: int, partial: bool = True) -> str:
    """The checkpoint instance ``restart`` wrote on SIGTERM, after checking it exited 75
    with it and that a note line says so exactly when it left part of the replay out.
    ``partial``: it must have left part out (False: whatever the grace allowed)."""
    mine = [ln for ln in text.splitlines() if ln.startswith(f"[restart {restart}] ")]
    found = [m for ln in mine if (m := re.search(r"preempted \(SIGTERM\); checkpoint (\S+)", ln))]
    assert found, "\n".join(mine[-30:])
    path = found[-1].group(1)
    assert any("apex.sbatch: the driver exited 75" in ln for ln in mine), mine[-10:]
    meta = json.loads((Path(path) / "manifest.json").read_text())["metadata"]
    assert meta["reason"] == "preempted", meta
    assert meta.get("left_out") or not partial, meta
    noted = any(f"note: checkpoint {Path(path).name} keeps what fit" in ln for ln in mine)
    assert noted == bool(meta.get("left_out")), (meta.get("left_out"), mine[-10:])
    return path


def checkpointed(path: str) -> int:
    """Timesteps counted in a checkpoint (its manifest's metadata)."""
    manifest = json.loads((Path(path) / "manifest.json").read_text())
    return int(manifest["metadata"]["timesteps_total"])


# --------------------------------------------------------------------------- --cluster slurm
def cli(
    site, tmp_path: Path, marker: str, *opts: str, extra: tuple[str, ...] = (), jobs: int = 1
) -> subprocess.Popen:
    argv = ["apex-dask-submit", "--cluster", "slurm", "--jobs", str(jobs), "--preset", "cartpole"]
    argv += [a for o in ("queue=cpu", "learner_queue=gpu", *opts) for a in ("--jobqueue-opt", o)]
    argv += ["--out", str(tmp_path / "run"), "--quiet", "--no-tensorboard", *extra]
    log = (tmp_path / "cli.log").open("w")
    return subprocess.Popen(argv, cwd=tmp_path, env=site.env(**{MARK: marker}), stdout=log,
                            stderr=subprocess.STDOUT, text=True)  # fmt: skip


def blocker(site) -> str:
    """A job holding both cpu nodes: the CLI's env-worker job queues behind it."""
    proc = site.run("sbatch", "--parsable", "-p", "cpu", "-N", "2", "--exclusive", "-o", "/dev/null",
                    "--wrap", "sleep 600")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    job = proc.stdout.strip()
    poll(lambda: any(j["id"] == job and j["state"] == "RUNNING" for j in site.jobs()), 30)
    return job


@pytest.mark.timeout(300)
def test_cli_waits_behind_a_queued_job_trains_to_475_and_leaves_no_job(site, tmp_path):
    marker = uuid.uuid4().hex
    held = blocker(site)
    proc = cli(site, tmp_path, marker, extra=("--stop-eval-return", "475", "--stop-time", "200"))
    try:
        text = lambda: (tmp_path / "cli.log").read_text()  # noqa: E731
        poll(lambda: "PENDING (Resources)" in text() or proc.poll() is not None, 60, 0.5)
        assert "PENDING (Resources)" in text(), text()  # the reason, on the progress line
        site.run("scancel", held)
        assert proc.wait(240) == 0, text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
        site.run("scancel", held)
    output = text()
    # Sizes from sinfo: a whole 2-CPU, 4000 MB node, memory in whole GiB below it.
    assert "an env-worker job: 2 cores, 3GiB (sinfo: nodes of partition cpu" in output
    final = json.loads((tmp_path / "run" / "final.json").read_text())
    assert final["eval/return_mean"] >= 475, output[-2000:]
    placement = json.loads((tmp_path / "run" / "placement.json").read_text())
    assert site.node_of(placement["learner"]["address"]) == "gpu1"
    assert {site.node_of(w["address"]) for w in placement["env_workers"]} <= {"cpu1", "cpu2"}
    assert_private_credentials(tmp_path / "run" / "tls")
    poll(lambda: not site.jobs(), 30)  # no job of it left in squeue
    assert_nothing_left(marker, grace_s=30, what="the CLI's jobs")


@pytest.mark.parametrize(
    ("opts", "message"),
    [
        (("cores=8",), r"SLURM refuses an env-worker job \(partition cpu: nodes of 2 CPUs, 4000 MB\): "
         r"Requested node configuration is not available; change --jobqueue-opt cores, memory"),
        (("walltime=24:00:00",), r"SLURM job \d+ \(an env-worker job, partition cpu\) can never start: "
         r"pending with reason PartitionTimeLimit; change --jobqueue-opt walltime or queue"),
    ],
    ids=["larger-than-any-node", "beyond-the-partition-time-limit"],
)  # fmt: skip
def test_cli_reports_a_job_slurm_can_never_start_in_one_line_within_seconds(
    site, tmp_path, opts, message
):
    marker = uuid.uuid4().hex
    started = time.monotonic()
    proc = cli(site, tmp_path, marker, *opts)
    assert proc.wait(60) == 2
    took = time.monotonic() - started
    output = (tmp_path / "cli.log").read_text().splitlines()
    errors = [ln for ln in output if ln.startswith("apex-dask-submit: error:")]
    assert len(errors) == 1 and re.search(message, errors[0]), errors
    assert took < 30, took  # seconds, not a wait for a job that never starts
    poll(lambda: not site.jobs(), 15)  # and the learner job it had submitted is cancelled
    assert_nothing_left(marker, what="the CLI")


def test_sigterm_cancels_every_job_the_cli_submitted(site, tmp_path):
    marker = uuid.uuid4().hex
    held = blocker(site)
    proc = cli(site, tmp_path, marker)
    try:
        ours = lambda: [j for j in site.jobs() if j["name"].startswith("apex-")]  # noqa: E731
        poll(lambda: len(ours()) == 2 and "PENDING" in (tmp_path / "cli.log").read_text(), 60, 0.5)
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(60)
        assert code in (143, 75), code
        poll(lambda: not ours(), 15)
    finally:
        if proc.poll() is None:
            proc.kill()
        site.run("scancel", held)
    assert_nothing_left(marker, what="the CLI and its jobs")


@pytest.mark.timeout(300)
def test_adapt_with_a_short_lifetime_cycles_env_worker_jobs_and_the_run_goes_on(site, tmp_path):
    """``--adapt 2:2`` and ``lifetime=40s``: each env-worker job's worker retires itself
    40 s after it starts and hands its env worker over, its job ends, and adapt submits a
    new one; a new job's worker gets an env worker; training goes on, with no fault.

    A 4-slot ladder: the two first jobs retire at about the same time, and while no other
    worker is left an env worker is made on the learner's (it stays there); the other
    slots are free for the new jobs' workers."""
    marker = uuid.uuid4().hex
    # One worker process per job (processes = cores = 1): adapt replaces an ended job only
    # when its one Dask worker is gone (Dask does not map grouped workers back to their job).
    opts = ("cores=1", "memory=1500MB", "lifetime=40s")
    proc = cli(
        site,
        tmp_path,
        marker,
        *opts,
        jobs=2,
        extra=("--adapt", "2:2", "--stop-time", "100", "--set", "workers.num_workers=4"),
    )
    seen: dict[str, set[str]] = {"apex-env": set(), "apex-learner": set()}

    def ended() -> bool:  # every job of the run, by name, as squeue shows them
        for job in site.jobs():
            seen.setdefault(job["name"], set()).add(job["id"])
        return proc.poll() is not None

    try:
        poll(ended, 250, 0.5)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = (tmp_path / "cli.log").read_text()
    assert proc.returncode == 0, output[-3000:]
    # Cycled: more env-worker jobs than adapt's maximum of 2, one learner job throughout.
    assert len(seen["apex-learner"]) == 1 and len(seen["apex-env"]) > 2, (seen, output[-3000:])
    assert "adapt: 2 to 2 env-worker jobs" in output
    lines = output.splitlines()
    at = lambda pattern: [i for i, ln in enumerate(lines) if re.search(pattern, ln)]  # noqa: E731
    retired = at(r"env worker \d+ retired with its leaving Dask worker")
    added = at(
        r"env worker \d+ \((?:epsilon|exploration) \S+\) added on Dask worker SLURMCluster-"
    )  # a job's
    assert retired and [i for i in added if i > retired[0]], output[-3000:]

    out = tmp_path / "run"
    rows = results(out)
    final = json.loads((out / "final.json").read_text())
    assert {k: v for k, v in final.items() if k.startswith("faults/") and v} == {}, final
    assert final["elastic/env_workers_retired"] >= 1 and final["elastic/env_workers_added"] >= 1

    # Training went on after a job's worker left (3 Dask workers, then fewer) and after
    # the new job's worker joined (3 again): the timesteps kept rising.
    workers = [r["workers/dask_workers"] for r in rows]
    left = next(i for i, n in enumerate(workers) if n < 3)
    back = next(i for i in range(left, len(rows)) if workers[i] == 3)
    steps = [r["timesteps_total"] for r in rows[left:]]
    assert steps == sorted(steps) and steps[-1] > steps[back - left] > steps[0], (workers, steps)
    placement = json.loads((out / "placement.json").read_text())
    assert site.node_of(placement["learner"]["address"]) == "gpu1"
    poll(lambda: not site.jobs(), 30)  # no job of it left in squeue
    assert_nothing_left(marker, grace_s=30, what="the CLI's jobs")
