"""Replay sampling for the learner: Atari batches/s against the shard processes on its host.

    python benchmarks/sampling_scaling.py [--seconds 4] [--rounds 3] [--batch 512]

One ``LocalCluster`` of 3 worker processes (one thread each): the learner's
process holds a sink actor, the two others one ``ReplayShardActor`` each
(``frame_stack=4``, uint8 4x84x84 stacks, Atari-like fragments from
``replay_frames.AtariLikeEpisodes``); a third shard lives in the learner's
process. The sink runs the learner's real ``ReplayPrefetcher`` (4 requests in
flight per shard, a queue of 16) and a consumer thread that takes each batch,
copies its arrays once (as the CUDA path copies into its pinned staging
buffers; ``--no-copy`` skips it), and releases it (a shared-memory slot).

Configurations, measured in interleaved windows of ``--seconds`` (the machine
may be shared: ratios of neighbouring windows, and the load average, say more
than absolute rates):

- ``local x1``: the shard in the learner's process (``replay.placement:
  learner_process``, the default): the ceiling of one process;
- ``tcp x1``, ``tcp x2``: 1 or 2 shard processes, batches sent whole over
  Dask's TCP (``replay.shared_memory: false``);
- ``shm x1``, ``shm x2``: the same shards handing batches over shared memory.

Prints a table (median batches/s per configuration, x2/x1 ratios) and writes
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

    async def measure(self, kind: str, n: int, seconds: float, batch: int, copy: bool) -> dict:
        from apex_dask.runtime.actors.prefetch import ReplayPrefetcher, ShardLinks

        shards = self._local if kind == "local" else self._remote[:n]
        links = ShardLinks.on_worker(shards, self._worker)
        inq: queue.Queue = queue.Queue(maxsize=16)
        pf = ReplayPrefetcher(
            links, inq, batch_size=batch, prefetch_per_shard=4, shared_memory=kind == "shm"
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
        cpu0 = time.process_time()
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
            "learner_process_cpu_s_per_batch": (time.process_time() - cpu0) / max(taken, 1),
            "shared_batches": pf.shared_batches,
            "errors": list(pf.errors),
        }


def fill(client, shards, items: int, seed: int) -> None:
    from replay_frames import AtariLikeEpisodes, K

    from apex_dask.algo.frame_codec import encode_batch

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
    ap.add_argument("--no-copy", action="store_true", help="the consumer does not copy")
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
            for r in range(args.rounds):
                for kind, n in CONFIGS:
                    res = sink.measure(kind, n, args.seconds, args.batch, not args.no_copy)
                    res = res.result()
                    res["load_avg_1min"] = os.getloadavg()[0]
                    runs[f"{kind} x{n}"].append(res)
                    print(
                        f"round {r + 1} {kind} x{n}: {res['batches_per_s']:.1f} batches/s, "
                        f"learner process {1e3 * res['learner_process_cpu_s_per_batch']:.1f} ms "
                        f"CPU/batch, load {res['load_avg_1min']:.1f}",
                        flush=True,
                    )
    med = {k: statistics.median(r["batches_per_s"] for r in v) for k, v in runs.items()}
    # per round: x2 over x1 of the neighbouring windows, then the median of those
    ratio = {
        kind: statistics.median(
            a["batches_per_s"] / max(b["batches_per_s"], 1e-9)
            for a, b in zip(runs[f"{kind} x2"], runs[f"{kind} x1"], strict=True)
        )
        for kind in ("tcp", "shm")
    }
    print(f"\n{'config':<9} {'batches/s':>10} {'learner CPU ms/batch':>21}")
    for k, v in runs.items():
        cpu = statistics.median(r["learner_process_cpu_s_per_batch"] for r in v)
        print(f"{k:<9} {med[k]:>10.1f} {1e3 * cpu:>21.1f}")
    print(f"x2/x1: tcp {ratio['tcp']:.2f}, shm {ratio['shm']:.2f} (target shm >= 1.8)")
    out = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "batch": args.batch,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "copy": not args.no_copy,
        "load_avg_before": load_before,
        "load_avg_after": os.getloadavg(),
        "median_batches_per_s": med,
        "x2_over_x1": ratio,
        "runs": runs,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
