"""Throughput of the Dask runtime: learner hot path, whole loop vs run_local, scaling.

    OPENBLAS_NUM_THREADS=1 python benchmarks/throughput.py [--quick] [--part P] [--out PATH]

Part ``learner``: the learner alone on prefilled replay (2 shards, batch 64,
the cartpole preset's network). In-process: a loop of sample, update,
update_priorities. Dask: a ``LearnerActor`` with its shards on its own worker
(prefetcher + priority sender on the worker's loop, learner thread). Rounds
alternate; medians. Reports updates/s, busy fraction (seconds in updates /
wall seconds) and CPU milliseconds per update (the whole process: on a
machine shared with other load this is the figure that does not depend on
how much CPU the process happened to get).

Part ``loop``: the whole Ape-X loop, same config (``cartpole`` preset, 2 env
workers, no evaluation, 2 s iterations) for the same wall time in
``run_local`` (one process) and through ``ApexDriver`` on an embedded
``LocalCluster`` (one worker process per core). Means over the iterations
after the warm-up, medians over alternating rounds: env steps/s, learner
updates/s, busy fraction, dequeue/grad times, replay ratio; for Dask also
batches lost, flow consistency after the halt, time producers waited on the
full inqueue, and the CPU cores each process used. Dask runs twice per round:
env workers free-running (Ape-X), and held to run_local's replay ratio
(``min_replay_ratio`` = the preset's ``max_replay_ratio``).

Part ``scaling``: ``ApexSleepy-v0`` (each step sleeps 2 ms, almost no CPU)
with 1, 2, 4, 8 env workers over two worker processes (the learner has a
third; learning never starts: this measures the sampling pipeline env worker
-> shard plus summaries and weight-sync checks). Efficiency(N) = steps/s(N) /
(N * steps/s(1)).

Prints tables and writes JSON (default ``benchmarks/results/throughput.json``;
``--part`` replaces only that part of an existing file).
"""

from __future__ import annotations

import os

for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import math  # noqa: E402
import platform  # noqa: E402
import statistics  # noqa: E402
import time  # noqa: E402
from dataclasses import replace  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import psutil  # noqa: E402
import torch  # noqa: E402

from apex_dask.algo.agents.dqn.learner import Learner  # noqa: E402
from apex_dask.algo.agents.spec import AgentSpec  # noqa: E402
from apex_dask.algo.envs.benchmark import SLEEPY_ID  # noqa: E402
from apex_dask.algo.envs.factory import make_env_factory  # noqa: E402
from apex_dask.algo.envs.probe import probe_spaces  # noqa: E402
from apex_dask.algo.replay.shard import ReplayShard  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import agent_spec  # noqa: E402
from apex_dask.local import run_local  # noqa: E402
from apex_dask.runtime.actors import LearnerActor, ReplayShardActor  # noqa: E402
from apex_dask.runtime.orchestration.cluster import start_local_cluster  # noqa: E402
from apex_dask.runtime.orchestration.driver import ApexDriver  # noqa: E402

OUT = Path(__file__).parent / "results" / "throughput.json"
METRICS = (
    "env/steps_per_s",
    "learner/updates_per_s",
    "learner/busy_frac",
    "learner/dequeue_s",
    "learner/grad_s",
    "learner/replay_ratio",
)


def _mean(xs: list[float]) -> float:
    xs = [x for x in xs if not math.isnan(x)]
    return sum(xs) / len(xs) if xs else math.nan


def summarize(results: list[dict[str, float]], warmup_s: float) -> dict[str, Any]:
    """Mean of each metric over the iterations that ended after ``warmup_s``."""
    warm = [r for r in results if r["time_s"] >= warmup_s and r["learner/updates"] > 0]
    warm = warm or results[-1:]
    out: dict[str, Any] = {m: _mean([r.get(m, math.nan) for r in warm]) for m in METRICS}
    last = results[-1]
    out["iterations_used"] = len(warm)
    out["timesteps_total"] = last["timesteps_total"]
    out["updates_total"] = last["learner/updates"]
    out["batches_lost"] = last.get("flow/batches_lost", 0.0)
    out["enqueue_blocked_s"] = last.get("learner/enqueue_blocked_s", 0.0)
    return out


