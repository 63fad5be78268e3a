"""The chaos matrix's cluster and its faults: a `dask scheduler`, nanny workers, kill -9.

::

    with ChaosCluster(tmp, workers=3) as cc:      # scheduler + 3 `dask worker` processes
        cc.kill(address)                          # SIGKILL that worker process (its nanny
        cc.wait_for_workers()                     # restarts it at a new address)
        row = Row(driver, fault=..., expect=...)   # see :func:`run_row`

Each row of ``test_chaos_matrix.py`` trains CartPole with the laws strict
(``report.strict_invariants``: a violated law ends the run, failing the row) and
the priority audit on, injects its fault once a checkpoint exists, then checks
that within :data:`BOUND_S` of the fault every shard is sampled and updated
again, and trains on to its budget (:data:`AFTER_S` past the fault).
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BIN = Path(sys.executable).parent

BOUND_S = 30.0
"""Seconds after a fault by which every shard's ``batches_sampled`` and
``priority_updates_applied`` rose again (a lost peer's calls used to wait out
``topology.call_timeout_s``, 60 s)."""
AFTER_S = 20.0
"""A row's budget: it trains this long past its fault (longer while its shards are not
sampled and updated again, up to :data:`BOUND_S` + 5 s), then halts."""


def spawn(args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        args,
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
        env=env,
    )


class ChaosCluster:
    """A `dask scheduler` and ``workers`` nanny-managed `dask worker` processes on loopback."""

    def __init__(self, tmp: Path, workers: int = 3) -> None:
        self.tmp, self.n = tmp, workers
        self.scheduler_file = tmp / "scheduler.json"
        self.procs: list[subprocess.Popen] = []
        self.client: Any = None

    def __enter__(self) -> ChaosCluster:
        from distributed import Client

        self.procs.append(
            spawn(
                [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0"]
                + ["--dashboard-address", ":0", "--scheduler-file", str(self.scheduler_file)],
                self.tmp / "scheduler.log",
            )
        )
        try:
            deadline = time.monotonic() + 60
            while not self.scheduler_file.exists():
                assert time.monotonic() < deadline and self.procs[0].poll() is None
                time.sleep(0.2)
            for i in range(self.n):
                self.add_worker(f"w{i}")
            self.client = Client(scheduler_file=str(self.scheduler_file), timeout=60)
            self.client.wait_for_workers(self.n, timeout=120)
        except BaseException:
            self.__exit__()
            raise
        return self

    def add_worker(self, name: str) -> None:
        self.procs.append(
            spawn(
                [str(BIN / "dask"), "worker", "--scheduler-file", str(self.scheduler_file)]
                + ["--nthreads", "1", "--no-dashboard", "--host", "127.0.0.1"]
                + ["--name", name, "--memory-limit", "2GiB"],
                self.tmp / f"{name}.log",
            )
        )

    def __exit__(self, *exc: Any) -> None:
        if self.client is not None:
            self.client.close()
        for p in self.procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait()

    def addresses(self) -> list[str]:
        return sorted(self.client.scheduler_info(n_workers=-1)["workers"])

    def kill(self, *addresses: str) -> None:
        """SIGKILL the worker processes at ``addresses`` (their nannies live on)."""
        pids = self.client.run(os.getpid, workers=list(addresses))
        for address in addresses:
            os.kill(pids[address], signal.SIGKILL)

    def wait_for_workers(self, n: int | None = None, timeout_s: float = 120.0) -> None:
        """Until ``n`` (all) workers are back (a nanny restarts a killed one in ~10 s)."""
        want = self.n if n is None else n
        deadline = time.monotonic() + timeout_s
        while len(self.addresses()) < want:
            assert time.monotonic() < deadline, f"{len(self.addresses())} of {want} workers"
            time.sleep(0.5)


def config(**overrides: Any) -> Any:
    """CartPole on 2 shards spread over the workers, the laws strict, the audit on."""
    from apex_dask.config import ApexConfig

    base = {
        "replay.num_shards": 2,
        "replay.placement": "spread",
        "replay.audit_priorities": True,
        "workers.num_workers": 2,
        "checkpoint.interval_s": 4.0,
        "eval.episodes": 3,
        "report.strict_invariants": True,
        "seed": 11,
    }
    return ApexConfig.preset("cartpole").override({**base, **overrides})


@dataclass
class RowResult:
    """What a row saw: results with their times, the fault's time, the final dict."""

    results: list[tuple[float, dict[str, float]]] = field(default_factory=list)
    fault_at: float = math.nan
    fault: dict[str, Any] = field(default_factory=dict)
    final: dict[str, float] = field(default_factory=dict)
    placement: dict[str, Any] = field(default_factory=dict)

    def after(self, t: float) -> list[tuple[float, dict[str, float]]]:
        return [(when, r) for when, r in self.results if when >= t]


