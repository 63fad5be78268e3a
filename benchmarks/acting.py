"""Acting at the env's own speed: one env worker against the limits of its env and network.

For a preset (``--preset atari|minatar|cartpole``, its env and network) and
each ``envs_per_worker`` setting N, in one process with one torch thread:

* **env**: the worker's N envs stepped alone with random actions (episode ends
  and resets included): the env's limit, env steps/s;
* **forward**: a bare batched forward pass of the preset's network at batch N
  (``EnvWorker.q_values``): the network's limit, N states per pass, states/s;
* **combined**: 1 / (1/env + 1/forward), the best an actor that steps and
  then acts in turn can do;
* **worker**: :class:`~apex_dask.algo.agents.dqn.worker.EnvWorker` ``sample()`` (acting,
  n-step transitions, initial priorities, the compact frame form), env steps/s.

Every measurement of every setting takes turns in ``--rounds`` windows (so
load from other processes falls on all alike); a rate is the median window.

``--agents`` measures every agent's env worker side by side instead, at the
preset's env and ``envs_per_worker`` (or ``--envs``): DQN plain, DQN with noisy
layers (``dqn.acting_noise`` ``fragment`` and ``pass``), C51, and R2D2 with each
``r2d2.initial_priority`` (``max``, ``worker``). For each: **worker** env steps/s
(``sample()``), its ratio to plain DQN's, and its own limit: the env alone
combined with a bare batched acting pass of its network (for R2D2 one LSTM step
per env step, no priorities). DPG acts on continuous actions, not on these envs:
``benchmarks/continuous.py`` measures it.

    python benchmarks/acting.py --preset minatar --agents --seconds 60
    python benchmarks/acting.py --preset minatar --agents --clock cpu --seconds 30

(``--clock cpu``: env steps per CPU second of the acting thread, for a loaded machine;
``--variants`` picks settings, plain DQN always comes first as the reference.)

    python benchmarks/acting.py --preset atari --envs 1 8
    python benchmarks/acting.py --preset minatar --envs 1 16
    python benchmarks/acting.py --preset atari --vector-mode sync --out /tmp/sync.json

Prints a table and writes ``benchmarks/results/acting_<preset>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from apex_dask.algo.agents.dqn.worker import EnvWorker  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import env_factory, worker_spec  # noqa: E402

RESULTS = Path(__file__).parent / "results"
DEFAULT_ENVS = {"atari": [1, 8], "minatar": [1, 16], "cartpole": [1, 8]}


def _probes(worker: EnvWorker, rng: np.random.Generator) -> dict[str, Callable[[], int]]:
    """One unit of work per measurement; each returns the env steps (or states) it made."""
    n = worker.num_envs
    envs = worker._envs  # the worker's own envs, stepped without acting
    obs = envs.reset()

    def env_only() -> int:
        for _ in range(10):
            envs.step(rng.integers(worker.num_actions, size=n))
        return 10 * n

    def forward() -> int:
        for _ in range(10):
            worker.q_values(obs)
        return 10 * n

    def sample() -> int:
        return worker.sample().steps

    return {"env": env_only, "forward": forward, "worker": sample}


def measure(cfg: ApexConfig, envs: list[int], epsilon: float, seconds: float, rounds: int) -> list:
    """Rates per setting and measurement, all taking turns in ``rounds`` windows."""
    rng = np.random.default_rng(0)
    kinds: dict[tuple[int, str], Callable[[], int]] = {}
    workers = []
    for n in envs:
        spec = worker_spec(cfg)
        kwargs = {"rollout": replace(spec.rollout, num_envs=n), "config": spec.agent.config}
        worker = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=0, **kwargs)
        worker.sample()  # warm-up: makes the other envs, first torch calls
        # the env-alone probe steps a twin, so the worker's own episodes stay whole
        twin = EnvWorker(env_factory(cfg), epsilon=epsilon, seed=1, **kwargs)
        probes = _probes(twin, rng)
        kinds[(n, "env")], kinds[(n, "forward")] = probes["env"], probes["forward"]
        kinds[(n, "worker")] = _probes(worker, rng)["worker"]
        workers += [worker, twin]
    window = seconds / rounds
    rates: dict[tuple[int, str], list[float]] = {key: [] for key in kinds}
    for _ in range(rounds):
        for key, work in kinds.items():
            done, t0 = 0, time.perf_counter()
            while (wall := time.perf_counter() - t0) < window:
                done += work()
            rates[key].append(done / wall)
    for worker in workers:
        worker.close()
    rows = []
    for n in envs:
        env, fwd, act = (statistics.median(rates[(n, k)]) for k in ("env", "forward", "worker"))
        combined = 1.0 / (1.0 / env + 1.0 / fwd)
        rows.append(
            {
                "num_envs": n,
                "env_steps_per_s": env,
                "forward_states_per_s": fwd,
                "combined_limit": combined,
                "worker_steps_per_s": act,
                "worker_of_combined": act / combined,
                "windows": {k: rates[(n, k)] for k in ("env", "forward", "worker")},
            }
        )
    base = rows[0]["worker_steps_per_s"]
    for row in rows:
        row["worker_x_first"] = row["worker_steps_per_s"] / base
    return rows


AGENT_VARIANTS: dict[str, tuple[str, dict]] = {
    "dqn": ("dqn", {}),
    "dqn_noisy_fragment": ("dqn", {"dqn.noisy": True, "dqn.acting_noise": "fragment"}),
    "dqn_noisy_pass": ("dqn", {"dqn.noisy": True, "dqn.acting_noise": "pass"}),
    "dqn_c51": ("dqn", {"dqn.num_atoms": 51}),
    "r2d2_max": ("r2d2", {"r2d2.initial_priority": "max"}),
    "r2d2_worker": ("r2d2", {"r2d2.initial_priority": "worker"}),
}
"""The agent settings of ``--agents``: (algo, overrides)."""


def _agent_probes(worker, rng: np.random.Generator) -> dict[str, Callable[[], int]]:
    """env alone, a bare acting pass at the worker's batch, ``sample()``."""
    n = worker.num_envs
    envs = worker._envs
    obs = envs.reset()
    if hasattr(worker, "net"):  # R2D2: one batched LSTM step from the carried state
        state = [worker.net.initial_state(n)]
        x = torch.as_tensor(obs)

        def forward() -> int:
            with torch.inference_mode():
                for _ in range(10):
                    q, state[0] = worker.net.step_cell(x, state[0])
                    q.argmax(dim=1).numpy()
            return 10 * n

    else:  # DQN: the acting pass, with the worker's own noise rule

        def forward() -> int:
            for _ in range(10):
                worker.values(obs, noise=True)
            return 10 * n

    def env_only() -> int:
        for _ in range(10):
            envs.step(rng.integers(worker.num_actions, size=n))
        return 10 * n

    return {"env": env_only, "forward": forward, "worker": lambda: worker.sample().steps}