def _rollout(n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, size=n).astype(np.int64),
        "reward": rng.normal(size=n).astype(np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        "done": np.zeros(n, np.float32),
        "discount": np.full(n, 0.97, np.float32),
    }


def _agent(cfg: ApexConfig) -> AgentSpec:
    spec = agent_spec(cfg)
    return AgentSpec(spec.algo, spec.config, replace(spec.learner, device="cpu", num_threads=1))


def _median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else math.nan


def _cpu_s() -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def _worker_cpu_s(dask_worker: Any = None) -> float:
    t = psutil.Process().cpu_times()
    return t.user + t.system


def learner_only(duration: float, rounds: int) -> dict[str, Any]:
    """The learner hot path alone: prefilled shards, no env workers.

    In-process: sample, update, update_priorities in one loop. Dask: a
    ``LearnerActor`` with its two shards on its own worker (the default
    placement), prefetcher and priority sender on the worker's loop. Rounds
    alternate (local, Dask, local, ...); medians are reported.
    """
    cfg = throughput_config(workers=2)
    b, n = cfg.learner.batch_size, 20_000
    obs_space, act_space = probe_spaces(make_env_factory("CartPole-v1"))
    torch.set_num_threads(1)
    rng = np.random.default_rng(0)
    shards = [ReplayShard(n, seed=k) for k in range(2)]
    for s in shards:
        s.add(_rollout(n, rng))
    agent = _agent(cfg)
    learner = Learner(obs_space, act_space, agent.config, agent.learner)

    def train_for(seconds: float) -> tuple[int, float, float, float]:
        c0, t0, grad, updates = _cpu_s(), time.perf_counter(), 0.0, 0
        while time.perf_counter() - t0 < seconds:
            s = shards[learner.num_updates % 2]
            sample = s.sample(b, 0.4)
            g0 = time.perf_counter()
            td, _ = learner.update(sample.data, sample.weights)
            grad += time.perf_counter() - g0
            s.update_priorities(sample.indices, td, sample.generations)
            updates += 1
        return updates, grad, time.perf_counter() - t0, _cpu_s() - c0

    local_rounds: list[dict[str, float]] = []
    dask_rounds: list[dict[str, float]] = []
    cluster, client = start_local_cluster(1, dashboard_address=":0")
    try:
        where = next(iter(client.scheduler_info()["workers"]))
        futs = [
            client.submit(ReplayShardActor, k, n, batch_size=b, seed=k, actor=True, workers=[where])
            for k in range(2)
        ]
        for f in futs:
            f.result().add(_rollout(n, rng)).result()
        actor = client.submit(
            LearnerActor,
            obs_space,
            act_space,
            futs,
            agent=_agent(cfg),
            batch_size=b,
            actor=True,
            workers=[where],
        ).result()
        for _ in range(rounds):
            train_for(1.0)  # warm-up, as the Dask learner gets below
            updates, grad, wall, cpu = train_for(duration)
            local_rounds.append(
                {
                    "updates_per_s": updates / wall,
                    "busy_frac": grad / wall,
                    "cpu_ms_per_update": 1e3 * cpu / updates,
                }
            )
            actor.start().result()
            time.sleep(1.0)
            a, c0, t0 = (
                actor.stats().result(),
                client.run(_worker_cpu_s)[where],
                time.perf_counter(),
            )
            time.sleep(duration)
            z, c1 = actor.stats().result(), client.run(_worker_cpu_s)[where]
            wall = time.perf_counter() - t0
            actor.stop().result()
            n = z["learner/updates"] - a["learner/updates"]
            dask_rounds.append(
                {
                    "updates_per_s": n / wall,
                    "busy_frac": (z["learner/grad_total_s"] - a["learner/grad_total_s"]) / wall,
                    "cpu_ms_per_update": 1e3 * (c1 - c0) / n,
                    "batches_lost": z["flow/batches_lost"],
                }
            )
    finally:
        client.close()
        cluster.close()
    keys = ("updates_per_s", "busy_frac", "cpu_ms_per_update")
    local = {k: _median([r[k] for r in local_rounds]) for k in keys}
    dask = {k: _median([r[k] for r in dask_rounds]) for k in keys}
    dask["batches_lost"] = max(r["batches_lost"] for r in dask_rounds)
    return {
        "duration_s": duration,
        "rounds": {"local": local_rounds, "dask": dask_rounds},
        "local": local,
        "dask": dask,
        "dask_over_local": dask["updates_per_s"] / local["updates_per_s"],
    }


