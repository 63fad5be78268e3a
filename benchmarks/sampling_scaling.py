"""Replay sampling for the learner: Atari batches/s against the shard processes on its host.

    python benchmarks/sampling_scaling.py [--seconds 4] [--rounds 3] [--batch 512]

One ``LocalCluster`` of 3 worker processes (one thread each): the learner's
process holds a sink actor, the two others one ``ReplayShardActor`` each
(``frame_stack=4``, uint8 4x84x84 stacks, Atari-like fragments from
``replay_frames.AtariLikeEpisodes``); a third shard lives in the learner's
process. The sink runs the learner's real ``ReplayPrefetcher`` (4 requests in
flight per shard, a queue of 16) and a consumer thread that takes each batch
and releases it (a shared-memory slot); ``--copy`` makes it copy the arrays
once first, as the CUDA path copies into its pinned staging buffers.

Configurations, measured in interleaved windows of ``--seconds`` (the machine
may be shared: ratios of neighbouring windows, and the load average, say more
than absolute rates):

- ``local x1``: the shard in the learner's process (``replay.placement:
  learner_process``, the default): the ceiling of one process;
- ``tcp x1``, ``tcp x2``: 1 or 2 shard processes, batches sent whole over
  Dask's TCP (``replay.shared_memory: false``);
- ``shm x1``, ``shm x2``: the same shards handing batches over shared memory.

Each window also reads the CPU time of the learner's process and of the shard
processes (``client.run``), minus what each process uses idle (a window of
doing nothing per round: heartbeats, monitors), so the CPU cost of a batch on
each side is known however loaded the machine is. From them, the batches/s a quiet 2-core machine
allows: ``x1 = 1 / shard``, ``x2 = min(2 / shard, 2 / (shard + learner),
1 / learner)`` (seconds of CPU per batch), hence ``x2 / x1``.

Prints a table (median batches/s per configuration, x2/x1 ratios of
neighbouring windows, CPU per batch, the projection) and writes
``benchmarks/results/sampling_scaling.json``. Target: ``shm x2 / shm x1 >= 1.8``
on 2 cores.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import queue  # noqa: E402
import statistics  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "sampling_scaling.json"
CONFIGS = (("local", 1), ("tcp", 1), ("tcp", 2), ("shm", 1), ("shm", 2))


class BatchSink:
    """In the learner's process: the learner's prefetcher and a consumer thread."""

    def __init__(self, local_shard, remote_shards) -> None:
        from apex_dask.runtime.actors.calls import current_worker

        self._worker = current_worker()
        self._local = [local_shard]
        self._remote = list(remote_shards)

    async def measure(
        self, kind: str, n: int, seconds: float, batch: int, copy: bool, per_call: int
    ) -> dict:
        from apex_dask.runtime.actors.prefetch import ReplayPrefetcher, ShardLinks

        if kind == "idle":  # what the processes use doing nothing (heartbeats, monitors)
            await __import__("asyncio").sleep(seconds)
            return {"batches_per_s": 0.0, "batches_total": 0, "shared_batches": 0, "errors": []}
        shards = self._local if kind == "local" else self._remote[:n]
        links = ShardLinks.on_worker(shards, self._worker)
        inq: queue.Queue = queue.Queue(maxsize=16)
        pf = ReplayPrefetcher(
            links,
            inq,
            batch_size=batch,
            prefetch_per_shard=4,
            shared_memory=kind == "shm",
            shared_per_call=per_call,
        )
        loop = self._worker.loop.asyncio_loop
        stop, counts = threading.Event(), {"taken": 0, "warm": 0}
        staging: dict[str, np.ndarray] = {}

        def consume() -> None:
            t_warm = time.perf_counter() + min(1.0, seconds / 4)
            while not stop.is_set():
                try:
                    b = inq.get(timeout=0.05)
                except queue.Empty:
                    continue
                pf.taken(loop)
                if copy:
                    for key, value in b.data.items():
                        buf = staging.get(key)
                        if buf is None or buf.shape != value.shape:
                            buf = staging[key] = np.empty_like(value)
                        np.copyto(buf, value)
                b.release()
                counts["taken"] += 1
                if time.perf_counter() < t_warm:
                    counts["warm"] = counts["taken"]
                    counts["t0"] = time.perf_counter()

        thread = threading.Thread(target=consume, daemon=True)
        pf.start(thread_alive=thread.is_alive)
        thread.start()
        t_start = time.perf_counter()
        while time.perf_counter() - t_start < seconds:
            await __import__("asyncio").sleep(0.05)
        t_end = time.perf_counter()
        taken = counts["taken"]
        stop.set()
        await pf.stop(timeout_s=10.0)
        thread.join(5.0)
        while not inq.empty():
            inq.get_nowait().release()
        pf.close()
        t0 = counts.get("t0", t_start)
        return {
            "batches_per_s": (taken - counts["warm"]) / max(t_end - t0, 1e-9),
            "batches_total": taken,
            "shared_batches": pf.shared_batches,
            "errors": list(pf.errors),
        }


def quiet_2_cores(cpu: dict[str, float]) -> float:
    """x2 / x1 batches/s on 2 idle cores, from the CPU seconds per batch of each side."""
    shard, learner = cpu["shard"], cpu["learner"]
    x1 = min(1 / shard, 2 / (shard + learner), 1 / max(learner, 1e-9))
    x2 = min(2 / shard, 2 / (shard + learner), 1 / max(learner, 1e-9))
    return x2 / x1


def fill(client, shards, items: int, seed: int) -> None:
    from replay_frames import AtariLikeEpisodes, K

    from apex_dask.algo.replay.codec import encode_batch

    rng = np.random.default_rng(seed)
    episodes = AtariLikeEpisodes(rng)
    done = 0
    while done < items:
        frag = episodes.fragment(50)
        enc = encode_batch(frag, K)
        prios = rng.random(len(frag["reward"])) + 0.1
        for s in shards:
            s.add(enc, prios).result()
        done += len(frag["reward"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="window per measurement")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds of all configs")
    ap.add_argument("--batch", type=int, default=512)
    ap.add_argument("--items", type=int, default=5000, help="items per shard")
    ap.add_argument("--copy", action="store_true", help="the consumer copies each batch")
    ap.add_argument("--per-call", type=int, default=2, help="shm batches per sample call")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    from distributed import Client, LocalCluster

    from apex_dask.runtime.actors import ReplayShardActor

    load_before = os.getloadavg()
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=None) as cluster:
        with Client(cluster, direct_to_workers=True) as client:
            workers = sorted(client.scheduler_info()["workers"])

            def shard(k: int, where: str):
                return client.submit(
                    ReplayShardActor, k, 65536, frame_stack=4, batch_size=args.batch,
                    learning_starts=1, seed=k, shared_slots=8, actor=True, workers=[where],
                    allow_other_workers=False, pure=False,
                ).result()  # fmt: skip

            local = shard(0, workers[0])
            remote = [shard(1, workers[1]), shard(2, workers[2])]
            fill(client, [local, *remote], args.items, seed=0)
            sink = client.submit(
                BatchSink, local, remote, actor=True, workers=[workers[0]], pure=False
            ).result()
            runs: dict[str, list[dict]] = {f"{k} x{n}": [] for k, n in CONFIGS}
            idle: list[dict[str, float]] = []  # CPU s per wall s of each process, idle
            for r in range(args.rounds):
                t0, cpu0 = time.perf_counter(), client.run(time.process_time)
                sink.measure("idle", 0, min(args.seconds, 2.0), 0, False, 0).result()
                t1, cpu1 = time.perf_counter(), client.run(time.process_time)
                idle.append({w: (cpu1[w] - cpu0[w]) / (t1 - t0) for w in workers})
                for kind, n in CONFIGS:
                    t0, cpu0 = time.perf_counter(), client.run(time.process_time)
                    res = sink.measure(
                        kind, n, args.seconds, args.batch, args.copy, args.per_call
                    ).result()
                    t1, cpu1 = time.perf_counter(), client.run(time.process_time)
                    # minus what the process uses idle in that time (heartbeats, monitors)
                    used = {w: cpu1[w] - cpu0[w] - idle[-1][w] * (t1 - t0) for w in workers}
                    got = max(res["batches_total"], 1)
                    res["learner_cpu_s_per_batch"] = used[workers[0]] / got
                    res["shard_cpu_s_per_batch"] = (
                        0.0 if kind == "local" else sum(used[w] for w in workers[1 : 1 + n]) / got
                    )
                    res["load_avg_1min"] = os.getloadavg()[0]
                    runs[f"{kind} x{n}"].append(res)
                    print(
                        f"round {r + 1} {kind} x{n}: {res['batches_per_s']:.1f} batches/s, "
                        f"CPU/batch: learner process {1e3 * res['learner_cpu_s_per_batch']:.1f} "
                        f"ms, shards {1e3 * res['shard_cpu_s_per_batch']:.1f} ms, "
                        f"load {res['load_avg_1min']:.1f}",
                        flush=True,
                    )
            for s in (local, *remote):  # unlink their shared-memory blocks
                s.close().result()
    med = {k: statistics.median(r["batches_per_s"] for r in v) for k, v in runs.items()}
    # per round: x2 over x1 of the neighbouring windows, then the median of those
    ratio = {
        kind: statistics.median(
            a["batches_per_s"] / max(b["batches_per_s"], 1e-9)
            for a, b in zip(runs[f"{kind} x2"], runs[f"{kind} x1"], strict=True)
        )
        for kind in ("tcp", "shm")
    }
    cpu = {
        k: {
            side: statistics.median(r[f"{side}_cpu_s_per_batch"] for r in v)
            for side in ("learner", "shard")
        }
        for k, v in runs.items()
    }
    quiet = {kind: quiet_2_cores(cpu[f"{kind} x2"]) for kind in ("tcp", "shm")}
    print(f"\n{'config':<9} {'batches/s':>10} {'learner CPU ms/b':>17} {'shard CPU ms/b':>15}")
    for k in runs:
        c = cpu[k]
        print(f"{k:<9} {med[k]:>10.1f} {1e3 * c['learner']:>17.2f} {1e3 * c['shard']:>15.2f}")
    print(
        f"x2/x1 measured (load {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores): "
        f"tcp {ratio['tcp']:.2f}, shm {ratio['shm']:.2f}"
    )
    print(
        f"x2/x1 a quiet 2-core machine allows (from CPU per batch): "
        f"tcp {quiet['tcp']:.2f}, shm {quiet['shm']:.2f} (target shm >= 1.8)"
    )
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "batch": args.batch,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "copy": args.copy,
        "per_call": args.per_call,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "median_batches_per_s": med,
        "x2_over_x1": ratio,
        "cpu_s_per_batch": cpu,
        "idle_cpu_s_per_s": idle,
        "x2_over_x1_quiet_2_cores": quiet,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