TARGETS = (
    ("dqn_noisy_fragment", "worker_x_dqn", 0.8, "noisy (per fragment) / plain DQN"),
    ("r2d2_max", "worker_x_dqn", 0.6, "R2D2 (initial_priority=max) / plain DQN"),
    ("r2d2_max", "worker_of_combined", 0.8, "R2D2 (initial_priority=max) / its env+LSTM limit"),
)
"""The acting targets: (agent setting, column, at least, what)."""


def measure_agents(
    preset: str,
    over: dict,
    variants: list[str],
    epsilon: float,
    seconds: float,
    rounds: int,
    clock: Callable[[], float] = time.perf_counter,
) -> list[dict]:
    """Each agent setting's worker rate and its own env+network limit, taking turns. The
    env alone is measured once (every setting steps the preset's env). ``clock``: wall
    time, or the thread's CPU time (``--clock cpu``: rates per CPU second, which load
    from other processes hardly moves; the envs step in this thread)."""
    from apex_dask.algo.agents.registry import make_env_worker

    rng = np.random.default_rng(0)
    kinds: dict[tuple[str, str], Callable[[], int]] = {}
    workers = []
    for name in variants:
        algo, extra = AGENT_VARIANTS[name]
        cfg = ApexConfig.preset(preset).override({**over, "algo": algo, **extra})
        spec = worker_spec(cfg)
        worker = make_env_worker(spec, env_factory(cfg), exploration=epsilon, seed=0)
        worker.sample()  # warm-up: the first torch calls, the first noise sample
        # the probes step a twin, so the worker's own episodes stay whole
        twin = make_env_worker(spec, env_factory(cfg), exploration=epsilon, seed=1)
        twin.sample()
        probes = _agent_probes(twin, rng)
        if not kinds:
            kinds[("", "env")] = probes["env"]
        kinds[(name, "forward")] = probes["forward"]
        kinds[(name, "worker")] = _agent_probes(worker, rng)["worker"]
        workers += [worker, twin]
    window = seconds / rounds
    rates: dict[tuple[str, str], list[float]] = {key: [] for key in kinds}
    for _ in range(rounds):
        for key, work in kinds.items():
            done, t0 = 0, clock()
            while (spent := clock() - t0) < window:
                done += work()
            rates[key].append(done / spent)
    for worker in workers:
        worker.close()
    env = statistics.median(rates[("", "env")])
    rows = []
    for name in variants:
        fwd, act = (statistics.median(rates[(name, k)]) for k in ("forward", "worker"))
        combined = 1.0 / (1.0 / env + 1.0 / fwd)
        rows.append(
            {
                "agent": name,
                "algo": AGENT_VARIANTS[name][0],
                "overrides": AGENT_VARIANTS[name][1],
                "env_steps_per_s": env,
                "forward_states_per_s": fwd,
                "combined_limit": combined,
                "worker_steps_per_s": act,
                "worker_of_combined": act / combined,
                "windows": {
                    "env": rates[("", "env")],
                    "forward": rates[(name, "forward")],
                    "worker": rates[(name, "worker")],
                },
            }
        )
    by_name = {r["agent"]: r for r in rows}
    dqn = by_name.get("dqn")
    for row in rows:
        row["worker_x_dqn"] = row["worker_steps_per_s"] / dqn["worker_steps_per_s"] if dqn else None
    return rows