def throughput_config(workers: int) -> ApexConfig:
    return ApexConfig.preset("cartpole").override(
        {
            "workers.num_workers": workers,
            "eval.episodes": 0,
            "report.min_iter_time_s": 2.0,
            "report.timesteps_per_iteration": 0,
        }
    )


def _one_local(cfg: ApexConfig, duration: float, warmup: float) -> dict[str, Any]:
    c0, t0 = _cpu_s(), time.perf_counter()
    results = list(run_local(cfg, stop={"time_s": duration}))
    out = summarize(results, warmup)
    out["cores_used"] = {"process": (_cpu_s() - c0) / (time.perf_counter() - t0)}
    return out


def _one_dask(
    cfg: ApexConfig,
    client: Any,
    duration: float,
    warmup: float,
    min_replay_ratio: float | None = None,
) -> dict[str, Any]:
    with ApexDriver(cfg, client, min_replay_ratio=min_replay_ratio) as driver:
        c0, w0, t0 = _cpu_s(), client.run(_worker_cpu_s), time.perf_counter()
        results = driver.run(stop={"time_s": duration})
        wall = time.perf_counter() - t0
        c1, w1 = _cpu_s(), client.run(_worker_cpu_s)
        final = driver.final or {}
        learner_addr = driver.placement["learner"]["address"]
    out = summarize(results, warmup)
    out["batches_lost"] = final.get("flow/batches_lost", out["batches_lost"])
    out["flow_consistent"] = bool(
        final
        and final["flow/rollouts_sent"] == final["flow/rollouts_stored"]
        and final["flow/batches_sampled"]
        == final["flow/batches_trained"] + final["flow/batches_in_queue"]
        and final["flow/priority_updates_applied"] == final["flow/priority_updates_sent"]
    )
    out["cores_used"] = {
        "driver+scheduler": (c1 - c0) / wall,
        "learner+shards worker": (w1[learner_addr] - w0[learner_addr]) / wall,
        "env worker(s)": sum(w1[a] - w0[a] for a in w1 if a != learner_addr) / wall,
    }
    return out


