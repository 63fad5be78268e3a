"""What ``--cluster slurm`` asks of SLURM besides submitting jobs.

::

    sizes = node_sizes("cpu")               # sinfo: (CPUs, MB) of the partition's smallest node
    dry_run(script, role="env", ...)        # sbatch --test-only: refused now, not queued forever
    watch = QueueWatch(job_ids)             # squeue: states, reasons, "never" in one line
    line = watch.poll()                     # raises JobqueueError for a job that can never start

- **Sizes**: a job with no ``cores``/``memory`` asks for one whole node of its
  partition, the smallest one ``sinfo`` lists (so it fits any of them); memory
  is rounded down to whole GiB, since ``sbatch --mem`` is written in whole
  units rounded up.
- **Never**: ``sbatch --test-only`` refuses, before anything is submitted, a
  request no node of the partition can hold (more CPUs, memory or GPUs than a
  node has), an unknown partition or an unknown feature. Once submitted, a job
  pending for a reason that only an edit of the request (or of the site) can
  clear -- :data:`NEVER` -- ends the wait at once. Other reasons
  (``Resources``, ``Priority``, ...) mean queued behind others: waited for.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence
from pathlib import Path

from apex_dask.cli.jobqueue_options import JobqueueError

__all__ = ["NEVER", "QueueWatch", "cancel_jobs", "dry_run", "node_sizes"]

NEVER: dict[str, str] = {
    "PartitionConfig": "{cores}, {memory}, gpus or {queue}",
    "PartitionNodeLimit": "{cores}, {memory} or {queue}",
    "PartitionTimeLimit": "walltime or {queue}",
    "InvalidAccount": "account",
    "AccountNotAllowed": "account or {queue}",
    "InvalidQOS": "the --qos in directives",
    "QOSNotAllowed": "the --qos in directives, or {queue}",
    "BadConstraints": "{cores}, {memory} or the constraints in directives",
    "DependencyNeverSatisfied": "the --dependency in directives",
}
"""SLURM pending reasons that mean "not with this request", and the options to change
(``{cores}`` etc. name the learner job's own options for the learner job)."""

_REFUSALS: tuple[tuple[str, str], ...] = (
    ("invalid partition", "{queue}"),
    ("invalid account", "account"),
    ("generic resource", "gpus or gpu_directive (or {queue}: a partition with GPUs)"),
    ("time limit", "walltime"),
    ("feature", "the constraints in directives"),
    ("node configuration is not available", "{cores}, {memory}, gpus or {queue}"),
    ("memory", "{memory}"),
)
"""What ``sbatch`` says when it refuses a job, and the options to change."""

ROLE_NAMES = {"learner": "the learner job", "env": "an env-worker job"}


def _options(role: str, template: str) -> str:
    learner = role == "learner"
    names = {
        "cores": "learner_cores" if learner else "cores",
        "memory": "learner_memory" if learner else "memory",
        "queue": "learner_queue" if learner else "queue",
    }
    return template.format(**names)


def _run(argv: Sequence[str], timeout_s: float = 30.0) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JobqueueError(f"{argv[0]} did not answer: {exc}") from None


def node_sizes(partition: str | None) -> tuple[str, int, int] | None:
    """``(partition, CPUs, memory in MB)``: the smallest node of ``partition`` (None: the
    default partition), from ``sinfo``; None when sinfo is missing or lists no such node."""
    if shutil.which("sinfo") is None:
        return None
    proc = _run(["sinfo", "-h", "-N", "-o", "%P %c %m"])
    if proc.returncode != 0:
        return None
    sizes, found = [], partition or ""
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) != 3:
            continue
        name, cpus, mem = parts
        default = name.endswith("*")
        if (partition is None and default) or name.rstrip("*") == partition:
            found = name.rstrip("*")
            try:
                sizes.append((int(cpus.rstrip("+")), int(mem.rstrip("+"))))
            except ValueError:
                continue
    if not sizes:
        return None
    return found, min(c for c, _ in sizes), min(m for _, m in sizes)


def memory_for(mb: int) -> str:
    """A ``memory`` option that ``sbatch --mem`` (whole units, rounded up) keeps <= ``mb``."""
    return f"{mb // 1024}GiB" if mb >= 1024 else f"{mb}MiB"


def dry_run(script: str, role: str, partition: str | None) -> None:
    """``sbatch --test-only`` of a rendered job script; a refusal is a one-line
    :class:`JobqueueError` naming the job, SLURM's reason and the options to change."""
    with tempfile.TemporaryDirectory(prefix="apex-sbatch-") as folder:
        path = Path(folder) / f"{role}.sh"
        path.write_text(script)
        proc = _run(["sbatch", "--test-only", str(path)])
    if proc.returncode == 0:
        return
    said = [ln.strip() for ln in proc.stderr.splitlines() if ln.strip()]
    reason = said[-1] if said else f"exit {proc.returncode}"
    for prefix in ("allocation failure:", "sbatch: error:", "Batch job submission failed:"):
        reason = reason.split(prefix)[-1].strip()
    options = "the jobqueue options"
    for needle, template in _REFUSALS:
        if needle in reason.lower():
            options = _options(role, template)
            break
    sizes = node_sizes(partition)
    where = (
        "" if sizes is None else f" (partition {sizes[0]}: nodes of {sizes[1]} CPUs, {sizes[2]} MB)"
    )
    raise JobqueueError(
        f"SLURM refuses {ROLE_NAMES[role]}{where}: {reason}; change --jobqueue-opt {options}"
    )


class QueueWatch:
    """The SLURM jobs of one run, as ``squeue`` sees them.

    ``poll()`` returns a short status (``"job 12 PENDING (Priority)"``), raising
    :class:`JobqueueError` for a job pending for a reason in :data:`NEVER`.
    """

    def __init__(self, roles: dict[str, str]) -> None:
        self.roles = roles  # job id -> "learner" | "env"

    def poll(self) -> str:
        if not self.roles or shutil.which("squeue") is None:
            return ""
        ids = ",".join(sorted(self.roles))
        proc = _run(["squeue", "-h", "-j", ids, "-o", "%i|%T|%r|%P"], timeout_s=15)
        if proc.returncode != 0:
            return ""
        waiting = []
        for line in proc.stdout.splitlines():
            parts = line.strip().split("|")
            if len(parts) != 4:
                continue
            job, state, reason, partition = parts
            role = self.roles.get(job, "env")
            if state == "PENDING" and reason in NEVER:
                options = _options(role, NEVER[reason])
                raise JobqueueError(
                    f"SLURM job {job} ({ROLE_NAMES[role]}, partition {partition}) can never "
                    f"start: pending with reason {reason}; change --jobqueue-opt {options}"
                )
            if state != "RUNNING":
                waiting.append(f"job {job} {state} ({reason})")
        return "; ".join(waiting)


def cancel_jobs(job_ids: Sequence[str]) -> None:
    """``scancel`` these jobs (already ended ones are ignored); never raises."""
    if not job_ids or shutil.which("scancel") is None:
        return
    try:
        subprocess.run(["scancel", "--quiet", *job_ids], capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pass