def check_targets(rows: list[dict]) -> list[dict]:
    """The acting targets of :data:`TARGETS` that this run measured."""
    by_name = {r["agent"]: r for r in rows}
    out = []
    for name, column, least, what in TARGETS:
        row = by_name.get(name)
        if row is None or row.get(column) is None:
            continue
        value = row[column]
        out.append({"what": what, "value": value, "target": least, "met": value >= least})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", choices=sorted(DEFAULT_ENVS), default="minatar")
    ap.add_argument("--env", default=None, help="env id (default: the preset's)")
    ap.add_argument("--envs", type=int, nargs="+", default=None, help="envs_per_worker settings")
    ap.add_argument("--epsilon", type=float, default=0.05)
    ap.add_argument("--fragment", type=int, default=50, help="steps of each env per sample()")
    ap.add_argument("--seconds", type=float, default=30.0, help="per measurement, all rounds")
    ap.add_argument("--rounds", type=int, default=6)
    ap.add_argument(
        "--vector-mode", choices=["native", "sync"], default=None, help="default: the preset's"
    )
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--agents", action="store_true", help="every agent's worker side by side")
    ap.add_argument(
        "--clock", choices=["wall", "cpu"], default="wall", help="--agents: rates per wall or CPU s"
    )
    ap.add_argument(
        "--variants", nargs="+", choices=list(AGENT_VARIANTS), default=list(AGENT_VARIANTS)
    )
    args = ap.parse_args()
    torch.set_num_threads(1)
    over = {"workers.rollout_fragment_length": args.fragment}
    if args.env:
        over["env.env_id"] = args.env
    if args.vector_mode:
        over["workers.vector_mode"] = args.vector_mode
    cfg = ApexConfig.preset(args.preset).override(over)
    if args.agents:
        return agents_main(args, cfg, over)
    envs = args.envs or DEFAULT_ENVS[args.preset]
    rows = measure(cfg, envs, args.epsilon, args.seconds, args.rounds)
    mode = cfg.workers.vector_mode
    print(f"{cfg.env.env_id} ({args.preset}, {mode}), epsilon {args.epsilon}, one torch thread")
    head = f"{'envs':>5} {'env':>8} {'forward':>9} {'combined':>9} {'worker':>8}"
    print(f"{head} {'of comb.':>8} {'x 1st':>6}")
    for r in rows:
        print(
            f"{r['num_envs']:>5} {r['env_steps_per_s']:>8.0f} {r['forward_states_per_s']:>9.0f} "
            f"{r['combined_limit']:>9.0f} {r['worker_steps_per_s']:>8.0f} "
            f"{r['worker_of_combined']:>8.2f} {r['worker_x_first']:>6.2f}"
        )
    out = args.out or RESULTS / f"acting_{args.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    meta = {
        "preset": args.preset,
        "env": cfg.env.env_id,
        "vector_mode": mode,
        "epsilon": args.epsilon,
        "fragment": args.fragment,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "load_avg": os.getloadavg()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "cpus_allowed": sorted(os.sched_getaffinity(0)),  # [0]: pinned, e.g. taskset -c 0
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
    }
    out.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {out}")