def dask_vs_local(duration: float, warmup: float, rounds: int) -> dict[str, Any]:
    """The whole loop, same config, same wall time, rounds alternating; medians.

    Three runs per round: run_local; Dask with free-running env workers (Ape-X);
    Dask with ``min_replay_ratio`` = the preset's ``max_replay_ratio`` (8), i.e.
    the env workers held to run_local's replay ratio.
    """
    cfg = throughput_config(workers=2)
    rho = cfg.learner.max_replay_ratio
    runs: dict[str, list[dict[str, Any]]] = {"local": [], "dask": [], "dask_matched": []}
    cluster, client = start_local_cluster(os.cpu_count(), dashboard_address=":0")
    try:
        for _ in range(rounds):
            runs["local"].append(_one_local(cfg, duration, warmup))
            runs["dask"].append(_one_dask(cfg, client, duration, warmup))
            runs["dask_matched"].append(_one_dask(cfg, client, duration, warmup, rho))
    finally:
        client.close()
        cluster.close()

    def med(rows: list[dict[str, Any]]) -> dict[str, Any]:
        out = {m: _median([r[m] for r in rows]) for m in METRICS}
        out["cores_used"] = {
            k: _median([r["cores_used"][k] for r in rows]) for k in rows[0]["cores_used"]
        }
        if "flow_consistent" in rows[0]:
            out["batches_lost"] = max(r["batches_lost"] for r in rows)
            out["flow_consistent"] = all(r["flow_consistent"] for r in rows)
            out["enqueue_blocked_s"] = _median([r["enqueue_blocked_s"] for r in rows])
        return out

    summary = {name: med(rows) for name, rows in runs.items()}
    loc = summary["local"]
    ratios = {
        name: {
            m: summary[name][m] / loc[m] if loc[m] else math.nan
            for m in ("env/steps_per_s", "learner/updates_per_s", "learner/busy_frac")
        }
        for name in ("dask", "dask_matched")
    }
    return {
        "config": "cartpole preset, 2 env workers, no eval",
        "duration_s": duration,
        "warmup_s": warmup,
        "min_replay_ratio_matched": rho,
        "rounds": runs,
        **summary,
        "over_local": ratios,
    }


def scaling(
    counts: list[int], duration: float, warmup: float, step_s: float, rounds: int
) -> dict[str, Any]:
    """Env steps/s of N env workers on the sleepy env; rounds alternate the order of N."""
    cluster, client = start_local_cluster(3, dashboard_address=":0")
    samples: dict[int, list[dict[str, float]]] = {n: [] for n in counts}
    try:
        for r in range(rounds):
            for n in counts if r % 2 == 0 else counts[::-1]:
                cfg = ApexConfig.preset("cartpole").override(
                    {
                        "env.env_id": SLEEPY_ID,
                        "env.env_kwargs": {"step_s": step_s},
                        "workers.num_workers": n,
                        "replay.learning_starts": 100_000,  # = capacity: sampling only
                        "eval.episodes": 0,
                        "report.min_iter_time_s": 1.0,
                        "report.timesteps_per_iteration": 0,
                    }
                )
                with ApexDriver(cfg, client) as driver:
                    c0, w0, t0 = _cpu_s(), client.run(_worker_cpu_s), time.perf_counter()
                    results = driver.run(stop={"time_s": duration})
                    wall = time.perf_counter() - t0
                    c1, w1 = _cpu_s(), client.run(_worker_cpu_s)
                    learner = driver.placement["learner"]["address"]
                warm = [x for x in results if x["time_s"] >= warmup] or results[-1:]
                samples[n].append(
                    {
                        "steps_per_s": _mean([x["env/steps_per_s"] for x in warm]),
                        "env_cores": sum(w1[a] - w0[a] for a in w1 if a != learner) / wall,
                        "driver_cores": (c1 - c0) / wall,
                    }
                )
    finally:
        client.close()
        cluster.close()
    rows = [
        {
            "env_workers": n,
            "steps_per_s": _median([x["steps_per_s"] for x in samples[n]]),
            "env_cores": _median([x["env_cores"] for x in samples[n]]),
            "driver_cores": _median([x["driver_cores"] for x in samples[n]]),
            "rounds": samples[n],
        }
        for n in counts
    ]
    base = rows[0]["steps_per_s"]
    for row in rows:
        row["efficiency"] = row["steps_per_s"] / (row["env_workers"] * base)
    return {
        "env": SLEEPY_ID,
        "step_s": step_s,
        "ideal_steps_per_s_per_worker": 1.0 / step_s,
        "duration_s": duration,
        "rows": rows,
    }


def _print_learner(r: dict[str, Any]) -> None:
    n = len(r["rounds"]["local"])
    print(
        f"\nLearner hot path alone (prefilled replay, batch 64; median of {n} x {r['duration_s']:g} s)"
    )
    print(f"{'':<24}{'run_local':>12}{'dask':>12}{'dask/local':>12}")
    for m in ("updates_per_s", "busy_frac", "cpu_ms_per_update"):
        a, b = r["local"][m], r["dask"][m]
        print(f"{m:<24}{a:>12.4g}{b:>12.4g}{b / a:>12.2f}")


