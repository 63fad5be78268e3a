"""The processes of one ``benchmarks/scale.py`` point: a ``dask scheduler``, one learner
worker and the env-worker processes, each its own OS process (no nannies), so the CPU
and memory of each can be read from ``psutil``; the benchmark's own process is the
driver."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

__all__ = ["ProcessCluster", "cpu_snapshot"]

_ENV = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def _dask() -> str:
    return str(Path(sys.executable).with_name("dask"))


@dataclass
class ProcessCluster:
    """``dask scheduler`` + a ``learner`` worker + ``env_processes`` workers ``env-<j>``."""

    env_processes: int
    hosts: int = 0  # > 0: env process j listens on 127.0.0.<2 + j % hosts>, a host of its own
    tmp: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="apex-scale-")))
    procs: dict[str, subprocess.Popen] = field(default_factory=dict)

    def start(self, timeout_s: float = 90.0) -> Any:
        """Start every process; a ``Client(direct_to_workers=True)`` once all workers joined."""
        from distributed import Client

        env = {**os.environ, **_ENV}
        sched_file = self.tmp / "scheduler.json"
        log = open(self.tmp / "dask.log", "ab")  # noqa: SIM115 - closed with the processes
        self.procs["scheduler"] = subprocess.Popen(
            [_dask(), "scheduler", "--port", "0", "--no-dashboard", "--no-show"]
            + ["--scheduler-file", str(sched_file)],
            env=env,
            stdout=log,
            stderr=log,
        )
        deadline = time.monotonic() + timeout_s
        while not sched_file.is_file():
            if time.monotonic() > deadline or self.procs["scheduler"].poll() is not None:
                raise RuntimeError(f"the scheduler did not start; see {self.tmp / 'dask.log'}")
            time.sleep(0.1)
        names = ["learner"] + [f"env-{j}" for j in range(self.env_processes)]
        for j, name in enumerate(names):
            host = (
                []
                if self.hosts <= 0 or j == 0
                else ["--host", f"127.0.0.{2 + (j - 1) % self.hosts}"]
            )
            self.procs[name] = subprocess.Popen(
                [_dask(), "worker", "--scheduler-file", str(sched_file), "--no-nanny", *host]
                + ["--nthreads", "1", "--memory-limit", "0", "--name", name, "--no-dashboard"],
                env=env,
                stdout=log,
                stderr=log,
            )
        client = Client(scheduler_file=str(sched_file), direct_to_workers=True, timeout=30)
        client.wait_for_workers(len(names), timeout=max(1.0, deadline - time.monotonic()))
        return client

    def pids(self) -> dict[str, int]:
        return {"driver": os.getpid(), **{n: p.pid for n, p in self.procs.items()}}

    def close(self) -> None:
        for name in sorted(self.procs, key=lambda n: n == "scheduler"):  # workers first
            proc = self.procs[name]
            if proc.poll() is None:
                proc.terminate()
        for proc in self.procs.values():
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=10)


def cpu_snapshot(pids: dict[str, int]) -> dict[str, dict[str, float]]:
    """``{name: {"cpu_s": user + system seconds, "rss": bytes}}`` of each process now."""
    out = {}
    for name, pid in pids.items():
        try:
            p = psutil.Process(pid)
            t = p.cpu_times()
            out[name] = {"cpu_s": t.user + t.system, "rss": float(p.memory_info().rss)}
        except psutil.Error:
            out[name] = {"cpu_s": float("nan"), "rss": float("nan")}
    return out


def undo_fixes(names: list[str]) -> None:
    """Put the driver back as it was before ``benchmarks/scale.py``'s fixes, in this
    process (the driver's), for a before/after in one run: ``pool`` (the client's
    connection pool left at Dask's 512), ``taskset`` (``asyncio.wait`` over every call in
    flight on each step of the plan's loop), ``metrics`` (every env worker publishing its
    metrics to the scheduler once a second, whatever the count)."""
    import asyncio

    import apex_dask.runtime.orchestration.launch as launch
    import apex_dask.runtime.orchestration.plan as plan
    from apex_dask.runtime.orchestration.tasks import TaskSet

    class WaitAllTaskSet(TaskSet):
        def _on_finished(self, task: Any) -> None:
            pass

        async def step(self, timeout_s: float) -> None:
            if not self._tasks:
                await asyncio.sleep(min(timeout_s, 0.05))
                return
            done, _ = await asyncio.wait(
                list(self._tasks), timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
            )
            for task in done:
                result = self._tasks.pop(task)(task)
                if result is not None:
                    await result

    if "pool" in names:
        plan.fit_connection_pool = lambda client, needed: 0
    if "taskset" in names:
        plan.TaskSet = WaitAllTaskSet
    if "metrics" in names:
        launch.env_metrics_interval_s = lambda num_workers: 1.0
