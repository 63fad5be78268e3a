"""``/apex/metrics.json`` under load, on a real ``dask scheduler`` with the preload and a
``dask worker``, over real HTTP: oversized requests are refused at once in one line,
the biggest allowed documents are built off the event loop, and the worker's
heartbeats stay on time throughout. Also the evaluator's GIFs in the event log.

The store is filled with 2,000 series of 850 points (1.7 M points, near the default
bound of 2 M). A sampler on the scheduler's event loop records the longest gap between its
10 ms ticks and the oldest worker heartbeat it saw while the requests ran.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from polling import poll

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
N_SERIES, N_POINTS = 2000, 850


@pytest.fixture(scope="module")
def scheduler(tmp_path_factory):
    """``(client, dashboard port)`` of a ``dask scheduler`` (preloaded) with one worker."""
    from distributed import Client

    folder = tmp_path_factory.mktemp("sched")
    sched = folder / "scheduler.json"
    common = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL, "start_new_session": True}
    closing: list = []
    procs = [subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--port", "0",
         "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched),
         "--preload", "apex_dask.runtime.preload"], **common)]  # fmt: skip
    try:
        poll(lambda: sched.exists() and sched.stat().st_size > 0, 60)
        procs.append(subprocess.Popen(
            [str(BIN / "dask"), "worker", "--scheduler-file", str(sched), "--nthreads", "1",
             "--host", "127.0.0.1", "--no-dashboard"], **common))  # fmt: skip
        client = Client(scheduler_file=str(sched), timeout=30)
        closing.append(client)
        client.wait_for_workers(1, timeout=60)
        port = client.scheduler_info()["services"]["dashboard"]

        def fill(dask_scheduler, n_series: int, n_points: int) -> int:
            store = dask_scheduler.plugins["apex-metrics"].store
            for k in range(n_points):
                metrics = {f"m/{i}/x": float(k) for i in range(n_series)}
                store.ingest({"run": "big", "source": "t", "metrics": metrics}, now=1e9 + k)
            return store.points_held()

        held = client.run_on_scheduler(fill, n_series=N_SERIES, n_points=N_POINTS)
        assert held == N_SERIES * N_POINTS  # all within the default bound of 2,000,000
        yield client, port
    finally:
        for c in closing:
            c.close()
        for proc in reversed(procs):
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)


def request(port: int, path: str, body: bytes | None = None) -> tuple[int, bytes, float]:
    t0 = time.perf_counter()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    try:
        headers = {"Content-Type": "application/x-www-form-urlencoded"} if body else {}
        conn.request("GET", path, body=body, headers=headers)
        reply = conn.getresponse()
        return reply.status, reply.read(), time.perf_counter() - t0
    finally:
        conn.close()


def test_oversized_requests_are_refused_fast_and_heartbeats_stay_on_time(scheduler):
    client, port = scheduler

    def start_sampler(dask_scheduler) -> None:
        import time as clock

        from tornado.ioloop import PeriodicCallback

        box = {"last": clock.monotonic(), "gap": 0.0, "age": 0.0}

        def tick() -> None:
            now = clock.monotonic()
            box["gap"] = max(box["gap"], now - box["last"])
            box["last"] = now
            seen = [ws.last_seen for ws in dask_scheduler.workers.values()]
            box["age"] = max(box["age"], clock.time() - min(seen)) if seen else box["age"]

        box["callback"] = PeriodicCallback(tick, 10)
        box["callback"].start()
        dask_scheduler.apex_test_sampler = box

    def stop_sampler(dask_scheduler) -> dict:
        box = dask_scheduler.apex_test_sampler
        box["callback"].stop()
        return {"gap": box["gap"], "age": box["age"]}

    # the 289 KB of patterns, none matching: before the bounds, 3 s and more of
    # matching 30,000 patterns against every series on the event loop
    names = ",".join(f"q/{i}/*" for i in range(30_000))
    body = f"names={names}".encode()
    assert len(body) > 280_000
    client.run_on_scheduler(start_sampler)
    busy = threading.Event()
    documents: list[tuple[int, int]] = []

    def big_documents() -> None:  # the largest allowed request, again and again
        path = "/apex/metrics.json?names=" + ",".join(["m/*"] * 32)
        while not busy.is_set():
            status, data, _ = request(port, path)
            documents.append((status, len(data)))

    readers = [threading.Thread(target=big_documents, daemon=True) for _ in range(3)]
    for r in readers:
        r.start()
    try:
        refused = {
            "body": [request(port, "/apex/metrics.json", body) for _ in range(5)],
            "query": [request(port, "/apex/metrics.json?names=" + names[:6000]) for _ in range(5)],
            "patterns": [request(port, "/apex/metrics.json?names=" + names[:400]) for _ in range(5)],
        }  # fmt: skip
        poll(lambda: len(documents) >= 3, 300, 0.2)  # big documents were built meanwhile
    finally:
        busy.set()
        for r in readers:
            r.join(120)
    sampled = client.run_on_scheduler(stop_sampler)

    for kind, status in (("body", 413), ("query", 414), ("patterns", 400)):
        answers = refused[kind]
        assert {a[0] for a in answers} == {status}, (kind, answers)
        for _, data, _ in answers:  # one line of JSON naming the problem
            assert data.endswith(b"}\n") and data.count(b"\n") == 1, data
            assert json.loads(data)["error"], data
        took = sorted(a[2] for a in answers)
        assert statistics.median(took) < 0.1 and took[-1] < 1.0, (kind, took)
    assert {s for s, _ in documents} <= {200, 503}, documents
    full = [n for s, n in documents if s == 200]
    assert full and min(full) > 20_000_000, documents  # 1.7 M points each
    # the event loop never stalled: heartbeats (every 0.5 s) and the 10 ms ticks kept coming
    assert sampled["age"] < 2.0, sampled
    assert sampled["gap"] < 0.5, sampled


def test_the_document_lists_what_the_patterns_select(scheduler):
    _, port = scheduler
    since = 1e9 + N_POINTS - 21  # the last 20 points
    status, data, _ = request(port, f"/apex/metrics.json?names=m/1/x,m/2?/x&since={since}")
    assert status == 200
    doc = json.loads(data)
    assert sorted(doc["series"]) == ["m/1/x"] + [f"m/2{i}/x" for i in range(10)]
    for points in doc["series"].values():
        assert points == [[1e9 + k, float(k)] for k in range(N_POINTS - 20, N_POINTS)]
    status, data, _ = request(port, "/apex/metrics.json?run=nope")
    assert status == 404 and json.loads(data)["runs"] == ["big"]
    status, data, _ = request(port, "/apex/metrics.json?since=soon")
    assert status == 400 and b"since='soon' is not a number" in data


def test_the_event_log_keeps_only_the_newest_animations(scheduler):
    from apex_dask.runtime.observability.metrics import ANIMATION_TOPIC

    client, _ = scheduler
    for i in range(12):
        gif = b"GIF89a" + bytes([i]) * 1000
        client.log_event(ANIMATION_TOPIC, {"run": "big", "gif": gif, "return": float(i)})

    def kept(dask_scheduler) -> tuple[int, float]:
        anim = dask_scheduler.plugins["apex-metrics"].store.get("big").animation
        return len(dask_scheduler.get_events(ANIMATION_TOPIC)), anim["return"]

    assert poll(lambda: client.run_on_scheduler(kept)[1] == 11.0)
    count, _ = client.run_on_scheduler(kept)
    assert count == 4  # apex.metrics.max-animations
    assert len(client.get_events(ANIMATION_TOPIC)) == 4
