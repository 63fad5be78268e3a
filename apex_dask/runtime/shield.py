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
"""

from __future__ import annotations

import os
import signal
import socket
import threading
from typing import Any

__all__ = ["CLOSING_SUFFIX", "STOP_FILE_ENV", "dask_setup", "install"]

STOP_FILE_ENV = "APEX_STOP_FILE"
"""Environment variable: the file a shielded process appends a SIGTERM it got to."""

CLOSING_SUFFIX = ".closing"
"""With ``<APEX_STOP_FILE>.closing`` present, SIGTERM gets Dask's own handling again."""

_previous: Any = signal.SIG_DFL  # the handler this one replaced (Dask's, in its CLIs)


def dask_setup(server: Any = None) -> None:
    """Preload entry point (scheduler, worker or nanny): :func:`install`."""
    install()


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
    if path and os.path.exists(path + CLOSING_SUFFIX):  # the job script is closing the cluster
        signal.signal(signal.SIGTERM, signal.SIG_DFL if _previous is None else _previous)
        if callable(_previous):
            _previous(signum, frame)
        else:
            os.kill(os.getpid(), signal.SIGTERM)  # the default action, or ignored as before
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
