"""``--preload apex_dask.runtime.shield``: a batch job's SIGTERM does not end a Dask process.

::

    dask scheduler --preload apex_dask.runtime.shield ...
    dask worker --preload apex_dask.runtime.shield --preload-nanny apex_dask.runtime.shield ...

A batch system stops a job by sending SIGTERM to its processes: SLURM's plain
``scancel`` to every process of the job, ``scancel --signal=TERM`` to those of
its steps (the ``srun``-started workers), PBS's ``qdel`` to the job's session;
SIGKILL follows later (SLURM's ``KillWait``, PBS's ``kill_delay``). Dask's own
handler closes the scheduler or the worker at once, and with them the learner
and the replay shards, while the driver is still writing its checkpoint.

With this preload in the scheduler, each worker process and each nanny
(``--preload-nanny``), SIGTERM is noted in one line on stderr and otherwise
ignored. When ``APEX_STOP_FILE`` is set, the signal's name (and the host and
pid) is appended to that file: the job scripts (``cluster/slurm/apex.sbatch``,
``cluster/pbs/apex.pbs``) watch it and pass the stop on to the driver, which
saves within its grace. Once the driver is done the job script creates
``<APEX_STOP_FILE>.closing`` and closes the cluster (``Client.shutdown``,
then SIGTERM): from then on SIGTERM does what it does without this preload.
SIGKILL always ends every process; SIGINT keeps Dask's handler.

A nanny restarts its worker process with SIGTERM when the worker passes
``distributed.worker.memory.terminate`` of its memory limit; that SIGTERM is
not the batch system's. The nanny's preload marks it
(``<APEX_STOP_FILE>.restart-<pid>``) before the signal goes out, and the worker
process with that pid takes Dask's own handling (it ends, its nanny starts a
new one, the driver replaces its actors) instead of stopping the whole job.
A process that has not ended by the nanny's next memory check (its handler could
not run: a task held the GIL) gets SIGKILL and never takes its marker; the nanny
removes it once the process is gone, so no later process with that pid takes a
batch system's SIGTERM for a restart.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import threading
import time
from typing import Any

import psutil

__all__ = ["CLOSING_SUFFIX", "RESTART_SUFFIX", "STOP_FILE_ENV", "dask_setup", "install"]

STOP_FILE_ENV = "APEX_STOP_FILE"
"""Environment variable: the file a shielded process appends a SIGTERM it got to."""

CLOSING_SUFFIX = ".closing"
"""With ``<APEX_STOP_FILE>.closing`` present, SIGTERM gets Dask's own handling again."""

RESTART_SUFFIX = ".restart-"
"""``<APEX_STOP_FILE>.restart-<pid>``: a nanny is restarting worker process ``pid``
(over its memory limit); that process's SIGTERM gets Dask's own handling."""

_previous: Any = signal.SIG_DFL  # the handler this one replaced (Dask's, in its CLIs)


def dask_setup(server: Any = None) -> None:
    """Preload entry point (scheduler, worker or nanny): :func:`install`; in a nanny,
    also mark the worker processes it restarts for memory (:data:`RESTART_SUFFIX`)."""
    install()
    from distributed import Nanny

    if isinstance(server, Nanny):
        _mark_memory_restarts(server)


def _mark_memory_restarts(nanny: Any) -> None:
    """Before the nanny's memory monitor sends SIGTERM to its worker process it logs the
    event ``worker-restart-memory`` with the process's pid: write the marker then."""
    path = os.environ.get(STOP_FILE_ENV)
    log_event = nanny.log_event
    if not path:
        return

    def marking(topic: Any, msg: Any) -> Any:
        if topic == "worker-restart-memory" and isinstance(msg, dict) and msg.get("pid"):
            pid = int(msg["pid"])
            marker = f"{path}{RESTART_SUFFIX}{pid}"
            try:
                os.close(os.open(marker, os.O_CREAT, 0o600))
            except OSError:
                pass
            else:
                _remove_when_ended(pid, marker)
        return log_event(topic, msg)

    nanny.log_event = marking


def _remove_when_ended(pid: int, marker: str, timeout_s: float = 600.0) -> None:
    """Remove ``marker`` once process ``pid`` has ended (or already has: its SIGTERM
    handler took it), from a daemon thread polling every 0.1 s; a process still running
    after ``timeout_s`` keeps its marker, said in one logged line."""
    try:
        proc: psutil.Process | None = psutil.Process(pid)
    except psutil.Error:
        proc = None  # already gone

    def ended() -> bool:
        try:
            return not proc.is_running() or proc.status() == psutil.STATUS_ZOMBIE
        except psutil.Error:
            return True

    def wait_then_remove() -> None:
        try:
            poll_then_remove()
        except Exception as exc:  # the marker stays: said once, as a give-up is
            logging.getLogger(__name__).warning(
                "could not watch worker process %d for its marker %s (%s: %s); it is left",
                pid,
                marker,
                type(exc).__name__,
                exc,
            )

    def poll_then_remove() -> None:
        deadline = time.monotonic() + timeout_s
        while proc is not None and not ended():
            if time.monotonic() > deadline:
                logging.getLogger(__name__).warning(
                    "worker process %d still runs %.0f s after its nanny's memory restart; "
                    "its marker %s is left",
                    pid,
                    timeout_s,
                    marker,
                )
                return
            time.sleep(0.1)
        try:
            os.unlink(marker)
        except OSError:
            pass  # taken by the process's own handler

    threading.Thread(target=wait_then_remove, name="apex-shield-marker", daemon=True).start()


def install() -> bool:
    """Replace this process's SIGTERM handler with :func:`_on_term` (main thread only,
    where Python handles signals); whether it was installed. Idempotent."""
    global _previous
    if threading.current_thread() is not threading.main_thread():
        return False
    previous = signal.signal(signal.SIGTERM, _on_term)
    if previous is not _on_term:
        _previous = previous
    return True


def _on_term(signum: int, frame: Any) -> None:
    # No logging here (its locks are not reentrant): one write to stderr, one to the file.
    path = os.environ.get(STOP_FILE_ENV)
    restart = f"{path}{RESTART_SUFFIX}{os.getpid()}" if path else ""
    if restart and os.path.exists(restart):  # this process's nanny: over its memory limit
        try:
            os.unlink(restart)
        except OSError:
            pass
        _dask_handling(signum, frame)
        return
    if path and os.path.exists(path + CLOSING_SUFFIX):  # the job script is closing the cluster
        _dask_handling(signum, frame)
        return
    where = f"{socket.gethostname()} pid {os.getpid()}"
    line = f"apex_dask.runtime.shield: SIGTERM ({where}): left to the job script\n"
    try:
        os.write(2, line.encode())
    except OSError:
        pass
    if not path:
        return
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.write(fd, f"SIGTERM {where}\n".encode())
        finally:
            os.close(fd)
    except OSError:
        pass


def _dask_handling(signum: int, frame: Any) -> None:
    """SIGTERM as without the preload: the handler this one replaced, or the default."""
    signal.signal(signal.SIGTERM, signal.SIG_DFL if _previous is None else _previous)
    if callable(_previous):
        _previous(signum, frame)
    else:
        os.kill(os.getpid(), signal.SIGTERM)  # the default action, or ignored as before
