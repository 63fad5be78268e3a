"""The options of ``--cluster slurm|pbs`` (:class:`JobqueueOptions`), their parsing from
``--jobqueue-opt key=value`` pairs, and the TLS files a jobqueue run uses.

By default every connection of the run requires TLS: with your ``tls_*`` files,
else with a CA and one certificate made for this run in ``tls_dir`` (a folder the
jobs' nodes share; :mod:`apex_dask.runtime.credentials`). ``tls="off"`` or
``APEX_TLS=off``: plain TCP, and one warning line that the cluster is open.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
import typing
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from apex_dask.runtime.credentials import OPEN_CLUSTER, RunCredentials, make_run_credentials

__all__ = [
    "JobqueueError",
    "JobqueueOptions",
    "options_from",
    "parse_jobqueue_opts",
    "with_run_tls",
]


class JobqueueError(RuntimeError):
    """The batch-system cluster cannot be built; the message is one line saying why."""


@dataclass(frozen=True)
class JobqueueOptions:
    """Options of ``--cluster slurm|pbs``, each settable as ``--jobqueue-opt key=value``."""

    queue: str | None = None
    """SLURM partition (``-p``) / PBS queue (``-q``) of the env-worker jobs."""
    learner_queue: str | None = None
    """Partition / queue of the learner job; None: ``queue``."""
    account: str | None = None
    """Account charged for all jobs (``-A``)."""
    walltime: str = "01:00:00"
    """Wall-time limit of every job, ``HH:MM:SS``."""
    cores: int | None = None
    """Cores per env-worker job; None: SLURM: the CPUs of the smallest node of ``queue``
    (``sinfo``), PBS or no ``sinfo``: 8."""
    memory: str | None = None
    """Memory per env-worker job; None: SLURM: that node's memory (whole GiB, rounded
    down), PBS or no ``sinfo``: 16GB."""
    processes: int | None = None
    """Dask worker processes per env-worker job; None: ``cores`` (one thread each,
    so every env worker actor has a process of its own)."""
    learner_cores: int | None = None
    """Cores of the learner job; None: as ``cores``, for the learner's partition
    (PBS or no ``sinfo``: 4)."""
    learner_memory: str | None = None
    """Memory of the learner job; None: as ``memory``, for the learner's partition
    (PBS or no ``sinfo``: 32GB)."""
    learner_processes: int = 1
    """Dask worker processes of the learner job (every one advertises the GPU resource;
    the learner takes one, the replay shards spread over all of them)."""
    gpus: int = 1
    """GPUs of the learner job; 0: a CPU learner job with no GPU request or resource."""
    gpu_directive: str | None = None
    """SLURM only: the directive requesting the GPUs; None: ``--gres=gpu:<gpus>``."""
    resource_spec: str | None = None
    """PBS only: ``-l`` resource spec of env-worker jobs; None: ``select=1:ncpus=C:mem=M``."""
    learner_resource_spec: str | None = None
    """PBS only: resource spec of the learner job; None: ``select=1:ncpus=C:ngpus=G:mem=M``
    (Torque sites use e.g. ``nodes=1:ppn=4:gpus=1``)."""
    directives: tuple[str, ...] = ()
    """Extra directives for every job (repeat the key to add several)."""
    learner_directives: tuple[str, ...] = ()
    """Extra directives for the learner job only."""
    prologue: tuple[str, ...] = ()
    """Shell lines run in every job before the worker starts, e.g. ``module load cuda``."""
    interface: str | None = None
    """Network interface of the scheduler and workers, e.g. ``ib0``; None: the default route."""
    scheduler_host: str | None = None
    """Address the scheduler (in this process) listens on; None: ``interface``'s address."""
    tls: str | None = None
    """``on``: tls:// only, encryption required; ``off``: plain TCP, open to anyone who reaches
    the nodes. None: ``$APEX_TLS``, else ``on``."""
    tls_dir: str | None = None
    """Folder (on a filesystem the jobs' nodes share) for the credentials made for this run
    when no ``tls_*`` files are given; None: ``apex-tls-<time>`` in the current folder."""
    tls_ca_file: str | None = None
    """Your own TLS CA file; with ``tls_cert``, ``tls_key`` (on a shared filesystem)."""
    tls_cert: str | None = None
    """TLS: the certificate of the scheduler, the workers and the driver (PEM)."""
    tls_key: str | None = None
    """TLS: its private key (PEM)."""
    lifetime: str | None = None
    """Env-worker jobs' workers retire themselves after this long (``dask worker
    --lifetime``, e.g. ``50m``); with ``--adapt`` new jobs replace them. None: never."""
    lifetime_stagger: str | None = None
    """With ``lifetime``: each worker's lifetime is moved by a random amount up to this
    (``dask worker --lifetime-stagger``, e.g. ``5m``), so jobs started together do not
    all retire at once. None: no stagger."""
    dashboard_address: str = "127.0.0.1:8787"
    """Address of the scheduler's dashboard (in the submitting process); the default serves
    this machine only (reach it through an SSH tunnel); ``:8787`` serves every interface."""
    local_directory: str | None = None
    """Workers' scratch directory (node-local disk); None: Dask's default."""
    log_directory: str | None = None
    """Directory for the jobs' stdout/stderr files; None: the batch system's default."""
    death_timeout_s: float = 120.0
    """Workers exit this many seconds after losing the scheduler."""
    python: str | None = None
    """Python executable the jobs run (must exist on the compute nodes); None: this one."""

    def __post_init__(self) -> None:
        for name in ("cores", "learner_cores", "learner_processes"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise JobqueueError(f"jobqueue option {name}={value!r} must be >= 1")
        if self.processes is not None and not 1 <= self.processes <= (self.cores or self.processes):
            raise JobqueueError(
                f"jobqueue option processes={self.processes!r} must be between 1 and cores ({self.cores})"
            )
        if self.learner_cores is not None and self.learner_processes > self.learner_cores:
            raise JobqueueError(
                f"jobqueue option learner_processes={self.learner_processes!r} must be <= "
                f"learner_cores ({self.learner_cores})"
            )
        if self.gpus < 0:
            raise JobqueueError(f"jobqueue option gpus={self.gpus!r} must be >= 0")
        lifetime = _duration("lifetime", self.lifetime)
        stagger = _duration("lifetime_stagger", self.lifetime_stagger)
        if stagger is not None and lifetime is None:
            raise JobqueueError(
                f"jobqueue option lifetime_stagger={self.lifetime_stagger!r} needs lifetime "
                "(e.g. --jobqueue-opt lifetime=50m)"
            )
        if stagger is not None and lifetime is not None and stagger >= lifetime:
            raise JobqueueError(
                f"jobqueue option lifetime_stagger={self.lifetime_stagger!r} must be shorter "
                f"than lifetime={self.lifetime!r}"
            )
        if self.death_timeout_s <= 0:
            raise JobqueueError(
                f"jobqueue option death_timeout_s={self.death_timeout_s!r} must be > 0"
            )
        tls = (self.tls_ca_file, self.tls_cert, self.tls_key)
        if any(tls) and not all(tls):
            raise JobqueueError("jobqueue options tls_ca_file, tls_cert and tls_key go together")
        if self.tls not in (None, "on", "off"):
            raise JobqueueError(f"jobqueue option tls={self.tls!r} must be on or off")
        if self.tls == "off" and any(tls):
            raise JobqueueError("jobqueue option tls=off and tls_* files given: drop one of them")


def with_run_tls(o: JobqueueOptions, make: bool) -> JobqueueOptions:
    """``o`` with TLS files: the user's, else ones made for this run in ``tls_dir`` (only
    their paths when not ``make``: scripts rendered offline); unchanged when TLS is off."""
    mode = o.tls or os.environ.get("APEX_TLS") or "on"
    if mode not in ("on", "off"):
        raise JobqueueError(f"APEX_TLS must be on or off, got {mode!r}")
    if mode == "off":
        if make:
            print(f"WARNING: TLS off: plain TCP; {OPEN_CLUSTER}", file=sys.stderr, flush=True)
        return o
    if o.tls_ca_file:
        return o
    folder = o.tls_dir or f"apex-tls-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"
    creds = RunCredentials.in_folder(folder)
    if make:
        try:
            make_run_credentials(creds.folder)
        except OSError as exc:
            raise JobqueueError(f"cannot make TLS credentials in {creds.folder}: {exc}") from None
    files = (str(creds.ca_file), str(creds.cert_file), str(creds.key_file))
    return dataclasses.replace(
        o, tls="on", tls_ca_file=files[0], tls_cert=files[1], tls_key=files[2]
    )


def _duration(key: str, value: str | None) -> float | None:
    """Seconds of a Dask duration such as ``50m`` or ``3600s`` (None stays None)."""
    if value is None:
        return None
    from dask.utils import parse_timedelta

    try:
        seconds = parse_timedelta(value, default="s")
    except (ValueError, KeyError, TypeError):
        seconds = None
    if seconds is None or not seconds > 0:
        raise JobqueueError(
            f"jobqueue option {key}={value!r} must be a positive duration such as 50m or 3600s"
        )
    return float(seconds)


_FIELD_TYPES = typing.get_type_hints(JobqueueOptions)


def parse_jobqueue_opts(pairs: Iterable[str]) -> dict[str, Any]:
    """Turn ``["queue=gpu", "cores=32", "prologue=module load cuda"]`` into keyword arguments.

    Values are typed by the :class:`JobqueueOptions` field; list fields
    (``directives``, ``learner_directives``, ``prologue``) collect every
    repetition of their key, in order. Raises :class:`JobqueueError` naming
    the first bad pair.
    """
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        key = key.strip().replace("-", "_")
        if not sep or not key:
            raise JobqueueError(f"--jobqueue-opt {pair!r} must look like key=value")
        if key not in _FIELD_TYPES:
            known = ", ".join(f.name for f in dataclasses.fields(JobqueueOptions))
            raise JobqueueError(f"unknown jobqueue option {key!r}; known options: {known}")
        tp = _FIELD_TYPES[key]
        if tp == tuple[str, ...]:
            out[key] = (*out.get(key, ()), raw)
        else:
            out[key] = _coerce(key, raw, tp)
    return out


def _coerce(key: str, raw: str, tp: Any) -> Any:
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    optional = type(None) in typing.get_args(tp)
    base = args[0] if args else tp
    if optional and raw.strip().lower() in ("", "none", "null"):
        return None
    if base is str:
        return raw
    try:
        return base(raw)
    except ValueError:
        kind = "an integer" if base is int else "a number"
        raise JobqueueError(f"jobqueue option {key}={raw!r} must be {kind}") from None


def options_from(opts: dict[str, Any]) -> JobqueueOptions:
    """:class:`JobqueueOptions` from keyword arguments (strings from a CLI are typed)."""
    unknown = sorted(set(opts) - set(_FIELD_TYPES))
    if unknown:
        known = ", ".join(f.name for f in dataclasses.fields(JobqueueOptions))
        raise JobqueueError(f"unknown jobqueue option {unknown[0]!r}; known options: {known}")
    typed: dict[str, Any] = {}
    for key, value in opts.items():
        tp = _FIELD_TYPES[key]
        if tp == tuple[str, ...]:
            typed[key] = (value,) if isinstance(value, str) else tuple(value)
        elif isinstance(value, str) and tp is not str and tp != (str | None):
            typed[key] = _coerce(key, value, tp)  # e.g. "cores=8" straight from a CLI flag
        else:
            typed[key] = value
    return JobqueueOptions(**typed)
