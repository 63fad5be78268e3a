"""Batch-system clusters for ``apex-dask-submit --cluster slurm|pbs``.

One dask-jobqueue cluster object (``SLURMCluster`` or ``PBSCluster``) owns the
scheduler, which runs in the submitting process with the Ape-X dashboard
preloaded, and submits two kinds of batch jobs:

* one **learner job** (``apex-learner``): ``gpus`` GPUs requested from the
  batch system (SLURM ``--gres=gpu:G``; PBS ``select=1:ncpus=C:ngpus=G:mem=M``),
  and its Dask worker started with ``--resources GPU=G`` so the driver places
  the learner (and, by default, the replay shards) there;
* ``jobs`` **env-worker jobs**, CPU only, each running ``processes`` Dask
  worker processes with ``cores / processes`` threads each.

On SLURM, jobs with no ``cores``/``memory`` ask for a whole node of their
partition (``sinfo``), each job script is tried with ``sbatch --test-only``
before anything is submitted, and the wait for workers ends in one line when
a job pends for a reason that means it can never start
(:mod:`.jobqueue_slurm`). Every job submitted is cancelled on every way out
(``cluster.apex_jobs``, also at interpreter exit).

The learner job is an extra worker-spec entry with its own job options, put
first so scaling keeps it. Workers exit ``death_timeout_s`` after losing the
scheduler, so a crashed driver leaves no job holding nodes. TLS is required by
default, with credentials made for the run in ``tls_dir`` (or your ``tls_*``
files); ``tls="off"`` (or ``APEX_TLS=off``) gives plain TCP, with a warning.

Usage::

    cluster = make_jobqueue_cluster("slurm", jobs=4, config=cfg,
                                    queue="cpu", learner_queue="gpu", walltime="04:00:00")
    wait_for_jobqueue_workers(cluster, timeout_s=1800)
    client = Client(cluster, direct_to_workers=True)

Job scripts can be rendered without submitting anything::

    scripts = jobqueue_job_scripts("pbs", jobs=4, config=cfg, cores=32)
    print(scripts["learner"], scripts["env"])
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from apex_dask.cli import jobqueue_slurm as slurm
from apex_dask.cli.jobqueue_options import (
    JobqueueError,
    JobqueueOptions,
    options_from,
    parse_jobqueue_opts,
    with_run_tls,
)
from apex_dask.config import ApexConfig
from apex_dask.runtime.credentials import RunCredentials

__all__ = [
    "JobqueueError",
    "JobqueueOptions",
    "LEARNER_JOB_NAME",
    "PRELOAD_MODULE",
    "jobqueue_job_scripts",
    "make_jobqueue_cluster",
    "parse_jobqueue_opts",
    "wait_for_jobqueue_workers",
]

logger = logging.getLogger(__name__)

PRELOAD_MODULE = "apex_dask.runtime.preload"
"""Scheduler preload that registers the Ape-X dashboard page and metrics plugin."""

LEARNER_JOB_NAME = "apex-learner"
"""Worker-spec name (and Dask worker name) of the GPU learner job."""

_PLACEHOLDER_ADDRESS = "tcp://<scheduler-address>:8786"

FIXED_SIZES: dict[str, Any] = {
    "cores": 8,
    "memory": "16GB",
    "learner_cores": 4,
    "learner_memory": "32GB",
}
"""Job sizes where none is given and ``sinfo`` cannot say (PBS, scripts rendered offline)."""

_KINDS: dict[str, dict[str, str]] = {
    "slurm": {"submit": "sbatch", "cancel": "scancel", "system": "SLURM"},
    "pbs": {"submit": "qsub", "cancel": "qdel", "system": "PBS"},
}


def _job_classes(kind: str) -> tuple[type, type]:
    if kind not in _KINDS:
        raise JobqueueError(f"unknown cluster kind {kind!r}; choose one of: slurm, pbs")
    try:
        import dask_jobqueue  # extra: hpc
    except ImportError:
        raise JobqueueError(
            "--cluster needs dask-jobqueue: pip install 'apex_dask[hpc]' (or dask-jobqueue)"
        ) from None
    if kind == "slurm":
        return dask_jobqueue.SLURMCluster, dask_jobqueue.slurm.SLURMJob
    return dask_jobqueue.PBSCluster, dask_jobqueue.pbs.PBSJob


def _job_kwargs(kind: str, o: JobqueueOptions, learner: bool) -> dict[str, Any]:
    """Keyword arguments of one ``SLURMJob``/``PBSJob`` (learner or env-worker job)."""
    cores = o.learner_cores if learner else o.cores
    memory = o.learner_memory if learner else o.memory
    processes = o.learner_processes if learner else (o.processes or o.cores)
    directives = list(o.directives)
    worker_args: list[str] = []
    kw: dict[str, Any] = {
        "cores": cores,
        "memory": memory,
        "processes": processes,
        "queue": (o.learner_queue or o.queue) if learner else o.queue,
        "account": o.account,
        "walltime": o.walltime,
        "job_script_prologue": list(o.prologue),
        "death_timeout": o.death_timeout_s,
        "job_name": LEARNER_JOB_NAME if learner else "apex-env",
        "interface": o.interface,
    }
    if o.tls_ca_file:  # workers get --protocol tls:// and --tls-* flags
        files = (Path(o.tls_ca_file), Path(o.tls_cert or ""), Path(o.tls_key or ""))
        kw["protocol"], kw["security"] = "tls://", RunCredentials(*files).security()
    if learner:
        directives += list(o.learner_directives)
        if o.gpus > 0:
            worker_args += ["--resources", f"GPU={o.gpus}"]
            if kind == "slurm":
                directives.append(o.gpu_directive or f"--gres=gpu:{o.gpus}")
        if kind == "pbs":
            kw["resource_spec"] = o.learner_resource_spec or _pbs_select(cores, memory, o.gpus)
    else:
        if o.lifetime:
            worker_args += ["--lifetime", o.lifetime]
            if o.lifetime_stagger:
                worker_args += ["--lifetime-stagger", o.lifetime_stagger]
        if kind == "pbs" and o.resource_spec:
            kw["resource_spec"] = o.resource_spec
    kw["job_extra_directives"] = directives
    kw["worker_extra_args"] = worker_args
    if o.local_directory:
        kw["local_directory"] = o.local_directory
    if o.log_directory:
        kw["log_directory"] = o.log_directory
    if o.python:
        kw["python"] = o.python
    return kw


def _pbs_select(cores: int, memory: str, gpus: int) -> str:
    from dask.utils import parse_bytes
    from dask_jobqueue.pbs import pbs_format_bytes_ceil  # extra: hpc

    spec = f"select=1:ncpus={cores}"
    if gpus > 0:
        spec += f":ngpus={gpus}"
    return spec + ":mem=" + pbs_format_bytes_ceil(parse_bytes(memory))


def _sized(kind: str, o: JobqueueOptions, ask_sinfo: bool) -> tuple[JobqueueOptions, list[str]]:
    """``o`` with every size the user left unset: on SLURM (``ask_sinfo``) a whole node of
    the job's partition, the smallest ``sinfo`` lists; else :data:`FIXED_SIZES`. Also one
    note per kind of job sized from sinfo."""
    fill: dict[str, Any] = {}
    notes = []
    for role, cores, memory in (
        ("env", "cores", "memory"),
        ("learner", "learner_cores", "learner_memory"),
    ):
        if getattr(o, cores) is not None and getattr(o, memory) is not None:
            continue
        part = (o.learner_queue or o.queue) if role == "learner" else o.queue
        sizes = slurm.node_sizes(part) if ask_sinfo and kind == "slurm" else None
        if sizes is not None:
            fill[cores] = getattr(o, cores) or sizes[1]
            fill[memory] = getattr(o, memory) or slurm.memory_for(sizes[2])
            notes.append(
                f"{slurm.ROLE_NAMES[role]}: {fill[cores]} cores, {fill[memory]} (sinfo: nodes of "
                f"partition {sizes[0]} have {sizes[1]} CPUs, {sizes[2]} MB)"
            )
        else:
            fill[cores] = getattr(o, cores) or FIXED_SIZES[cores]
            fill[memory] = getattr(o, memory) or FIXED_SIZES[memory]
    return dataclasses.replace(o, **fill), notes


def _check_env_capacity(jobs: int, o: JobqueueOptions, config: ApexConfig | None) -> None:
    if config is None:
        return
    slots = jobs * (o.processes or o.cores)
    if slots < config.workers.num_workers:
        logger.warning(
            "%d env-worker jobs x %d processes = %d Dask workers for %d env worker actors: "
            "several actors will share a process (and its one actor thread)",
            jobs,
            o.processes or o.cores,
            slots,
            config.workers.num_workers,
        )


def jobqueue_job_scripts(
    kind: str, jobs: int, config: ApexConfig | None = None, **opts: Any
) -> dict[str, str]:
    """The batch scripts ``make_jobqueue_cluster`` would submit, rendered offline.

    Returns ``{"learner": script, "env": script}``; the scheduler address is a
    placeholder. Needs no ``sbatch``/``qsub`` and starts nothing.
    """
    o, _ = _sized(kind, with_run_tls(options_from(opts), make=False), ask_sinfo=False)
    _, job_cls = _job_classes(kind)
    _check_jobs(jobs)
    out = {}
    for role, learner in (("learner", True), ("env", False)):
        name = LEARNER_JOB_NAME if learner else "apex-env-0"
        kw = _job_kwargs(kind, o, learner)
        out[role] = job_cls(_PLACEHOLDER_ADDRESS, name=name, **kw).job_script()
    return out


def _check_jobs(jobs: int) -> None:
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise JobqueueError(f"--jobs {jobs!r} must be an integer >= 1 (env-worker jobs)")


class SubmittedJobs:
    """Every batch job a cluster submitted, by id (``"learner"`` or ``"env"``); cancelled
    on every way out: ``cancel()`` from the close path, and at interpreter exit."""

    def __init__(self, kind: str) -> None:
        self.kind = kind
        self.roles: dict[str, str] = {}
        self.cancelled = False

    def job_class(self, base: type) -> type:
        """``base`` (SLURMJob/PBSJob) recording each job id as soon as it is submitted."""
        jobs = self

        class Tracked(base):  # type: ignore[misc, valid-type]
            def _job_id_from_submit_output(self, out: str) -> str:
                job_id = super()._job_id_from_submit_output(out)
                jobs.roles[str(job_id)] = "learner" if self.name == LEARNER_JOB_NAME else "env"
                if jobs.cancelled:  # submitted while the run was ending
                    jobs._cancel([str(job_id)])
                return job_id

        Tracked.__name__ = Tracked.__qualname__ = f"Tracked{base.__name__}"
        return Tracked

    def cancel(self) -> None:
        """Cancel every job submitted so far (ended ones are ignored); idempotent."""
        self.cancelled = True
        self._cancel(list(self.roles))

    def _cancel(self, ids: list[str]) -> None:
        if self.kind == "slurm":
            slurm.cancel_jobs(ids)
        elif ids and shutil.which("qdel"):
            try:
                subprocess.run(["qdel", *ids], capture_output=True, timeout=30, check=False)
            except (OSError, subprocess.SubprocessError):
                pass


def make_jobqueue_cluster(
    kind: str,
    jobs: int,
    config: ApexConfig | None = None,
    say: Callable[[str], None] | None = None,
    **opts: Any,
) -> Any:
    """Start a scheduler here and submit one GPU learner job plus ``jobs`` env-worker jobs.

    ``kind`` is ``"slurm"`` or ``"pbs"``; ``opts`` are :class:`JobqueueOptions`
    fields. Returns the dask-jobqueue cluster (``SLURMCluster``/``PBSCluster``);
    its scheduler has :data:`PRELOAD_MODULE` preloaded. ``len(cluster.plan)``
    Dask workers are expected: ``learner_processes + jobs * processes``. Close
    it with ``cluster.close()``, which cancels the jobs.

    Unset job sizes come from ``sinfo`` on SLURM (``say`` gets one line naming
    them). Raises :class:`JobqueueError` (one line) when the submit or cancel
    command is not on ``PATH``, dask-jobqueue is missing, an option is invalid
    or SLURM refuses a job (``sbatch --test-only``) -- before starting
    anything. ``cluster.apex_jobs`` (:class:`SubmittedJobs`) cancels every job
    it submitted; that also runs at interpreter exit.
    """
    o = options_from(opts)
    cluster_cls, job_cls = _job_classes(kind)
    _check_jobs(jobs)
    info = _KINDS[kind]
    for role in ("submit", "cancel"):
        binary = info[role]
        if shutil.which(binary) is None:
            raise JobqueueError(
                f"{binary} not found on PATH: --cluster {kind} submits {info['system']} jobs "
                f"with {info['submit']} and cancels them with {info['cancel']}; run on a "
                f"{info['system']} login node, or start Dask yourself (see docs/cluster.md)"
            )
    o, notes = _sized(kind, o, ask_sinfo=True)
    for note in notes:
        if say is not None:
            say(note)
    _check_env_capacity(jobs, o, config)
    if kind == "slurm":  # refused now, in one line, rather than queued forever
        for role, learner in (("learner", True), ("env", False)):
            kw = _job_kwargs(kind, with_run_tls(o, make=False), learner)
            script = job_cls(_PLACEHOLDER_ADDRESS, name="dry-run", **kw).job_script()
            slurm.dry_run(script, role, kw["queue"])
    o = with_run_tls(o, make=True)
    env_kw = _job_kwargs(kind, o, learner=False)
    learner_kw = _job_kwargs(kind, o, learner=True)
    submitted = SubmittedJobs(kind)
    job_cls = submitted.job_class(job_cls)
    scheduler_options: dict[str, Any] = {
        "preload": [PRELOAD_MODULE],
        "dashboard_address": o.dashboard_address,
    }
    if o.scheduler_host:
        scheduler_options["host"] = o.scheduler_host
    cluster = cluster_cls(
        n_workers=0, scheduler_options=scheduler_options, job_cls=job_cls, **env_kw
    )
    cluster.apex_jobs = submitted
    atexit.register(submitted.cancel)
    spec: dict[str, Any] = {"cls": job_cls, "options": {**learner_kw, "config_name": kind}}
    if o.learner_processes > 1:
        spec["group"] = [f"-{i}" for i in range(o.learner_processes)]
    # Insert first: SpecCluster.scale pops the newest entries when shrinking.
    cluster.worker_spec = {LEARNER_JOB_NAME: spec, **cluster.worker_spec}
    cluster.scale(jobs=jobs + 1)
    return cluster


def wait_for_jobqueue_workers(
    cluster: Any,
    timeout_s: float | None = None,
    progress: Callable[[str], None] | None = None,
    poll_s: float = 2.0,
) -> None:
    """Block until every planned Dask worker of ``cluster`` has joined.

    Queued jobs can take long to start: ``progress`` gets a line whenever what
    is awaited changes (workers joined; SLURM: each waiting job's state and
    reason). Raises :class:`JobqueueError` after ``timeout_s`` seconds (None:
    wait forever) naming how many joined, and at once, in one line, when SLURM
    holds a job for a reason that means it can never start.
    """
    expected = len(cluster.plan)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    jobs = getattr(cluster, "apex_jobs", None)
    last_line, next_poll = "", 0.0
    while True:
        joined = len(cluster.scheduler_info.get("workers", {}))
        if joined >= expected:
            return
        if jobs is not None and jobs.kind == "slurm" and time.monotonic() >= next_poll:
            next_poll = time.monotonic() + poll_s
            queue = slurm.QueueWatch(dict(jobs.roles)).poll()
            line = f"{joined} of {expected} Dask workers joined" + (f"; {queue}" if queue else "")
            if progress is not None and line != last_line:
                progress(line)
            last_line = line
        if deadline is not None and time.monotonic() > deadline:
            raise JobqueueError(
                f"only {joined} of {expected} Dask workers joined within {timeout_s:g} s; "
                f"check the queue (squeue/qstat) and the job logs"
            )
        time.sleep(0.5)
