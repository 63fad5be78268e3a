"""``/apex/metrics.json`` against the scheduler's event loop, and the store's memory bound.

A real ``dask scheduler`` (preloaded) with one ``dask worker``; the store is filled
with ``--series`` series of ``--points`` points. A 10 ms periodic callback on the
scheduler's event loop records how late each tick comes. Each scenario runs for
``--seconds`` seconds from client threads in this process:

* ``idle``: no requests (the baseline: the machine's own noise);
* ``oversized``: 289 KB bodies of 30,000 patterns, 6 KB query strings and 33
  patterns, one after the other (all refused: 413, 414, 400);
* ``largest``: three clients asking for every series in full, in a loop;
* ``patterns``: 32 patterns that each match nothing, full series, three clients.

For each: requests answered, their latency (median, max), and the event loop's
longest gap and 99th percentile tick delay. Then, in this process, a store filled
to its point budget: what it holds (tracemalloc) against ``max_points x 16 B``.

    python benchmarks/metrics_http.py                     # 2,000 x 850, 10 s each
    python benchmarks/metrics_http.py --series 500 --seconds 5

Prints a table; writes ``benchmarks/results/metrics_http.json``.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "metrics_http.json"
BIN = Path(sys.executable).parent


def request(port: int, path: str, body: bytes | None = None) -> tuple[int, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
    try:
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
        conn.request("GET", path, body=body, headers=headers)
        reply = conn.getresponse()
        reply.read()
        return reply.status, time.perf_counter() - t0
    finally:
        conn.close()


def start_sampler(dask_scheduler) -> None:
    import time as clock

    from tornado.ioloop import PeriodicCallback

    box = {"last": clock.monotonic(), "delays": []}

    def tick() -> None:
        now = clock.monotonic()
        box["delays"].append(now - box["last"] - 0.010)
        box["last"] = now

    box["callback"] = PeriodicCallback(tick, 10)
    box["callback"].start()
    dask_scheduler.apex_bench_sampler = box


def stop_sampler(dask_scheduler) -> list[float]:
    box = dask_scheduler.apex_bench_sampler
    box["callback"].stop()
    return box["delays"]


def fill(dask_scheduler, n_series: int, n_points: int) -> int:
    store = dask_scheduler.plugins["apex-metrics"].store
    for k in range(n_points):
        metrics = {f"m/{i}/x": float(k) for i in range(n_series)}
        store.ingest({"run": "big", "source": "t", "metrics": metrics}, now=1e9 + k)
    return store.points_held()


def scenario(client: Any, port: int, name: str, seconds: float) -> dict[str, Any]:
    bad = ",".join(f"q/{i}/*" for i in range(30_000))
    kinds = {
        "oversized": [("/apex/metrics.json", f"names={bad}".encode()),
                      ("/apex/metrics.json?names=" + bad[:6000], None),
                      ("/apex/metrics.json?names=" + bad[:400], None)],
        "largest": [("/apex/metrics.json?names=m/*", None)],
        "patterns": [("/apex/metrics.json?names=" + ",".join(f"zz/{i}/*" for i in range(32)),
                      None)],
    }  # fmt: skip
    answers: list[tuple[int, float]] = []
    stop = threading.Event()

    def loop(jobs: list[tuple[str, bytes | None]]) -> None:
        while not stop.is_set():
            for path, body in jobs:
                answers.append(request(port, path, body))

    threads = []
    if name in kinds:
        clients = 1 if name == "oversized" else 3
        threads = [threading.Thread(target=loop, args=(kinds[name],)) for _ in range(clients)]
    client.run_on_scheduler(start_sampler)
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join(300)
    delays = sorted(client.run_on_scheduler(stop_sampler))
    latencies = sorted(t for _, t in answers)
    return {
        "scenario": name,
        "requests": len(answers),
        "statuses": sorted({s for s, _ in answers}),
        "latency_median_ms": statistics.median(latencies) * 1e3 if latencies else None,
        "latency_max_ms": latencies[-1] * 1e3 if latencies else None,
        "loop_ticks": len(delays),
        "loop_delay_p99_ms": delays[int(0.99 * (len(delays) - 1))] * 1e3,
        "loop_longest_gap_ms": (delays[-1] + 0.010) * 1e3,
    }


def store_memory(max_points: int, points: int) -> dict[str, Any]:
    from apex_dask.runtime.observability.metrics_store import MetricsStore

    tracemalloc.start()
    store = MetricsStore(maxlen=points, max_points=max_points)
    before = tracemalloc.get_traced_memory()[0]
    n_series = max_points // (points // 2)  # more than fit at full resolution
    for k in range(points):
        metrics = {f"m/{i}/x": float(k) for i in range(n_series)}
        store.ingest({"run": "r", "source": "t", "metrics": metrics}, now=1e9 + k)
    held = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    return {
        "max_points": max_points, "points": points, "series_sent": n_series,
        "series_kept": store.n_series, "capacity_now": store.capacity,
        "points_held": store.points_held(), "bound_bytes": store.memory_bound_bytes,
        "traced_bytes": held,
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--series", type=int, default=2000)
    p.add_argument("--points", type=int, default=850)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    from distributed import Client

    folder = Path(tempfile.mkdtemp(prefix="apex-bench-"))
    sched = folder / "scheduler.json"
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched),
         "--preload", "apex_dask.runtime.preload"], **quiet)]  # fmt: skip
    rows = []
    try:
        while not (sched.exists() and sched.stat().st_size):
            time.sleep(0.1)
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "worker", "--scheduler-file", str(sched), "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard"], **quiet))  # fmt: skip
        with Client(scheduler_file=str(sched), timeout=30) as client:
            client.wait_for_workers(1, timeout=60)
            port = client.scheduler_info()["services"]["dashboard"]
            held = client.run_on_scheduler(fill, n_series=args.series, n_points=args.points)
            print(f"store: {args.series} series, {held:,} points", flush=True)
            for name in ("idle", "oversized", "largest", "patterns"):
                rows.append(scenario(client, port, name, args.seconds))
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
    memory = store_memory(2_000_000, 3600)
    print(f"\n{'scenario':<10} {'requests':>8} {'status':>14} {'median ms':>10} {'max ms':>9} "
          f"{'loop p99 ms':>12} {'longest gap ms':>15}")  # fmt: skip
    fmt = lambda v: "-" if v is None else f"{v:,.1f}"  # noqa: E731
    for r in rows:
        print(f"{r['scenario']:<10} {r['requests']:>8} {str(r['statuses']):>14} "
              f"{fmt(r['latency_median_ms']):>10} {fmt(r['latency_max_ms']):>9} "
              f"{fmt(r['loop_delay_p99_ms']):>12} {fmt(r['loop_longest_gap_ms']):>15}")  # fmt: skip
    print(f"\nstore at its bound: {memory['points_held']:,} points in {memory['series_kept']:,} "
          f"series ({memory['capacity_now']} a series), {memory['traced_bytes'] / 2**20:.1f} MiB "
          f"traced, bound {memory['bound_bytes'] / 2**20:.1f} MiB")  # fmt: skip
    args.out.parent.mkdir(parents=True, exist_ok=True)
    doc = {"benchmark": "metrics_http", "when": time.strftime("%Y-%m-%d %H:%M:%S"),
           "load_average": os.getloadavg(), "settings": vars(args) | {"out": str(args.out)},
           "scenarios": rows, "store_memory": memory}  # fmt: skip
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