def _print_pipeline(r: dict[str, Any]) -> None:
    n = len(r["rounds"]["local"])
    print(
        f"\nWhole loop ({r['config']}; median of {n} x {r['duration_s']:g} s, "
        f"after {r['warmup_s']:g} s warm-up); 'matched': min_replay_ratio="
        f"{r['min_replay_ratio_matched']:g}"
    )
    print(
        f"{'metric':<24}{'run_local':>12}{'dask':>12}{'matched':>12}{'dask/loc':>10}{'match/loc':>10}"
    )
    for m in METRICS:
        a, b, c = r["local"][m], r["dask"][m], r["dask_matched"][m]
        print(
            f"{m:<24}{a:>12.4g}{b:>12.4g}{c:>12.4g}"
            f"{(b / a if a else math.nan):>10.2f}{(c / a if a else math.nan):>10.2f}"
        )
    for name in ("dask", "dask_matched"):
        d = r[name]
        cores = ", ".join(f"{k} {v:.2f}" for k, v in d["cores_used"].items())
        print(
            f"{name}: batches lost {d['batches_lost']:g}, flow consistent {d['flow_consistent']}, "
            f"producers waited {d['enqueue_blocked_s']:.1f} s; cores: {cores}"
        )
    print(f"run_local cores: {r['local']['cores_used']['process']:.2f}")


def _print_scaling(s: dict[str, Any]) -> None:
    print(
        f"\nScaling on {s['env']} ({s['step_s'] * 1e3:g} ms per step; "
        f"ideal {s['ideal_steps_per_s_per_worker']:g} steps/s per worker)"
    )
    print(
        f"{'env workers':>12}{'steps/s':>12}{'efficiency':>12}{'env cores':>12}{'driver cores':>14}"
    )
    for row in s["rows"]:
        print(
            f"{row['env_workers']:>12}{row['steps_per_s']:>12.1f}{row['efficiency']:>12.2f}"
            f"{row['env_cores']:>12.2f}{row['driver_cores']:>14.2f}"
        )


def _stamp() -> dict[str, Any]:
    return {"finished": time.strftime("%Y-%m-%dT%H:%M:%S"), "load_avg": list(os.getloadavg())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter runs, fewer rounds")
    p.add_argument("--out", type=Path, default=OUT)
    p.add_argument("--part", choices=["all", "learner", "loop", "scaling"], default="all")
    args = p.parse_args()
    if args.quick:
        learner_s, learner_rounds = 3.0, 2
        dur, warm, rounds = 12.0, 4.0, 1
        sdur, swarm, srounds = 5.0, 1.5, 1
    else:
        learner_s, learner_rounds = 5.0, 3
        dur, warm, rounds = 24.0, 6.0, 2
        sdur, swarm, srounds = 10.0, 3.0, 2
    report: dict[str, Any] = json.loads(args.out.read_text()) if args.out.is_file() else {}
    report |= {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "load_avg_at_start": list(os.getloadavg()),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S"),
        "command": "python benchmarks/throughput.py" + (" --quick" if args.quick else ""),
    }
    if args.part in ("all", "learner"):
        report["learner_only"] = learner_only(learner_s, learner_rounds) | _stamp()
        _print_learner(report["learner_only"])
    if args.part in ("all", "loop"):
        report["dask_vs_local"] = dask_vs_local(dur, warm, rounds) | _stamp()
        _print_pipeline(report["dask_vs_local"])
    if args.part in ("all", "scaling"):
        report["scaling"] = scaling([1, 2, 4, 8], sdur, swarm, 0.002, srounds) | _stamp()
        _print_scaling(report["scaling"])
    report["load_avg_at_end"] = list(os.getloadavg())
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