def run_row(
    driver: Any,
    fault: Callable[[Any], dict[str, Any]],
    handled: Callable[[dict[str, float]], bool],
    *,
    settle_s: float = 6.0,
    limit_s: float = 240.0,
) -> RowResult:
    """Train; inject ``fault(driver)`` once a checkpoint exists and ``settle_s`` passed;
    go on until :data:`AFTER_S` past it (and ``handled(result)`` holds); halt."""
    out = RowResult()
    t0 = time.monotonic()
    for result in driver.iterate():
        now = time.monotonic()
        out.results.append((now, result))
        assert now - t0 < limit_s, f"row still running after {limit_s} s"
        if math.isnan(out.fault_at):
            if now - t0 >= settle_s and driver.last_checkpoint is not None:
                out.fault = fault(driver)
                out.fault_at = time.monotonic()
        elif now - out.fault_at >= AFTER_S and handled(result):
            if _again(out, handled) or now - out.fault_at > BOUND_S + 5:
                break
    out.final = driver.halt() or {}
    out.placement = driver.placement
    return out


def _again(row: RowResult, handled: Callable[[dict[str, float]], bool]) -> bool:
    try:
        shards_sampled_and_updated_again(row, 2, handled)
    except AssertionError:
        return False
    return True


def shards_sampled_and_updated_again(row: RowResult, num_shards: int, handled) -> float:
    """Seconds from the fault until every shard's ``batches_sampled`` and
    ``priority_updates_applied`` rose past their values at the first result that shows
    the fault handled (``handled(result)``); fails past :data:`BOUND_S`."""
    after = [(t, r) for t, r in row.after(row.fault_at) if handled(r)]
    assert after, f"no result showed the fault handled\n{timeline(row)}"
    _, first = after[0]
    names = ("batches_sampled", "priority_updates_applied")
    for t, r in after[1:]:
        if all(
            r[f"replay/{k}/{n}"] > first[f"replay/{k}/{n}"]
            for k in range(num_shards)
            for n in names
        ):
            took = t - row.fault_at
            assert took <= BOUND_S, f"shards sampled and updated again only {took:.0f} s after"
            return took
    stuck = {
        f"replay/{k}/{n}": (first[f"replay/{k}/{n}"], after[-1][1][f"replay/{k}/{n}"])
        for k in range(num_shards)
        for n in names
    }
    raise AssertionError(
        f"a shard was not sampled or updated again after the fault: {stuck}\n{timeline(row)}"
    )


TIMELINE_KEYS = (
    "timesteps_total",
    "flow/rollouts_stored",
    "learner/steps_trained",
    "learner/ratio_wait_s",
    "learner/queue_size",
    "faults/env_workers_replaced",
    "faults/shards_restored",
    "faults/learner_restored",
    "faults/rollouts_failed",
    "env/workers/weights_version/min",
    "learner/version",
)


def timeline(row: RowResult, since_s: float = 3.0) -> str:
    """A line per result from ``since_s`` before the fault: seconds from the fault and the
    counters that say which flow stopped (the reason a failed row gives)."""
    lines = ["s from fault | " + " ".join(k.split("/", 1)[-1] for k in TIMELINE_KEYS)]
    for t, r in row.after(row.fault_at - since_s):
        cells = " ".join(f"{r.get(k, math.nan):.6g}" for k in TIMELINE_KEYS)
        lines.append(f"{t - row.fault_at:+7.1f} | {cells}")
    return "\n".join(lines)


def healthy_and_balanced(final: dict[str, float]) -> None:
    """No task failed, no law was broken; every hop's counters agree after the halt,
    within what lost actors took with them."""
    assert final["health/task_failures"] == 0, final
    assert final["health/invariant_violations"] == 0, final
    assert final["flow/rollouts_stored"] <= final["flow/rollouts_sent"]
    received, trained = final["flow/batches_received"], final["flow/batches_trained"]
    queued, lost = final["flow/batches_in_queue"], final["flow/batches_lost"]
    assert trained + queued <= received <= trained + queued + lost
    sent = final["flow/priority_updates_sent"]
    done = (
        final["flow/priority_updates_applied"]
        + final["flow/priority_updates_stale"]
        + final["flow/priority_updates_failed"]
    )
    # a lost shard's counters are as of its last stats (about a second before it died)
    assert abs(done - sent) <= 0.03 * sent, (done, sent)
    for k in range(int(final.get("num_shards", 2))):
        assert final.get(f"replay/{k}/audit_mismatches", 0) == 0


def shard_off_the_learner(placement: dict[str, Any]) -> tuple[int, str]:
    """``(shard id, address)`` of the first shard not on the learner's worker."""
    learner = placement["learner"]["address"]
    return next(
        (k, w["address"]) for k, w in enumerate(placement["shards"]) if w["address"] != learner
    )


def on(placement: dict[str, Any], address: str) -> dict[str, int]:
    """What lives on ``address``: shards, the learner, env workers (the evaluator aside)."""
    return {
        "shards": sum(w["address"] == address for w in placement["shards"]),
        "learner": int(placement["learner"]["address"] == address),
        "env_workers": sum(bool(w) and w["address"] == address for w in placement["env_workers"]),
    }
