"""Elastic runs: the learner's updates/s with workers churning against a run without churn.

    .venv/bin/python benchmarks/elastic.py                       # 10 min per mode, churn every 2 min
    .venv/bin/python benchmarks/elastic.py --minutes 2.5 --churn-s 40

Each mode trains CartPole (``topology.elastic``, 1 env worker per worker
process) on an embedded LocalCluster of ``--workers`` processes for
``--minutes``. In the churn mode, every ``--churn-s`` seconds the newest worker
is retired (``cluster.scale(n - 1)``: its env worker stops after its rollouts
in flight are stored) and a new one is added (``cluster.scale(n)``: it gets an
env worker). The learner's updates/s is its update count over the window
after the first update (the actor start-up is not in it). Target: churn >=
0.8x no churn. Each joined worker's env worker is timed from the worker's join
(the scheduler's ``add-worker`` event) to its creation and to its first stored
rollout (the run's own lines, ``driver.changes``), and from ``cluster.scale(n)``
to that first rollout (a churn waits for it). Target: rollouts within 10 s of
joining. Prints a table and writes ``benchmarks/results/elastic.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import threading
import time
from pathlib import Path

from apex_dask.config import ApexConfig
from apex_dask.runtime.orchestration.cluster import start_local_cluster
from apex_dask.runtime.orchestration.driver import ApexDriver


def one(churn: bool, minutes: float, churn_s: float, workers: int) -> dict:
    cfg = ApexConfig.preset("cartpole").override(
        {
            "topology.elastic": True,
            "workers.per_process": 1,
            "workers.num_workers": workers,
            "report.min_iter_time_s": 5.0,
            "eval.episodes": 0,
            "seed": 0,
        }
    )
    cluster, client = start_local_cluster(workers, dashboard_address=None)
    churns, scale_to_rollout, stop = [], [], threading.Event()

    def count() -> int:
        return len(client.scheduler_info(n_workers=-1)["workers"])

    def reach(n: int) -> None:  # scale() only asks; wait (bounded) until it is done
        deadline = time.monotonic() + 120
        while count() != n and time.monotonic() < deadline:
            time.sleep(0.2)

    def first_rollouts(driver: ApexDriver) -> int:
        return sum("first rollout" in line for line in driver.changes)

    def churner(driver: ApexDriver) -> None:
        while not stop.wait(churn_s):
            t0 = time.monotonic()
            cluster.scale(workers - 1)  # the newest worker retires, handing over
            reach(workers - 1)
            t1, seen = time.monotonic(), first_rollouts(driver)
            cluster.scale(workers)  # and a new one joins
            reach(workers)
            while first_rollouts(driver) == seen and not stop.wait(0.1):
                pass  # until its env worker stored a rollout
            if first_rollouts(driver) > seen:
                scale_to_rollout.append(time.monotonic() - t1)
            churns.append(time.monotonic() - t0)

    try:
        with ApexDriver(cfg, client) as driver:
            start = None
            last: dict = {}
            thread = (
                threading.Thread(target=churner, args=(driver,), daemon=True) if churn else None
            )
            for result in driver.iterate():
                if start is None and result["learner/updates"] > 0:
                    start = (time.monotonic(), result["learner/updates"])
                    if thread is not None:
                        thread.start()
                last = result
                if start is not None and time.monotonic() - start[0] >= minutes * 60:
                    break
            stop.set()
            if thread is not None:
                thread.join()
            final = driver.halt() or last
            wall = time.monotonic() - start[0]
            updates = final["learner/updates"] - start[1]
            changes = driver.changes
    finally:
        client.close()
        cluster.close()
    added = _seconds(changes, r"added on .*, ([\d.]+) s after it joined")
    first = _seconds(changes, r"first rollout ([\d.]+) s after")
    for line in changes:
        print(f"  {line}")
    return {
        "mode": "churn" if churn else "no churn",
        "window_s": round(wall, 1),
        "updates_per_s": round(updates / wall, 1),
        "churns": len(churns),
        "churn_s_each": round(sum(churns) / max(1, len(churns)), 1),
        "env_workers_added": final["elastic/env_workers_added"],
        "env_workers_retired": final["elastic/env_workers_retired"],
        "faults": sum(v for k, v in final.items() if k.startswith("faults/")),
        "return_mean": round(final.get("env/episode_return_mean", float("nan")), 1),
        "joins": len(first),
        "join_to_added_s": _spread(added),
        "join_to_rollout_s": _spread(first),
        "scale_to_rollout_s": _spread(scale_to_rollout),
    }


def _seconds(lines: list[str], pattern: str) -> list[float]:
    """The seconds the run's change lines give."""
    return [float(m) for line in lines for m in re.findall(pattern, line)]


def _spread(xs: list[float]) -> str:
    """ "median / max" ("-": none)."""
    return f"{statistics.median(xs):.1f} / {max(xs):.1f}" if xs else "-"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=10.0, help="training window per mode")
    p.add_argument("--churn-s", type=float, default=120.0, help="seconds between churns")
    p.add_argument("--workers", type=int, default=4, help="worker processes (learner's too)")
    args = p.parse_args()
    rows = [one(churn, args.minutes, args.churn_s, args.workers) for churn in (False, True)]
    ratio = rows[1]["updates_per_s"] / max(rows[0]["updates_per_s"], 1e-9)
    cols = list(rows[0])
    print(" | ".join(cols))
    for r in rows:
        print(" | ".join(str(r[c]) for c in cols))
    print(f"churn / no churn: {ratio:.2f}x (target >= 0.8x)")
    print(f"join to first rollout, median / max: {rows[1]['join_to_rollout_s']} s (target <= 10)")
    print(f"scale(n) to first rollout, median / max: {rows[1]['scale_to_rollout_s']} s")
    out = Path(__file__).parent / "results" / "elastic.json"
    out.write_text(json.dumps({"args": vars(args), "rows": rows, "ratio": ratio}, indent=2))


if __name__ == "__main__":
    main()