def _meta(args: argparse.Namespace, cfg: ApexConfig) -> dict:
    return {
        "preset": args.preset,
        "env": cfg.env.env_id,
        "vector_mode": cfg.workers.vector_mode,
        "epsilon": args.epsilon,
        "fragment": args.fragment,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "load_avg": os.getloadavg()[0],
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "command": " ".join(["python", *sys.argv]),
        "torch": torch.__version__,
    }


def agents_main(args: argparse.Namespace, cfg: ApexConfig, over: dict) -> None:
    """``--agents``: every agent's worker, side by side (see the module docstring)."""
    if args.envs:
        over = {**over, "workers.envs_per_worker": args.envs[0]}
    variants = list(dict.fromkeys(["dqn", *args.variants]))  # plain DQN: the reference
    if cfg.workers.vector_mode != "sync" and args.clock == "cpu":
        sys.exit("acting: --clock cpu needs the envs in this thread: --vector-mode sync")
    clock = time.thread_time if args.clock == "cpu" else time.perf_counter
    rows = measure_agents(
        args.preset, over, variants, args.epsilon, args.seconds, args.rounds, clock
    )
    n = args.envs[0] if args.envs else cfg.workers.envs_per_worker
    per = "CPU second" if args.clock == "cpu" else "second"
    print(f"{cfg.env.env_id} ({args.preset}), {n} env(s) per worker, one torch thread, per {per}")
    print(f"env alone: {rows[0]['env_steps_per_s']:.0f} env steps/s")
    head = f"{'agent':<20} {'forward':>9} {'limit':>8} {'worker':>8} {'of limit':>8} {'x dqn':>6}"
    print(head)
    for r in rows:
        print(
            f"{r['agent']:<20} {r['forward_states_per_s']:>9.0f} {r['combined_limit']:>8.0f} "
            f"{r['worker_steps_per_s']:>8.0f} {r['worker_of_combined']:>8.2f} "
            f"{r['worker_x_dqn']:>6.2f}"
        )
    targets = check_targets(rows)
    for t in targets:
        verdict = "met" if t["met"] else "NOT met"
        print(f"{t['what']}: {t['value']:.2f} (target >= {t['target']}): {verdict}")
    out = args.out or RESULTS / f"acting_agents_{args.preset}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {**_meta(args, cfg), "clock": args.clock, "num_envs": n, "rows": rows}
    doc["targets"] = targets
    doc["load_avg_end"] = os.getloadavg()[0]
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
