"""Cost of publishing Ape-X metrics from an actor, and of storing them on the scheduler.

    python benchmarks/metrics_publisher.py [--calls 20000]

Measured inside an actor on a worker process (the real ``log_event`` sink):
- ``publish`` that only records (rate-limited, the common case),
- ``publish(force=True)``, i.e. one ``Worker.log_event`` message,
- the plugin's ``log_event`` (``MetricsStore.ingest``) on the scheduler side,
and the resulting share of an actor's time for a learner that publishes on
every update at ``--updates-per-s`` and sends once a second. Prints a table
and writes ``benchmarks/results/metrics_publisher.json``.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

# A learner's report: 16 metrics, as in docs/metrics.md.
LEARNER_METRICS = {
    "learner/queue_size": 4.0,
    "learner/queue_size/std": 1.0,
    "learner/queue_size/q0": 1.0,
    "learner/queue_size/q10": 2.0,
    "learner/queue_size/q50": 4.0,
    "learner/queue_size/q90": 6.0,
    "learner/queue_size/q100": 8.0,
    "learner/dequeue_s": 0.001,
    "learner/grad_s": 0.005,
    "learner/overall_s": 0.007,
    "learner/steps_trained": 1e6,
    "learner/updates": 2e3,
    "learner/updates_per_s": 150.0,
    "learner/loss": 0.5,
    "learner/mean_q": 10.0,
    "learner/enqueue_blocked_s": 1.5,
}


class PublishBench:
    """Actor timing its own MetricsPublisher (created here, as real actors do)."""

    def __init__(self) -> None:
        from apex_dask.runtime.observability.metrics import MetricsPublisher

        self.pub = MetricsPublisher("learner", "bench", min_interval_s=3600.0)

    def run(self, calls: int) -> dict[str, float]:
        m = dict(LEARNER_METRICS)
        self.pub.publish(m, force=True)
        t0 = time.perf_counter()
        for i in range(calls):
            m["learner/updates"] = float(i)
            self.pub.publish(m)
        recorded = (time.perf_counter() - t0) / calls
        sends = max(calls // 20, 50)
        t0 = time.perf_counter()
        for i in range(sends):
            m["learner/updates"] = float(i)
            self.pub.publish(m, force=True)
        sent = (time.perf_counter() - t0) / sends
        return {"publish_recorded_us": recorded * 1e6, "publish_sent_us": sent * 1e6}


def scheduler_ingest_us(calls: int) -> float:
    from apex_dask.runtime.observability.metrics import TOPIC, ApexMetricsPlugin, make_message

    plugin = ApexMetricsPlugin()
    msgs = [make_message("bench", "learner", LEARNER_METRICS) for _ in range(calls)]
    t0 = time.perf_counter()
    for m in msgs:
        plugin.log_event(TOPIC, m)
    return (time.perf_counter() - t0) / calls * 1e6


def main() -> None:
    from distributed import Client, LocalCluster

    p = argparse.ArgumentParser(description="metrics publisher cost")
    p.add_argument("--calls", type=int, default=20_000)
    p.add_argument("--updates-per-s", type=float, default=200.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--out", default="benchmarks/results/metrics_publisher.json")
    args = p.parse_args()

    with (
        LocalCluster(
            n_workers=1, threads_per_worker=1, processes=True, dashboard_address=None
        ) as c,
        Client(c) as client,
    ):
        actor = client.submit(PublishBench, actor=True).result()
        runs = [actor.run(args.calls).result() for _ in range(args.repeats)]
    recorded = sorted(r["publish_recorded_us"] for r in runs)[len(runs) // 2]
    sent = sorted(r["publish_sent_us"] for r in runs)[len(runs) // 2]
    ingest = scheduler_ingest_us(args.calls)
    # One second of a learner: updates_per_s calls, one of which sends.
    per_second_us = (args.updates_per_s - 1) * recorded + sent
    share = per_second_us / 1e6
    rows = [
        ("publish(), recorded only (us/call)", recorded),
        ("publish(force=True), one log_event (us/call)", sent),
        ("scheduler plugin ingest, 16 metrics (us/msg)", ingest),
        (f"learner at {args.updates_per_s:g} updates/s: us per second", per_second_us),
        ("  share of the actor's time (%)", 100 * share),
    ]
    width = max(len(r[0]) for r in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value:10.3f}")
    result = {
        "benchmark": "metrics_publisher",
        "calls": args.calls,
        "repeats": args.repeats,
        "metrics_per_message": len(LEARNER_METRICS),
        "publish_recorded_us": recorded,
        "publish_sent_us": sent,
        "scheduler_ingest_us": ingest,
        "updates_per_s": args.updates_per_s,
        "actor_time_share": share,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print("wrote", out)


if __name__ == "__main__":
    main()
