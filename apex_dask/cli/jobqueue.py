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

import logging
import shutil
import time
from pathlib import Path
from typing import Any

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

_KINDS: dict[str, dict[str, str]] = {
    "slurm": {"submit": "sbatch", "cancel": "scancel", "system": "SLURM"},
    "pbs": {"submit": "qsub", "cancel": "qdel", "system": "PBS"},
}


def _job_classes(kind: str) -> tuple[type, type]:
    if kind not in _KINDS:
        raise JobqueueError(f"unknown cluster kind {kind!r}; choose one of: slurm, pbs")
    try:
        import dask_jobqueue
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
    from dask_jobqueue.pbs import pbs_format_bytes_ceil

    spec = f"select=1:ncpus={cores}"
    if gpus > 0:
        spec += f":ngpus={gpus}"
    return spec + ":mem=" + pbs_format_bytes_ceil(parse_bytes(memory))


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
    o = with_run_tls(options_from(opts), make=False)
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


def make_jobqueue_cluster(
    kind: str, jobs: int, config: ApexConfig | None = None, **opts: Any
) -> Any:
    """Start a scheduler here and submit one GPU learner job plus ``jobs`` env-worker jobs.

    ``kind`` is ``"slurm"`` or ``"pbs"``; ``opts`` are :class:`JobqueueOptions`
    fields. Returns the dask-jobqueue cluster (``SLURMCluster``/``PBSCluster``);
    its scheduler has :data:`PRELOAD_MODULE` preloaded. ``len(cluster.plan)``
    Dask workers are expected: ``learner_processes + jobs * processes``. Close
    it with ``cluster.close()``, which cancels the jobs.

    Raises :class:`JobqueueError` (one line) when the submit or cancel command
    is not on ``PATH``, dask-jobqueue is missing, or an option is invalid --
    before starting anything.
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
    _check_env_capacity(jobs, o, config)
    o = with_run_tls(o, make=True)
    env_kw = _job_kwargs(kind, o, learner=False)
    learner_kw = _job_kwargs(kind, o, learner=True)
    scheduler_options: dict[str, Any] = {
        "preload": [PRELOAD_MODULE],
        "dashboard_address": o.dashboard_address,
    }
    if o.scheduler_host:
        scheduler_options["host"] = o.scheduler_host
    cluster = cluster_cls(n_workers=0, scheduler_options=scheduler_options, **env_kw)
    spec: dict[str, Any] = {"cls": job_cls, "options": {**learner_kw, "config_name": kind}}
    if o.learner_processes > 1:
        spec["group"] = [f"-{i}" for i in range(o.learner_processes)]
    # Insert first: SpecCluster.scale pops the newest entries when shrinking.
    cluster.worker_spec = {LEARNER_JOB_NAME: spec, **cluster.worker_spec}
    cluster.scale(jobs=jobs + 1)
    return cluster


def wait_for_jobqueue_workers(cluster: Any, timeout_s: float | None = None) -> None:
    """Block until every planned Dask worker of ``cluster`` has joined.

    Queued jobs can take long to start; raises :class:`JobqueueError` after
    ``timeout_s`` seconds (None: wait forever) naming how many joined.
    """
    expected = len(cluster.plan)
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        joined = len(cluster.scheduler_info.get("workers", {}))
        if joined >= expected:
            return
        if deadline is not None and time.monotonic() > deadline:
            raise JobqueueError(
                f"only {joined} of {expected} Dask workers joined within {timeout_s:g} s; "
                f"check the queue (squeue/qstat) and the job logs"
            )
        time.sleep(0.5)
