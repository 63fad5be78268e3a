"""How far one driver goes: simulated env workers swept over the actor count.

    nice python benchmarks/scale.py [--actors 8 32 96 192 360] [--mode cartpole|atari]
        [--window-s 20] [--warmup-s 8] [--steps-per-s 35] [--label L] [--plot PNG]

Each point starts its own processes (``scale_cluster.py``): a ``dask scheduler``, a
``learner`` worker (the learner and its replay shards, as the default placement puts
them) and ``--env-processes`` env-worker processes holding every simulated env worker
(``simulate.env_steps_per_s``: prebuilt rollouts of the env's spaces at a set rate,
no env or network work); this process is the driver (``ApexDriver``). Everything but
the env work is the real run: the plan, Dask's actor calls, the shards, the weight
syncs, a learner that trains (CartPole-sized: batch 64, capped at
``--replay-ratio`` transitions trained per transition added) or, Atari-sized, one
that never starts (a Nature CNN on CPU; rollouts of 84x84 frame stacks in the
compact wire form, each frame once).

After ``--warmup-s`` a window of ``--window-s`` is measured: rollouts/s offered
(actors x rate / fragment), made and stored; each process's CPU (``psutil``:
driver, scheduler, learner process, env processes) in cores and in milliseconds
per stored rollout; the shards' ingest seconds (``replay/<k>/add_s``); weight-sync
bytes/s; policy lag; p50/p99 seconds from a rollout being made to its shard's
reply; driver and scheduler memory; after the halt, rollouts sent minus stored
and batches lost (both must be 0). Prints a table, writes JSON (default
``benchmarks/results/scale.json``, points keyed by ``--label`` and actor count)
and, with ``--plot``, a PNG of every label in the JSON.
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from scale_cluster import ProcessCluster, cpu_snapshot, undo_fixes  # noqa: E402
from scale_model import print_model  # noqa: E402

from apex_dask.config import ApexConfig  # noqa: E402

OUT = Path(__file__).parent / "results" / "scale.json"
FRAGMENT = 50  # env steps per rollout (RLlib's Ape-X rollout_fragment_length)


def scale_config(
    mode: str,
    actors: int,
    steps_per_s: float,
    replay_ratio: float,
    relays: bool = True,
    relay_max_age_s: float = 0.0,
) -> ApexConfig:
    """RLlib's Ape-X shape (4 shards, fragments of 50, a sync every 400 steps), one env
    per actor as in the paper, simulated env workers."""
    common = {
        "workers.num_workers": actors,
        "workers.envs_per_worker": 1,
        "workers.rollout_fragment_length": FRAGMENT,
        "workers.max_weight_sync_delay": 400,
        "simulate.env_steps_per_s": steps_per_s,
        "replay.num_shards": 4,
        "eval.episodes": 0,
        "report.min_iter_time_s": 2.0,
        "report.timesteps_per_iteration": 0,
        "topology.learner_worker": "learner",
        "topology.call_timeout_s": 60.0,
        "checkpoint.interval_s": 0.0,
        "topology.weight_relays": relays,
        "topology.weight_relay_max_age_s": relay_max_age_s,
    }
    if mode == "atari":
        return ApexConfig.preset("atari").override(
            {
                **common,
                "replay.capacity": 300_000,
                "replay.learning_starts": 300_000,
                "learner.max_replay_ratio": 0.001,  # a Nature CNN on CPU: no updates
            }
        )
    return ApexConfig().override(
        {
            **common,
            "env.env_id": "CartPole-v1",
            "replay.capacity": 1_000_000,
            "replay.learning_starts": 2_000,
            "learner.batch_size": 64,
            "dqn.hiddens": (256, 256),
            "learner.max_replay_ratio": replay_ratio,
        }
    )


def _sum(result: dict[str, float], prefix: str, suffix: str) -> float:
    return sum(v for k, v in result.items() if k.startswith(prefix) and k.endswith(suffix))


def _flow(driver: Any) -> dict[str, float]:
    """Stored rollouts and shard ingest seconds now, summed over the shards; the weights
    blobs and bytes the learner has handed out and its version, asked of it now."""
    stats = driver.shard_stats()
    learner = driver._state.learner.stats().result(timeout=120)  # noqa: SLF001
    return {
        "stored": sum(_sum(st, "replay/", "/rollouts_stored") for st in stats),
        "add_s": sum(_sum(st, "replay/", "/add_s") for st in stats),
        "weight_sends": float(learner["learner/weight_sends"]),
        "weight_bytes_sent": float(learner["learner/weight_bytes_sent"]),
        "version": float(learner["learner/version"]),
    }


def point(args: argparse.Namespace, actors: int) -> dict[str, Any]:
    from apex_dask.runtime.orchestration.driver import ApexDriver

    cfg = scale_config(
        args.mode,
        actors,
        args.steps_per_s,
        args.replay_ratio,
        not args.no_relays,
        args.relay_max_age_s,
    )
    cluster = ProcessCluster(args.env_processes, hosts=args.hosts)
    t_start = time.monotonic()
    client = cluster.start()
    pids = cluster.pids()
    out: dict[str, Any] = {"actors": actors, "mode": args.mode}
    try:
        with ApexDriver(cfg, client) as driver:
            results: list[tuple[float, dict[str, float]]] = []  # (arrival, result)
            stop = threading.Event()

            def consume() -> None:  # results never queue up behind the measurement
                for r in driver.iterate(stop_check=stop.is_set):
                    results.append((time.monotonic(), r))

            reader = threading.Thread(target=consume, daemon=True)
            reader.start()
            while not results:
                time.sleep(0.2)
            out["startup_s"] = time.monotonic() - t_start
            time.sleep(args.warmup_s)
            t0 = time.monotonic()
            driver.env_transport()  # clears what the warm-up timed
            t0 = (t0 + time.monotonic()) / 2  # each worker's window starts in this call
            f0, c0, w0 = _flow(driver), cpu_snapshot(pids), time.monotonic()
            time.sleep(args.window_s)
            c1, w1, f1 = cpu_snapshot(pids), time.monotonic(), _flow(driver)
            t1 = time.monotonic()
            transport = driver.env_transport()
            out["transport_span_s"] = (t1 + time.monotonic()) / 2 - t0
            stop.set()
            reader.join(timeout=30)
            final = driver.halt()
        window = [r for t, r in results if w0 <= t <= w1]
        spans = (w1 - w0, out["transport_span_s"])
        out |= summarize(args, actors, window, transport, (f0, f1), (c0, c1), spans, final)
    finally:
        client.close()
        cluster.close()
    return out


def summarize(args, actors, window, transport, flows, cpus, spans, final) -> dict[str, Any]:
    """One point's row from the window's flows, CPU snapshots and results; ``spans``: the
    window's wall seconds and the (longer) seconds the env workers' transport covers."""
    (f0, f1), (c0, c1), (wall, tspan) = flows, cpus, spans
    stored = (f1["stored"] - f0["stored"]) / wall
    cores = {n: (c1[n]["cpu_s"] - c0[n]["cpu_s"]) / wall for n in c0}
    env_cores = sum(v for n, v in cores.items() if n.startswith("env-"))
    lat = np.array([x for t in transport for x in t["store_s"]], float)
    add_s = f1["add_s"] - f0["add_s"]
    lags = [r.get("sync/policy_lag", float("nan")) for r in window]
    trained = [r["learner/steps_trained"] for r in window]
    span = window[-1]["time_s"] - window[0]["time_s"] if len(window) > 1 else math.nan
    sent, kept = final.get("flow/rollouts_sent", math.nan), final.get("flow/rollouts_stored", 0)
    per = 1e3 / max(stored, 1e-9)
    return {
        "offered_rollouts_per_s": actors * args.steps_per_s / FRAGMENT,
        "made_rollouts_per_s": (
            (window[-1]["flow/rollouts_sent"] - window[0]["flow/rollouts_sent"]) / span
            if len(window) > 1
            else math.nan
        ),
        "stored_rollouts_per_s": stored,
        "stored_transitions_per_s": stored * FRAGMENT,
        "cores": cores,
        "driver_cores": cores["driver"],
        "scheduler_cores": cores["scheduler"],
        "learner_process_cores": cores["learner"],
        "env_process_cores": env_cores,
        "driver_ms_per_rollout": cores["driver"] * per,
        "scheduler_ms_per_rollout": cores["scheduler"] * per,
        "learner_process_ms_per_rollout": cores["learner"] * per,
        "env_ms_per_rollout": env_cores * per,
        "shard_ingest_ms_per_rollout": 1e3 * add_s / max(1.0, stored * wall),
        "shard_ingest_cores": add_s / wall,
        "weight_sync_bytes_per_s": sum(t["weight_sync_bytes"] for t in transport) / tspan,
        # the learner's own counters at the window's edges, over the window's wall seconds
        "learner_weight_bytes_per_s": (f1["weight_bytes_sent"] - f0["weight_bytes_sent"]) / wall,
        "learner_weight_kb_per_s": (f1["weight_bytes_sent"] - f0["weight_bytes_sent"]) / wall / 1e3,
        "learner_weight_sends_per_s": (f1["weight_sends"] - f0["weight_sends"]) / wall,
        "versions_per_s": (f1["version"] - f0["version"]) / wall,
        "relays": window[-1].get("relay/count", 0.0) if window else math.nan,
        "policy_lag": float(np.nanmean(lags)) if lags else math.nan,
        "updates_per_s": (trained[-1] - trained[0]) / span / 64 if len(window) > 1 else math.nan,
        "store_p50_s": float(np.percentile(lat, 50)) if len(lat) else math.nan,
        "store_p99_s": float(np.percentile(lat, 99)) if len(lat) else math.nan,
        "store_samples": int(len(lat)),
        "driver_rss_mb": c1["driver"]["rss"] / 2**20,
        "scheduler_rss_mb": c1["scheduler"]["rss"] / 2**20,
        "dropped_rollouts": sent - kept,
        "batches_lost": final.get("flow/batches_lost", math.nan),
        "window_s": wall,
        "load_avg": list(os.getloadavg()),
    }


COLUMNS = [
    ("actors", "actors", "{:d}"),
    ("offered/s", "offered_rollouts_per_s", "{:.1f}"),
    ("stored/s", "stored_rollouts_per_s", "{:.1f}"),
    ("st/off", None, "{:.2f}"),
    ("drv cores", "driver_cores", "{:.3f}"),
    ("drv ms/r", "driver_ms_per_rollout", "{:.2f}"),
    ("sched ms/r", "scheduler_ms_per_rollout", "{:.2f}"),
    ("lrn ms/r", "learner_process_ms_per_rollout", "{:.2f}"),
    ("env ms/r", "env_ms_per_rollout", "{:.2f}"),
    ("add ms/r", "shard_ingest_ms_per_rollout", "{:.3f}"),
    ("wsync KB/s", None, "{:.0f}"),
    ("lrn wt KB/s", "learner_weight_kb_per_s", "{:.0f}"),
    ("relays", "relays", "{:.0f}"),
    ("lag", "policy_lag", "{:.1f}"),
    ("p50 s", "store_p50_s", "{:.3f}"),
    ("p99 s", "store_p99_s", "{:.3f}"),
    ("drv MB", "driver_rss_mb", "{:.0f}"),
    ("sched MB", "scheduler_rss_mb", "{:.0f}"),
    ("dropped", "dropped_rollouts", "{:.0f}"),
]


def print_table(rows: list[dict[str, Any]]) -> None:
    cells = []
    for r in rows:
        line = []
        for _, key, fmt in COLUMNS:
            if key is None:
                v = (
                    r["stored_rollouts_per_s"] / r["offered_rollouts_per_s"]
                    if fmt.endswith("2f}")
                    else r["weight_sync_bytes_per_s"] / 1e3
                )
            else:
                v = r[key]
            line.append(fmt.format(v) if not (isinstance(v, float) and math.isnan(v)) else "nan")
        cells.append(line)
    widths = [max(len(h), *(len(c[i]) for c in cells)) for i, (h, _, _) in enumerate(COLUMNS)]
    print("  ".join(h.rjust(w) for (h, _, _), w in zip(COLUMNS, widths, strict=True)))
    for c in cells:
        print("  ".join(x.rjust(w) for x, w in zip(c, widths, strict=True)))


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    names = {"before": "CartPole-sized, before the fixes", "after": "CartPole-sized, after"}
    names["atari"] = "Atari-sized (frames once), after"
    for key, run in sorted(report.get("runs", {}).items()):
        label = names.get(key, key)
        pts = sorted(run["points"].values(), key=lambda p: p["actors"])
        xs = [p["actors"] for p in pts]
        ax1.plot(
            xs,
            [p["stored_rollouts_per_s"] / p["offered_rollouts_per_s"] for p in pts],
            "o-",
            label=label,
        )
        ax2.plot(xs, [p["driver_cores"] for p in pts], "o-", label=label)
    ax1.set(xlabel="simulated actors", ylabel="stored / offered rollouts", ylim=(0, 1.1))
    ax2.set(xlabel="simulated actors", ylabel="driver CPU (cores)")
    ax2.axhline(0.5, color="grey", ls="--", lw=1, label="target: half a core")
    for ax in (ax1, ax2):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle("One driver, simulated actors at 35 env steps/s each (2-core machine)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    print(f"wrote {path}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--actors", type=int, nargs="+", default=[8, 32, 96, 192, 360])
    p.add_argument("--mode", choices=["cartpole", "atari"], default="cartpole")
    p.add_argument("--steps-per-s", type=float, default=35.0, help="env steps/s per actor")
    p.add_argument("--env-processes", type=int, default=2)
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--replay-ratio", type=float, default=0.25)
    p.add_argument(
        "--hosts", type=int, default=0,
        help="spread the env processes over this many loopback hosts (127.0.0.2, ...)",
    )  # fmt: skip
    p.add_argument(
        "--no-relays", action="store_true",
        help="topology.weight_relays off: every env worker pulls from the learner",
    )  # fmt: skip
    p.add_argument(
        "--relay-max-age-s", type=float, default=0.0,
        help="topology.weight_relay_max_age_s: how old a relay's copy may be at a sync",
    )  # fmt: skip
    p.add_argument("--label", default=None, help="the run's name in the JSON (default: mode)")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--plot", type=Path, default=None)
    p.add_argument(
        "--undo",
        nargs="*",
        default=[],
        choices=["pool", "taskset", "metrics"],
        help="run the driver without these fixes (docs/scaling.md): before/after in one sweep",
    )
    p.add_argument("--plot-only", action="store_true", help="redraw --plot from --out")
    p.add_argument("--model", default=None, help="print docs/scaling.md's model of this label")
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # the cluster's processes end too
    undo_fixes(args.undo)
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    if args.model is not None:
        report.setdefault("models", {})[args.model] = print_model(report["runs"][args.model])
        args.out.write_text(json.dumps(report, indent=2) + "\n")
        return
    if not args.plot_only:
        label = args.label or args.mode
        run = {
            "command": "python benchmarks/scale.py " + " ".join(sys.argv[1:]),
            "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
            "started": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "undone_fixes": args.undo,
            "points": {},
        }
        old = report.setdefault("runs", {}).get(label, {})
        if old.get("undone_fixes", []) == args.undo:  # more points of the same run
            run["points"] = old.get("points", {})
            run["command"] = old.get("command", run["command"]) + " ; " + run["command"]
        report["runs"][label] = run
        rows = []
        for n in args.actors:
            print(f"-- {n} actors ({args.mode})", flush=True)
            row = point(args, n)
            rows.append(row)
            run["points"][str(n)] = row
            print_table(rows)
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"\nwrote {args.out}")
    if args.plot is not None:
        plot(report, args.plot)


if __name__ == "__main__":
    main()
