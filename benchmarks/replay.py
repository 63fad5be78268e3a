"""Replay shard throughput: ``ReplayShard`` vs cpprb vs the bare gather floor.

    OPENBLAS_NUM_THREADS=1 python benchmarks/replay.py [--quick] [--out PATH]

Workloads (alpha=0.6, beta=0.4, eps=1e-6, shards pre-filled with random
priorities):

- vector: capacity 2^20, obs/next_obs float32[8], action int64, reward
  float32, done bool (also run with the shard's pure-numpy fallback);
- image: capacity 2^17, obs/next_obs uint8[84, 84, 4], same other keys.

Operations, each timed as ops/s of thread CPU time (median over interleaved
rounds; CPU time, not wall time, because the benchmark machine is shared):

- ``add``: store 50 transitions (default priorities);
- ``sample``: ``sample(512, beta)``, including the gather of all keys;
- ``update``: ``update_priorities`` of 512 random indices;
- ``cycle``: one learner cycle = 1 sample(512) + 1 update(512) + 10 add(50).

The floor is the bare memory work with no prioritization at all: ``add`` =
one 50-row slice copy into each key's array, ``sample`` = ``np.take`` of 512
random rows from each key's array, ``update`` = 512 random writes into a
float64 array, ``cycle`` = sample + update + 10 adds. Every implementation
keeps its last sampled batch alive until its next sample, as a learner does,
so all pay the same memory-allocation pattern. cpprb's
``PrioritizedReplayBuffer`` runs the same workload when importable (its adds
are split at the ring end to avoid its wrap-around bug).

- stacked (``replay_frames.py``): capacity 2^17, uint8 (4, 84, 84) frame
  stacks of real n-step fragments, stored whole vs each frame once; memory
  per item, wire bytes per transition, cycle rates.

``--baseline-replay PATH`` times another version's ``ReplayShard`` (its
``replay.py``, e.g. from ``git show REV:apex_dask/algo/replay/shard.py``) beside
the vector variant.

Also measured: drift (100k random priority updates, then every tree node
against a full rebuild) and the cold start in a fresh process (import plus
the first add/sample/update, numba cache warm).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import gc  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from apex_dask.algo.replay.shard import ReplayShard  # noqa: E402

try:
    import cpprb
except ImportError:  # optional, benchmark-only
    cpprb = None

ALPHA, BETA, EPS = 0.6, 0.4, 1e-6
BATCH, ADD_N, ADDS_PER_CYCLE = 512, 50, 10
OPS = ("add", "sample", "update", "cycle")


def make_batch(rng: np.random.Generator, n: int, obs_shape: tuple, obs_dtype) -> dict:
    if np.dtype(obs_dtype) == np.uint8:
        obs = rng.integers(0, 256, (n, *obs_shape), dtype=np.uint8)
        nxt = rng.integers(0, 256, (n, *obs_shape), dtype=np.uint8)
    else:
        obs = rng.standard_normal((n, *obs_shape), dtype=np.float32)
        nxt = rng.standard_normal((n, *obs_shape), dtype=np.float32)
    return {
        "obs": obs,
        "action": rng.integers(0, 18, n, dtype=np.int64),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "next_obs": nxt,
        "done": rng.random(n) < 0.01,
    }


class Ours:
    def __init__(
        self, capacity: int, seed: int, backend: str = "auto", cls=ReplayShard, name=None
    ) -> None:
        self.shard = cls(capacity, alpha=ALPHA, eps=EPS, seed=seed, backend=backend)
        self.name = name or ("ours" if backend == "auto" else f"ours-{backend}")

    def prefill(self, chunk: dict, prios: np.ndarray) -> None:
        self.shard.add(chunk, priorities=prios)

    def add(self, batch: dict) -> None:
        self.shard.add(batch)

    def sample(self) -> np.ndarray:
        self.last = self.shard.sample(BATCH, BETA)  # held until the next sample, as a learner does
        return self.last.indices

    def update(self, idx: np.ndarray, prios: np.ndarray) -> None:
        # a cycle's update names the sample's items (generations), as the learner's does
        last = getattr(self, "last", None)
        gen = last.generations if last is not None and idx is last.indices else None
        self.shard.update_priorities(idx, prios, gen)


class Cpprb:
    name = "cpprb"

    def __init__(self, capacity: int, example: dict) -> None:
        env = {k: {"shape": v.shape[1:] or 1, "dtype": v.dtype} for k, v in example.items()}
        self.capacity = capacity
        self.rb = cpprb.PrioritizedReplayBuffer(capacity, env, alpha=ALPHA, eps=EPS)

    def _add(self, batch: dict, prios: np.ndarray | None) -> None:
        n = len(batch["reward"])
        first = self.capacity - self.rb.get_next_index()
        if n <= first:
            self.rb.add(**batch, **({} if prios is None else {"priorities": prios}))
            return
        for sl in (slice(0, first), slice(first, n)):  # split at the ring end
            part = {k: v[sl] for k, v in batch.items()}
            self.rb.add(**part, **({} if prios is None else {"priorities": prios[sl]}))

    def prefill(self, chunk: dict, prios: np.ndarray) -> None:
        self._add(chunk, prios)

    def add(self, batch: dict) -> None:
        self._add(batch, None)

    def sample(self) -> np.ndarray:
        self.last = self.rb.sample(BATCH, beta=BETA)
        return self.last["indexes"]

    def update(self, idx: np.ndarray, prios: np.ndarray) -> None:
        self.rb.update_priorities(idx, prios)


class Floor:
    """Bare memory work: slice copies, np.take of random rows, random writes."""

    name = "floor"

    def __init__(self, capacity: int, example: dict, rng: np.random.Generator, borrow=None) -> None:
        self.capacity = capacity
        self.arrays = {
            k: np.empty((capacity, *v.shape[1:]), v.dtype) if k not in (borrow or {}) else borrow[k]
            for k, v in example.items()
        }
        self.prio = np.zeros(capacity)
        self.pos = 0
        # 1024 index arrays (half a million rows): rows are not reused from cache.
        self.indices = [rng.integers(0, capacity, BATCH) for _ in range(1024)]
        self.i = 0

    def prefill(self, chunk: dict, prios: np.ndarray) -> None:
        n = len(prios)
        for k, v in chunk.items():
            self.arrays[k][self.pos : self.pos + n] = v
        self.prio[self.pos : self.pos + n] = prios
        self.pos = (self.pos + n) % self.capacity

    def add(self, batch: dict) -> None:
        pos = self.pos
        for k, v in batch.items():
            self.arrays[k][pos : pos + ADD_N] = v
        self.pos = pos + ADD_N if pos + 2 * ADD_N <= self.capacity else 0

    def sample(self) -> np.ndarray:
        self.i = (self.i + 1) % len(self.indices)
        idx = self.indices[self.i]
        self.last = {k: v.take(idx, axis=0) for k, v in self.arrays.items()}
        return idx

    def update(self, idx: np.ndarray, prios: np.ndarray) -> None:
        self.prio[idx] = prios


def build(impl, capacity: int, example_chunk: dict, rng: np.random.Generator) -> None:
    """Fill to capacity in chunks of the example, with random |TD|-like priorities."""
    n = len(example_chunk["reward"])
    for _ in range(capacity // n):
        impl.prefill(example_chunk, np.abs(rng.standard_normal(n)) + 1e-3)


def op_functions(impl, batches: list, idx_pool: list, prio_pool: list) -> dict:
    """One call of each timed operation on ``impl``, cycling through input pools."""
    state = {"k": 0}

    def add():
        state["k"] += 1
        impl.add(batches[state["k"] % len(batches)])

    def update():
        state["k"] += 1
        impl.update(idx_pool[state["k"] % len(idx_pool)], prio_pool[state["k"] % len(prio_pool)])

    def cycle():
        state["k"] += 1
        k = state["k"]
        impl.update(impl.sample(), prio_pool[k % len(prio_pool)])
        for j in range(ADDS_PER_CYCLE):
            impl.add(batches[(k + j) % len(batches)])

    return {"add": add, "sample": impl.sample, "update": update, "cycle": cycle}


def time_ops(impls: list, batches: list, reps: dict, rounds: int, capacity: int, rng) -> dict:
    """(median, best) ops/s per implementation and operation.

    Timed in this thread's CPU time, so that time other processes hold the
    shared cores is not counted; each round times every operation on every
    implementation back to back, so that what load remains (caches, memory
    bandwidth) hits them alike; medians over rounds.
    """
    prio_pool = [np.abs(rng.standard_normal(BATCH)) for _ in range(16)]
    idx_pool = [rng.integers(0, capacity, BATCH) for _ in range(1024)]
    fns = {impl.name: op_functions(impl, batches, idx_pool, prio_pool) for impl in impls}
    results = {impl.name: {op: [] for op in OPS} for impl in impls}
    for _ in range(rounds):
        for op in OPS:
            for impl in impls:
                fn = fns[impl.name][op]
                fn()  # warm
                t0 = time.thread_time()
                for _ in range(reps[op]):
                    fn()
                results[impl.name][op].append(reps[op] / (time.thread_time() - t0))
    return {
        name: {op: (float(np.median(v)), float(np.max(v))) for op, v in ops.items()}
        for name, ops in results.items()
    }


def run_variant(name: str, capacity: int, obs_shape: tuple, obs_dtype, args, rng) -> dict:
    chunk = make_batch(
        rng, min(capacity, 4096 if obs_dtype == np.uint8 else 1 << 14), obs_shape, obs_dtype
    )
    batches = [make_batch(rng, ADD_N, obs_shape, obs_dtype) for _ in range(16)]
    image = np.dtype(obs_dtype) == np.uint8
    scale = 0.05 if image else 1.0
    reps = {
        op: max(3, int(r * scale * (0.3 if args.quick else 1)))
        for op, r in {"add": 1500, "sample": 200, "update": 400, "cycle": 60}.items()
    }
    rounds = 5 if args.quick else 15
    out: dict = {
        "capacity": capacity,
        "obs": f"{np.dtype(obs_dtype).name}{list(obs_shape)}",
        "reps": reps,
        "rounds": rounds,
    }
    t0 = time.perf_counter()
    ours = Ours(capacity, seed=1)
    build(ours, capacity, chunk, rng)
    # The image floor works in the shard's own obs arrays (7.4 GB each way otherwise).
    borrow = {k: ours.shard.items.arrays[k] for k in ("obs", "next_obs")} if image else None
    floor = Floor(capacity, chunk, rng, borrow)
    if not image:
        build(floor, capacity, chunk, rng)
    impls = [ours, floor]
    if not image:  # the pure-numpy fallback, for reference
        fallback = Ours(capacity, seed=2, backend="numpy")
        build(fallback, capacity, chunk, rng)
        impls.append(fallback)
    if not image and args.baseline_replay:  # an older ReplayShard, interleaved
        before = Ours(capacity, seed=1, cls=_load_shard_class(args.baseline_replay), name="before")
        build(before, capacity, chunk, rng)
        impls.append(before)
    separate_cpprb = image  # 7.4 GB per buffer: cpprb runs after ours is freed
    if cpprb is not None and not separate_cpprb:
        cp = Cpprb(capacity, chunk)
        build(cp, capacity, chunk, rng)
        impls.append(cp)
    out["prefill_s"] = time.perf_counter() - t0
    rates = time_ops(impls, batches, reps, rounds, capacity, rng)
    if cpprb is not None and separate_cpprb and not args.skip_image_cpprb:
        del impls, ours, floor
        gc.collect()
        cp = Cpprb(capacity, chunk)
        build(cp, capacity, chunk, rng)
        rates.update(time_ops([cp], batches, reps, rounds, capacity, rng))
        out["cpprb_note"] = "measured after ours and floor were freed (memory), not interleaved"
        del cp
        gc.collect()
    out["ops_per_s"] = {n: {op: m for op, (m, _) in ops.items()} for n, ops in rates.items()}
    out["best_ops_per_s"] = {n: {op: b for op, (_, b) in ops.items()} for n, ops in rates.items()}
    rates = out["ops_per_s"]
    # ours time / floor time (= floor rate / ours rate); ours rate / cpprb rate
    out["ours_time_over_floor"] = {op: rates["floor"][op] / rates["ours"][op] for op in OPS}
    if "cpprb" in rates:
        out["ours_rate_over_cpprb"] = {op: rates["ours"][op] / rates["cpprb"][op] for op in OPS}
    if "before" in rates:
        out["ours_rate_over_before"] = {op: rates["ours"][op] / rates["before"][op] for op in OPS}
    return out


def _load_shard_class(path: str):
    """``ReplayShard`` from another version's ``replay.py`` (e.g. ``git show REV:...``)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("replay_before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module.ReplayShard


