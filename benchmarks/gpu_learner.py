"""The GPU learner on a lent machine (one GPU, ~16 cores): one command, under 8 minutes.

    python benchmarks/gpu_learner.py                       # CUDA, the default plan
    python benchmarks/gpu_learner.py --device cpu --smoke  # a dry run, tiny sizes (tests)

For the ``atari`` (Nature CNN, uint8 4x84x84 stacks) and ``minatar`` (bool
10x10xC) networks, at batch 512 and 2048, with ``dqn.amp`` off/bf16 and
``dqn.compile`` off/on:

1. ``plain``: ``Learner.submit`` in a loop on host batches (the pipelined path:
   pinned staging, copy overlapped, results one update later): the limit.
2. ``actor``: the ``LearnerActor`` alone in a Dask run, fed by 2 replay shards
   in their own processes on this host (``learner_host``, shared memory),
   prefilled (Atari-like fragments through the frame-stack storage; MinAtar-shaped
   random items); compile off.
3. ``run``: the whole run, ``train()`` with env workers on the other cores,
   batch 512 and 2048, compile off, amp off and bf16.

Per row: updates/s, ``learner/device_busy``, and ms per update in sampling
(the learner's wait for a batch), transfer (host staging copy + device copy),
compute (device time) and priorities (the wait for results read one update
later). ``--budget-min`` (8) skips what would not fit, said in the table.
Then what to change where a figure is below its target (run >= 0.9x plain,
Nature CNN at batch 512 >= 190 updates/s in the run, device busy >= 0.8).

Writes ``benchmarks/results/gpu_learner.json`` (``--out``); exits 2 with one
line when ``--device cuda`` finds no CUDA device.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse  # noqa: E402
import itertools  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

RESULTS = Path(__file__).parent / "results" / "gpu_learner.json"
TARGETS = {"run_over_plain": 0.9, "atari_512_updates_per_s": 190.0, "device_busy": 0.8}


def fail(message: str) -> None:
    print(f"gpu_learner: {message}", file=sys.stderr)
    raise SystemExit(2)


def plan(args: argparse.Namespace) -> list[tuple[str, dict]]:
    """The measurements, most important first (``--budget-min`` cuts from the end): the
    plain loop without compile, the whole run (Atari at 512 first), the actor alone,
    then the plain loop with compile (it compiles for tens of seconds per row)."""
    nets, batches = args.nets.split(","), [int(b) for b in args.batches.split(",")]
    amps, compiles = args.amp.split(","), [c == "on" for c in args.compile.split(",")]
    grid = [
        {"net": n, "batch": b, "amp": a, "compile": c}
        for n, b, a, c in itertools.product(nets, batches, amps, compiles)
    ]
    phases = args.phases.split(",")
    plain = [g for g in grid if not g["compile"]]
    # the run: amp off first, the smallest batch first (the 190 updates/s target)
    runs = sorted(plain, key=lambda g: (g["amp"] != "off", g["batch"], g["net"] != "atari"))
    jobs = [("plain", g) for g in plain] if "plain" in phases else []
    jobs += [("run", g) for g in runs] if "run" in phases else []
    jobs += [("actor", g) for g in plain] if "actor" in phases else []
    jobs += [("plain", g) for g in grid if g["compile"]] if "plain" in phases else []
    return jobs


def config(net: str, batch: int, amp: str, compile_: bool, device: str, smoke: bool):
    from apex_dask.config import ApexConfig

    over = {
        "learner.batch_size": batch,
        "dqn.amp": amp,
        "dqn.compile": compile_,
        "learner.device": device,
        "replay.capacity": 8 * batch if smoke else 200_000,
        "replay.num_shards": 2,
        "replay.learning_starts": 2 * batch if smoke else 20_000,
        "replay.placement": "learner_host",
        "eval.episodes": 0,
        "checkpoint.interval_s": 0.0,
        "report.min_iter_time_s": 2.0 if smoke else 5.0,
        "report.timesteps_per_iteration": 1,
        "dqn.hiddens": (16,) if smoke else (256,),
    }
    return ApexConfig.preset(net).override(over)


def split_ms(stats: dict, updates_per_s: float) -> dict[str, float]:
    """Milliseconds per update: sampling, transfer, compute, priorities (NaN: not measured)."""
    nan = math.nan
    busy = stats.get("learner/device_busy", nan)
    compute = busy / updates_per_s if updates_per_s > 0 else nan
    if "learner/device_busy" not in stats:  # CPU: the update's own time
        compute = stats.get("learner/grad_s", nan)
    transfer = stats.get("learner/stage_s", nan) + stats.get("learner/h2d_s", nan)
    return {
        "sampling_ms": 1e3 * stats.get("learner/dequeue_s", nan),
        "transfer_ms": 1e3 * transfer,
        "compute_ms": 1e3 * compute,
        "priorities_ms": 1e3 * stats.get("learner/d2h_wait_s", nan),
        "device_busy": busy,
    }


def synthetic_batches(obs_space, batch: int, n: int, rng: np.random.Generator) -> list:
    high = 2 if obs_space.dtype == bool else 256
    out = []
    for _ in range(n):
        obs = rng.integers(0, high, (2 * batch, *obs_space.shape)).astype(obs_space.dtype)
        data = {
            "obs": obs[:batch],
            "next_obs": obs[batch:],
            "action": rng.integers(0, 3, batch),
            "reward": rng.normal(size=batch).astype(np.float32),
            "discount": np.full(batch, 0.97, np.float32),
        }
        out.append((data, np.ones(batch, np.float32)))
    return out


def plain(cfg, spaces, seconds: float, warm: float) -> dict:
    from dataclasses import replace

    from apex_dask.algo.agents.dqn.learner import Learner
    from apex_dask.experiment.builder import agent_spec

    spec = agent_spec(cfg)
    learner = Learner(*spaces, replace(spec.config, pipeline=True), spec.learner)
    batches = synthetic_batches(spaces[0], cfg.learner.batch_size, 4, np.random.default_rng(0))
    t_warm = time.perf_counter()
    k = 0
    while time.perf_counter() - t_warm < warm or k < 3:  # includes compiling
        learner.submit(*batches[k % 4])
        k += 1
    learner.drain()
    t0, k = time.perf_counter(), 0
    while time.perf_counter() - t0 < seconds:
        learner.submit(*batches[k % 4])
        k += 1
    learner.drain()
    wall = time.perf_counter() - t0
    stats = learner.device_stats()
    stats.setdefault("learner/grad_s", wall / k)
    ups = k / wall
    return {"updates_per_s": ups, "warm_s": t0 - t_warm, **split_ms(stats, ups)}


def prefill(client, shards, cfg, spaces, rng) -> None:
    """Fill each shard to its learning start: Atari-like fragments, or random items."""
    need = cfg.replay.shard_learning_starts + cfg.learner.batch_size
    if cfg.replay.frame_stack:
        sys.path.insert(0, str(Path(__file__).parent))
        from replay_frames import AtariLikeEpisodes

        from apex_dask.algo.replay.codec import encode_batch

        episodes = AtariLikeEpisodes(rng)
        frags = [encode_batch(episodes.fragment(50), cfg.replay.frame_stack) for _ in range(20)]
        frags = [{**f, "action": f["action"] % spaces[1].n} for f in frags]  # 18 -> the game's
    else:
        data, _ = synthetic_batches(spaces[0], 500, 1, rng)[0]
        frags = [{**data, "done": np.zeros(500, bool)}]
    for s in shards:
        added = 0
        while added < need:
            frag = frags[(added // 50) % len(frags)]
            n = len(frag["reward"])
            s.add(frag, rng.random(n) + 0.1).result()
            added += n


def actor(client, workers, cfg, spaces, seconds: float, warm: float) -> dict:
    from apex_dask.experiment.builder import agent_spec, shard_actor_kwargs
    from apex_dask.runtime.actors import LearnerActor, ReplayShardActor

    lr = cfg.learner
    sub = dict(actor=True, pure=False, allow_other_workers=False)
    shards = [
        client.submit(
            ReplayShardActor, k, **shard_actor_kwargs(cfg, k), workers=[workers[1 + k]], **sub
        ).result()
        for k in range(cfg.replay.num_shards)
    ]
    prefill(client, shards, cfg, spaces, np.random.default_rng(1))
    learner = client.submit(
        LearnerActor, *spaces, shards, agent=agent_spec(cfg),
        batch_size=lr.batch_size, inqueue_size=lr.inqueue_size,
        prefetch_per_shard=lr.prefetch_per_shard, shared_memory=True,
        workers=[workers[0]], **sub,
    ).result()  # fmt: skip
    learner.start().result()
    time.sleep(warm)
    s0, t0 = learner.stats().result(), time.perf_counter()
    time.sleep(seconds)
    s1, t1 = learner.stats().result(), time.perf_counter()
    learner.close().result()
    for s in shards:
        s.close().result()
    if s1.get("thread_error"):
        fail(f"the learner thread failed: {s1['thread_error']}")
    ups = (s1["learner/updates"] - s0["learner/updates"]) / (t1 - t0)
    return {
        "updates_per_s": ups,
        "shared_batches": s1["learner/shared_batches"],
        **split_ms(s1, ups),
    }


def whole_run(client, cfg, seconds: float) -> dict:
    from apex_dask.runtime.orchestration.driver import train

    n_env = max(1, len(client.scheduler_info()["workers"]) - 1 - cfg.replay.num_shards)
    cfg = cfg.override({"workers.num_workers": n_env})
    results = train(cfg, client, stop={"time_s": seconds})
    last = [r for r in results if r.get("learner/updates", 0) > 0][-2:]
    if not last:
        return {"updates_per_s": 0.0, "note": "no update within the run"}
    mean = {k: float(np.mean([r.get(k, math.nan) for r in last])) for k in last[-1]}
    ups = mean["learner/updates_per_s"]
    return {"updates_per_s": ups, "env_steps_per_s": mean["env/steps_per_s"], **split_ms(mean, ups)}


def advice(rows: list[dict]) -> list[str]:
    """What to change where a figure is below its target."""
    out = []
    by = {(r["phase"], r["net"], r["batch"], r["amp"], r["compile"]): r for r in rows}
    for r in rows:
        key = f"{r['net']} batch {r['batch']} amp {r['amp']}"
        if "updates_per_s" not in r:
            continue
        limit = by.get(("plain", r["net"], r["batch"], r["amp"], False))
        if r["phase"] != "plain" and limit and limit.get("updates_per_s"):
            ratio = r["updates_per_s"] / limit["updates_per_s"]
            r["over_plain"] = ratio
            if ratio < TARGETS["run_over_plain"]:
                hint = (
                    "sampling starves it: more shard processes (replay.num_shards with "
                    "replay.placement: learner_host)"
                    if r["sampling_ms"] > 0.2 * (1e3 / max(r["updates_per_s"], 1e-9))
                    else "host overhead per update: check learner/stage_s and grad_s"
                )
                out.append(f"{r['phase']} {key}: {ratio:.2f}x the plain loop (< 0.9): {hint}")
        per_update_ms = 1e3 / max(r["updates_per_s"], 1e-9)
        if r.get("transfer_ms", 0.0) > 0.3 * per_update_ms:
            out.append(
                f"{r['phase']} {key}: transfer takes {r['transfer_ms']:.1f} of "
                f"{per_update_ms:.1f} ms per update: the host copy into the pinned buffers "
                "(learner/stage_s) bounds it; copy straight from page-locked shared memory"
            )
        busy = r.get("device_busy", math.nan)
        if math.isfinite(busy) and busy < TARGETS["device_busy"]:
            out.append(
                f"{r['phase']} {key}: device busy {busy:.2f} (< 0.8): a bigger batch, "
                "dqn.compile: true, or feed it faster (see sampling ms)"
            )
        if r["phase"] == "run" and r["net"] == "atari" and r["batch"] == 512:
            if r["updates_per_s"] < TARGETS["atari_512_updates_per_s"]:
                out.append(
                    f"run {key}: {r['updates_per_s']:.0f} updates/s (< 190): raise "
                    "replay.num_shards (sampling) or try dqn.amp: bf16"
                )
    for r in rows:
        base = by.get(("plain", r["net"], r["batch"], r["amp"], False))
        if r["phase"] == "plain" and r["compile"] and base and r.get("updates_per_s"):
            gain = r["updates_per_s"] / max(base.get("updates_per_s", 0.0), 1e-9)
            if gain > 1.1:
                out.append(f"{r['net']} batch {r['batch']} amp {r['amp']}: compile gives "
                           f"{gain:.2f}x in the plain loop: set dqn.compile: true")  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (the measurement) or cpu (dry run)")
    ap.add_argument("--smoke", action="store_true", help="tiny sizes and windows (a dry run)")
    ap.add_argument("--phases", default="plain,actor,run")
    ap.add_argument("--nets", default="atari,minatar")
    ap.add_argument("--batches", default=None, help="default 512,2048 (smoke: 8,16)")
    ap.add_argument("--amp", default="off,bf16")
    ap.add_argument("--compile", default=None, help="off,on (smoke: off)")
    ap.add_argument("--seconds", type=float, default=None, help="window per measurement")
    ap.add_argument("--budget-min", type=float, default=8.0)
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        fail(f"no CUDA device (torch {torch.__version__} sees none); run it on the GPU "
             "machine, or --device cpu --smoke for a dry run")  # fmt: skip
    args.batches = args.batches or ("8,16" if args.smoke else "512,2048")
    args.compile = args.compile or ("off" if args.smoke else "off,on")
    window = args.seconds or (0.3 if args.smoke else 3.0)
    t_start, rows = time.perf_counter(), []
    budget = 60 * args.budget_min
    from apex_dask.algo.envs.probe import probe_spaces
    from apex_dask.experiment.builder import env_factory

    spaces = {n: probe_spaces(env_factory(config(n, 8, "off", False, "cpu", True))) for n in
              args.nets.split(",")}  # fmt: skip
    cluster = client = None
    run_s = 6.0 if args.smoke else 35.0
    try:
        for phase, g in plan(args):
            cfg = config(g["net"], g["batch"], g["amp"], g["compile"], args.device, args.smoke)
            row = {"phase": phase, **g}
            need = {"plain": 3 * window + 25 * g["compile"], "actor": 4 * window + 15}[phase] \
                if phase != "run" else run_s + 25  # fmt: skip
            if budget - (time.perf_counter() - t_start) < need:
                row["skipped"] = "over the budget"
            elif phase == "plain":
                row.update(plain(cfg, spaces[g["net"]], window, 20.0 if g["compile"] else 1.0))
            else:
                if client is None:
                    cluster, client = start_cluster(4 if args.smoke else os.cpu_count() or 4)
                workers = sorted(client.scheduler_info()["workers"])
                if phase == "actor":
                    row.update(actor(client, workers, cfg, spaces[g["net"]], 2 * window, window))
                else:
                    row.update(whole_run(client, cfg, run_s))
            rows.append(row)
            print(row, flush=True)
    finally:
        if client is not None:
            client.close()
            cluster.close()
    tips = advice(rows)
    print_table(rows, tips)
    out = {
        "device": torch.cuda.get_device_name() if args.device.startswith("cuda") else "cpu",
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "torch": torch.__version__,
        "command": " ".join(sys.argv),
        "total_s": time.perf_counter() - t_start,
        "targets": TARGETS,
        "rows": rows,
        "advice": tips,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out} ({out['total_s']:.0f} s)")


def start_cluster(n: int) -> tuple:
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=n, threads_per_worker=1, dashboard_address=":0", resources={"GPU": 1}
    )
    return cluster, Client(cluster)


def print_table(rows: list[dict], tips: list[str]) -> None:
    head = f"{'phase':<6} {'net':<8} {'batch':>5} {'amp':<4} {'comp':<4} {'upd/s':>8} {'busy':>5}"
    print(f"\n{head} {'sample':>7} {'xfer':>6} {'comp':>6} {'prio':>6}  (ms per update)")
    for r in rows:
        cells = f"{r['phase']:<6} {r['net']:<8} {r['batch']:>5} {r['amp']:<4} "
        cells += f"{'on' if r['compile'] else 'off':<4} "
        if "skipped" in r:
            print(cells + f"skipped ({r['skipped']})")
            continue
        ms = [r.get(k, math.nan) for k in ("sampling_ms", "transfer_ms", "compute_ms")]
        ms.append(r.get("priorities_ms", math.nan))
        print(cells + f"{r['updates_per_s']:>8.1f} {r.get('device_busy', math.nan):>5.2f} "
              + " ".join(f"{v:>6.2f}" for v in ms))  # fmt: skip
    print("\nwhat to change:" if tips else "\nevery figure meets its target")
    for t in tips:
        print(f"- {t}")


if __name__ == "__main__":
    main()
