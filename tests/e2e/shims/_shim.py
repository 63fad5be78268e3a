"""Shared code of the PBS stand-ins in this folder (qsub, qdel, pbsdsh).

They run every job and task on this machine, as real processes, so that the
job scripts' launch order, scheduler-file hand-off and teardown run for real;
what they cannot show is placement on separate nodes. Each call is appended to
``$APEX_SHIM_STATE/calls.jsonl`` (tool, argv, group, tasks, time) for tests to
read. Jobs submitted without waiting run in their own session, recorded in
``$APEX_SHIM_STATE/jobs/<id>.pid`` so ``qdel`` can stop them. (SLURM is tested
against a real slurmctld instead: ``tests/e2e/test_slurm.py``.)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

TRACKED = ("APEX_SHIM_STATE", "APEX_E2E_MARKER")
"""Variables passed even where PBS would start from a bare environment: the stand-ins'
state folder, and the marker by which tests find every process a job started."""


def state_dir() -> Path:
    path = Path(os.environ.get("APEX_SHIM_STATE", Path.cwd() / ".apex-shim-state"))
    (path / "jobs").mkdir(parents=True, exist_ok=True)
    return path


def record(tool: str, **fields: object) -> None:
    entry = {"tool": tool, "time": time.time(), "pid": os.getpid(), **fields}
    with open(state_dir() / "calls.jsonl", "a") as f:
        f.write(json.dumps(entry) + "\n")


def existing_paths(command: list[str]) -> list[str]:
    """The arguments of ``command`` naming files that exist now (e.g. a scheduler file)."""
    return [a for a in command if os.sep in a and os.path.exists(a)]


def next_job_id() -> int:
    import fcntl

    with open(state_dir() / "next_job_id", "a+") as counter:  # jobqueue submits concurrently
        fcntl.flock(counter, fcntl.LOCK_EX)
        counter.seek(0)
        text = counter.read().strip()
        value = int(text) if text else 1000
        counter.seek(0)
        counter.truncate()
        counter.write(str(value + 1))
    return value


def fail(tool: str, message: str, code: int = 1) -> None:
    print(f"{tool}: error: {message}", file=sys.stderr)
    sys.exit(code)


def run_job(
    job_id: int,
    argv: list[str],
    env: dict[str, str],
    cwd: str,
    out_path: str,
    wait: bool,
) -> int | None:
    """Run a batch script: in the foreground when ``wait``, else in a new session."""
    out = open(out_path, "ab")  # noqa: SIM115 (handed to the child)
    proc = subprocess.Popen(
        argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
    )
    (state_dir() / "jobs" / f"{job_id}.pid").write_text(str(proc.pid))
    if not wait:
        return None
    forward_signals([proc])
    code = proc.wait()
    return code if code >= 0 else 128 - code


def cancel_job(job_id: str, grace_s: float = 10.0) -> bool:
    """SIGTERM the job's process group, then SIGKILL it after ``grace_s``; False if unknown."""
    pid_file = state_dir() / "jobs" / f"{job_id.split('.')[0]}.pid"
    if not pid_file.exists():
        return False
    pgid = int(pid_file.read_text())
    _killpg(pgid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline and _group_alive(pgid):
        time.sleep(0.1)
    _killpg(pgid, signal.SIGKILL)
    return True


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


def forward_signals(procs: list[subprocess.Popen]) -> None:
    """Pass SIGTERM/SIGINT/SIGHUP on to the children (as srun and a job's MoM do)."""

    def handler(signum: int, _frame: object) -> None:
        for p in procs:
            if p.poll() is None:
                try:
                    p.send_signal(signum)
                except ProcessLookupError:
                    pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, handler)


def directives(script: str, prefix: str) -> list[list[str]]:
    """Directive words of a batch script, e.g. ``#SBATCH -N 2`` -> ``[["-N", "2"]]``.

    Reading stops at the first line that is neither blank nor a comment, as
    both SLURM and PBS do; ``##SBATCH`` lines are comments.
    """
    import shlex

    out = []
    for line in Path(script).read_text().splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith(prefix + " "):
            out.append(shlex.split(stripped[len(prefix) :], comments=True))
        elif not stripped.startswith("#"):
            break
    return out


def parse_args(argv: list[str], flags: set[str]) -> tuple[list[tuple[str, str]], list[str]]:
    """Split ``argv`` into leading options and the rest (a script or a command).

    Options are ``--long=v``, value-less ``flags``, or ``-x v`` / ``--long v``;
    ``--`` ends them. Returns ``([(option, value), ...], rest)`` in order, so
    repeated options (``-l`` of qsub) are all kept.
    """
    opts: list[tuple[str, str]] = []
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            return opts, argv[i + 1 :]
        if not word.startswith("-") or word == "-":
            return opts, argv[i:]
        if word.startswith("--") and "=" in word:
            key, value = word.split("=", 1)
            opts.append((key, value))
        elif word in flags:
            opts.append((word, ""))
        elif i + 1 < len(argv):
            opts.append((word, argv[i + 1]))
            i += 1
        else:
            opts.append((word, ""))
        i += 1
    return opts, []


def last(opts: list[tuple[str, str]], *names: str, default: str | None = None) -> str | None:
    """The value of the last of ``names`` given in ``opts`` (later options win)."""
    value = default
    for key, v in opts:
        if key in names:
            value = v
    return value