def drift_check(n_updates: int, rng) -> dict:
    """Random priority updates on a 2^20 shard, then every node vs a full rebuild."""
    cap = 1 << 20
    shard = ReplayShard(cap, alpha=ALPHA, eps=EPS, seed=0)
    shard.add(make_batch(rng, cap, (8,), np.float32), priorities=rng.lognormal(0.0, 3.0, cap))
    done = 0
    while done < n_updates:
        idx = rng.integers(0, cap, BATCH)
        shard.update_priorities(idx, rng.lognormal(0.0, 3.0, BATCH))
        done += BATCH
    tree = shard._priorities.tree  # benchmark-only look inside: the tree is not public API
    tree.flush()
    before_sum, before_min = tree.sum_tree.copy(), tree.min_tree.copy()
    tree.rebuild()
    leaves = tree.masses()
    exact = math.fsum(leaves.tolist())
    return {
        "updates": done,
        "nodes": int(before_sum.size),
        "sum_nodes_differing": int(np.count_nonzero(before_sum != tree.sum_tree)),
        "min_nodes_differing": int(np.count_nonzero(before_min != tree.min_tree)),
        "max_abs_diff": float(np.max(np.abs(before_sum - tree.sum_tree))),
        "root_rel_error_vs_exact_sum": abs(float(before_sum[0]) - exact) / exact,
    }


