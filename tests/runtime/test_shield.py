"""``apex_dask.runtime.shield``: Dask processes a batch job's SIGTERM does not end.

Real ``dask scheduler`` and ``dask worker`` processes (a nanny and its worker
process) started as the job scripts start them. SIGTERM to every one of them:
all keep serving (a task still runs), each wrote the signal to the stop file
the job script watches. Once the job script marks the cluster as closing,
SIGTERM ends them as it does without the preload.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from polling import poll

pytestmark = pytest.mark.slow

DASK = str(Path(sys.executable).parent / "dask")
SHIELD = "apex_dask.runtime.shield"


def start_shielded(tmp_path: Path, *worker_args: str) -> tuple[subprocess.Popen, subprocess.Popen]:
    """``dask scheduler`` and ``dask worker`` (nanny and worker process) as the job scripts
    start them, with ``APEX_STOP_FILE`` = ``tmp_path/stop-signal``, files in ``tmp_path``."""
    sched_file, stop_file = tmp_path / "scheduler.json", tmp_path / "stop-signal"
    env = {**os.environ, "APEX_STOP_FILE": str(stop_file)}
    common = {"env": env, "stderr": subprocess.STDOUT, "start_new_session": True}
    scheduler = subprocess.Popen(
        [DASK, "scheduler", "--host", "127.0.0.1", "--port", "0", "--dashboard-address", ":0",
         "--scheduler-file", str(sched_file), "--preload", SHIELD],
        stdout=(tmp_path / "scheduler.log").open("w"), **common,
    )  # fmt: skip
    worker = subprocess.Popen(
        [DASK, "worker", "--scheduler-file", str(sched_file), "--host", "127.0.0.1",
         "--nthreads", "1", *worker_args, "--preload", SHIELD, "--preload-nanny", SHIELD],
        stdout=(tmp_path / "worker.log").open("w"), **common,
    )  # fmt: skip
    return scheduler, worker


def test_sigterm_to_every_shielded_dask_process_is_noted_and_ends_none(tmp_path):
    from distributed import Client

    sched_file, stop_file = tmp_path / "scheduler.json", tmp_path / "stop-signal"
    scheduler, worker = start_shielded(tmp_path)
    procs = [scheduler, worker]
    try:
        poll(sched_file.exists, 60)
        with Client(scheduler_file=str(sched_file), timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
            kids = psutil.Process(worker.pid).children(recursive=True)
            pids = [scheduler.pid, worker.pid]  # and the worker process (not Python's helpers)
            pids += [c.pid for c in kids if "resource_tracker" not in " ".join(c.cmdline())]
            assert len(pids) == 3
            for pid in pids:
                os.kill(pid, signal.SIGTERM)
            poll(lambda: stop_file.exists() and len(stop_file.read_text().splitlines()) >= 3, 30)
            assert client.submit(sum, [1, 2, 3], pure=False).result(timeout=30) == 6
            assert all(psutil.pid_exists(p) for p in pids)
            assert len(client.scheduler_info()["workers"]) == 1
        # The job script closes the cluster: SIGTERM is Dask's again (a graceful close).
        Path(f"{stop_file}.closing").touch()
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            assert p.wait(timeout=60) is not None
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
    lines = stop_file.read_text().splitlines()
    assert all(line.startswith("SIGTERM ") for line in lines), lines
    assert "apex_dask.runtime.shield: SIGTERM" in (tmp_path / "worker.log").read_text()


@pytest.mark.parametrize("gil", [False, True], ids=["sleeping", "holding-the-gil"])
def test_a_nannys_memory_restart_ends_only_its_worker_process_not_the_job(tmp_path, gil):
    """The nanny's SIGTERM to a worker process over its memory limit is Dask's, not the
    batch system's: the process ends and is replaced, and the stop file stays empty (the
    job script would otherwise stop the whole job as if scancel'd). The restart marker is
    gone afterwards, taken by the process's handler or, where the nanny had to send
    SIGKILL, removed by the nanny once the process ended."""
    from distributed import Client

    def hold_memory(mib: int, seconds: float, gil: bool) -> int:  # nested: sent by value
        """``mib`` MiB resident for ``seconds``. With ``gil``, about 3.5 times that in
        one C call that holds the GIL while it allocates (``list(range(n))``: 36 bytes an
        item): the limit is passed early in it and the process cannot run its SIGTERM
        handler before the nanny's next memory check (0.1 s later) sends SIGKILL."""
        import time

        import numpy as np

        if gil:
            held = list(range(mib * 2**20 // 10))
        else:
            held = np.ones(mib * 2**20 // 8)  # touched: resident (numpy fills without the GIL)
        time.sleep(seconds)
        return int(held[0])

    sched_file, stop_file = tmp_path / "scheduler.json", tmp_path / "stop-signal"
    scheduler, worker = start_shielded(tmp_path, "--memory-limit", "600MiB")
    procs = [scheduler, worker]
    try:
        poll(sched_file.exists, 60)
        with Client(scheduler_file=str(sched_file), timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
            first = client.run(os.getpid)
            held = client.submit(hold_memory, 700, 60, gil, pure=False)  # past 95% of 600 MiB

            def replaced() -> bool:
                try:
                    now = client.run(os.getpid)
                except Exception:  # noqa: BLE001 - between the old process and the new
                    return False
                return bool(now) and set(now.values()).isdisjoint(first.values())

            poll(replaced, 90)
            held.cancel()
            assert worker.poll() is None  # the nanny lives on
        log = (tmp_path / "worker.log").read_text()
        assert "memory budget" in log, log[-2000:]
        if gil:  # the path where the process never took its marker
            assert "sending SIGKILL" in log, log[-2000:]
        poll(lambda: not list(tmp_path.glob("stop-signal.restart-*")), 30)
        assert not stop_file.exists() or stop_file.read_text() == "", stop_file.read_text()
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(10)