def cold_start() -> dict:
    """Seconds to import the shard and to run its first add/sample/update, in fresh processes.

    ``cached``: the numba kernels load from the on-disk cache (the usual case);
    ``uncompiled``: an empty cache directory, so the kernels compile first.
    """
    code = (
        "import time; t0 = time.perf_counter()\n"
        "import numpy as np\n"
        "from apex_dask.algo.replay.shard import ReplayShard\n"
        "t1 = time.perf_counter()\n"
        "s = ReplayShard(1024, seed=0)\n"
        "b = {k: np.zeros((50, 8) if 'obs' in k else 50, np.float32)\n"
        "     for k in ('obs', 'action', 'reward', 'next_obs', 'done')}\n"
        "s.add(b); r = s.sample(32, 0.4); s.update_priorities(r.indices, np.ones(32))\n"
        "t2 = time.perf_counter(); print(t1 - t0, t2 - t1)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(Path(__file__).resolve().parents[1]))
    out = {}
    with tempfile.TemporaryDirectory() as empty:
        for name, extra in (("cached", {}), ("uncompiled", {"NUMBA_CACHE_DIR": empty})):
            run = subprocess.run(
                [sys.executable, "-c", code],
                capture_output=True,
                text=True,
                env={**env, **extra},
                check=True,
            )
            import_s, first_s = (float(x) for x in run.stdout.split())
            out[name] = {"import_s": import_s, "first_add_sample_update_s": first_s}
    return out


def print_table(name: str, res: dict) -> None:
    rates = res["ops_per_s"]
    cols = [c for c in ("ours", "before", "cpprb", "floor", "ours-numpy") if c in rates]
    print(f"\n{name}: capacity {res['capacity']}, obs {res['obs']}")
    print(
        f"{'op':8s}"
        + "".join(f"{c + ' ops/s':>18s}" for c in cols)
        + f"{'x cpprb rate':>14s}{'x floor time':>14s}"
    )
    for op in OPS:
        row = f"{op:8s}" + "".join(f"{rates[c][op]:18,.0f}" for c in cols)
        vs_cpprb = res.get("ours_rate_over_cpprb", {}).get(op)
        row += f"{vs_cpprb:14.2f}" if vs_cpprb else f"{'-':>14s}"
        print(row + f"{res['ours_time_over_floor'][op]:14.2f}")


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="fewer rounds and repetitions")
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "replay.json"))
    ap.add_argument("--skip-image", action="store_true", help="skip the 7.4 GB image variant")
    ap.add_argument(
        "--skip-image-cpprb", action="store_true", help="skip cpprb in the image variant"
    )
    ap.add_argument("--skip-vector", action="store_true", help="skip the vector variant")
    ap.add_argument(
        "--skip-stacked", action="store_true", help="skip the frame-stacked variant (~10 GB)"
    )
    ap.add_argument("--stacked-capacity", type=int, default=1 << 17)
    ap.add_argument(
        "--baseline-replay",
        metavar="PATH",
        help="a replay.py of another version, timed beside the vector variant",
    )
    args = ap.parse_args(argv)
    rng = np.random.default_rng(0)
    import numba

    result: dict = {
        "benchmark": "replay",
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {
            "cpus": os.cpu_count(),
            "platform": platform.platform(),
            "python": platform.python_version(),
            "numpy": np.__version__,
            "load_average_at_start": os.getloadavg(),
            "numba": numba.__version__,
        },
        "threads": {
            v: os.environ[v]
            for v in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "NUMBA_NUM_THREADS")
        },
        "cpprb_version": getattr(cpprb, "__version__", None) or _dist_version("cpprb"),
        "quick": args.quick,
    }
    if cpprb is None:
        print("cpprb is not importable: its column is skipped (pip install cpprb)")
    targets = {}
    if not args.skip_vector:
        result["vector"] = run_variant("vector", 1 << 20, (8,), np.float32, args, rng)
        print_table("vector", result["vector"])
        v = result["vector"]["ops_per_s"]
        targets["vector cycle <= 4x floor time"] = v["floor"]["cycle"] / v["ours"]["cycle"] <= 4.0
        if "cpprb" in v:
            targets["vector cycle >= 2x cpprb"] = v["ours"]["cycle"] / v["cpprb"]["cycle"] >= 2.0
        if "before" in v:
            targets["vector cycle within 5% of before"] = (
                v["ours"]["cycle"] / v["before"]["cycle"] >= 0.95
            )
    if not args.skip_image:
        result["image"] = run_variant("image", 1 << 17, (84, 84, 4), np.uint8, args, rng)
        print_table("image", result["image"])
    if not args.skip_stacked:
        import replay_frames

        result["stacked"] = replay_frames.run_stacked(args, rng)
        replay_frames.print_stacked(result["stacked"])
        st = result["stacked"]
        targets["stacked dedup cycle >= 0.8x full-stack cycle"] = (
            st["rate_over_full"]["dedup"]["cycle"] >= 0.8
        )
        targets["wire <= 1.3 frames per transition"] = (
            st["wire"]["frames_per_transition_compact"] <= 1.3
        )
        mem = st["memory_bytes_per_item"]["atari (4,84,84) uint8"]["dedup"]
        targets["stacked bytes per item <= 1.25 frames + 64"] = mem <= 1.25 * 84 * 84 + 64
    result["drift"] = drift_check(100_000, rng)
    result["cold_start"] = cold_start()
    if "image" in result:
        im = result["image"]["ops_per_s"]
        targets["image cycle within 1.3x floor time"] = (
            im["floor"]["cycle"] / im["ours"]["cycle"] <= 1.3
        )
    targets["no drift"] = (
        result["drift"]["sum_nodes_differing"] == 0 == result["drift"]["min_nodes_differing"]
    )
    result["targets_met"] = targets
    print(f"\ndrift: {result['drift']}\ncold start: {result['cold_start']}")
    print("targets:", ", ".join(f"{k}: {'met' if ok else 'NOT met'}" for k, ok in targets.items()))
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"wrote {out}")
    return result


def _dist_version(name: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(name)
    except Exception:
        return None


if __name__ == "__main__":
    main()
