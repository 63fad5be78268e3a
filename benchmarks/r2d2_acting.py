"""Where an R2D2 env worker's step goes, and the sequence adder against an earlier commit's.

In one process with one torch thread, on the preset's env (default ``minatar``: MinAtar
Breakout, 1 env per worker, ``r2d2.initial_priority: max``), every measurement taking
turns in ``--rounds`` windows of **thread CPU time** (load from other processes falls on
all alike):

* **env**: the worker's envs stepped alone with random actions;
* **forward**: one batched LSTM step (``RecurrentQNetwork.step_cell``) and its argmax,
  back to back on one observation: the network's limit per env step;
* **worker**: ``R2D2EnvWorker.sample()`` per env step;
* **step in worker**: the same ``sample()`` with its ``step_cell`` calls timed: what the
  LSTM step costs between env steps (caches shared with the env);
* **adder**: ``SequenceAdder.set_states`` + ``add`` (+ ``take`` every 50 steps) per
  vector step on synthetic MinAtar-sized steps at 1 and 8 envs, and with
  ``--baseline REV`` the adder of that commit beside it (its package unpacked as
  ``apex_dask_base``, as ``benchmarks/version_ab.py`` does).

The table splits the worker's step into env + step in worker + the rest (the acting
code around the pass, the adder, the rollout loop) and gives the worker's ratio to its
limit (env + forward), the ratio ``benchmarks/acting.py --agents`` reports.

    python benchmarks/r2d2_acting.py
    python benchmarks/r2d2_acting.py --baseline d5f24f1 --seconds 60

Prints a table and writes ``benchmarks/results/r2d2_acting.json``.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from apex_dask.algo.agents.registry import make_env_worker  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import env_factory, worker_spec  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from acting import _agent_probes  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "r2d2_acting.json"
clock = time.thread_time


def worker_probes(preset: str, fragment: int) -> dict[str, Callable[[], int]]:
    """env, forward, worker and step-in-worker probes; each returns the env steps it made
    (step in worker: the CPU seconds of its step_cell calls go to ``timed``)."""
    over = {"algo": "r2d2", "r2d2.initial_priority": "max"}
    cfg = ApexConfig.preset(preset).override({**over, "workers.rollout_fragment_length": fragment})
    spec = worker_spec(cfg)
    worker = make_env_worker(spec, env_factory(cfg), exploration=0.05, seed=0)
    twin = make_env_worker(spec, env_factory(cfg), exploration=0.05, seed=1)
    worker.sample(), twin.sample()
    # env and forward: acting.py's own probes of the same twin (its R2D2 forward is one
    # batched LSTM step and its argmax, ten back to back)
    probes = _agent_probes(twin, np.random.default_rng(0))

    cell = worker.net.step_cell
    timed = [0.0]

    def timed_cell(obs, s):
        t0 = clock()
        out = cell(obs, s)
        timed[0] += clock() - t0
        return out

    def in_worker() -> int:
        worker.net.step_cell = timed_cell
        try:
            return worker.sample().steps
        finally:
            del worker.net.step_cell

    return {
        "env": probes["env"],
        "forward": probes["forward"],
        "worker": lambda: worker.sample().steps,
        "in_worker": in_worker,
        "_timed": timed,  # type: ignore[dict-item]
    }


def adder_probe(pkg: str, num_envs: int) -> Callable[[], int]:
    """set_states + add per vector step (take every 50) of ``pkg``'s SequenceAdder."""
    adder_cls = importlib.import_module(f"{pkg}.algo.agents.r2d2.sequences").SequenceAdder
    adder = adder_cls(
        num_envs, (10, 10, 4), np.bool_, burn_in=10, trace_length=20, period=10, state_size=256
    )
    rng = np.random.default_rng(0)
    obs = rng.random((num_envs, 10, 10, 4)) < 0.1
    h = rng.random((num_envs, 256)).astype(np.float32)
    actions, rewards = np.zeros(num_envs, np.int64), np.zeros(num_envs, np.float32)
    no = np.zeros(num_envs, bool)
    step = [0]

    def run() -> int:
        for _ in range(50):
            i = step[0] = step[0] + 1
            adder.set_states(h, h, i)
            adder.add(obs, actions, rewards, obs, no if i % 200 else ~no, no, None)
        adder.take()
        return 50

    return run


def take_turns(probes: dict[str, Callable[[], int]], seconds: float, rounds: int, timed):
    """Median CPU microseconds per env step of each probe (and of the timed step_cell)."""
    window = seconds / rounds
    per: dict[str, list[float]] = {k: [] for k in probes}
    per_cell: list[float] = []
    for _ in range(rounds):
        for key, work in probes.items():
            timed[0] = 0.0
            done, t0 = 0, clock()
            while (spent := clock() - t0) < window:
                done += work()
            per[key].append(spent / done * 1e6)
            if key == "in_worker":
                per_cell.append(timed[0] / done * 1e6)
    out = {k: statistics.median(v) for k, v in per.items()}
    if per_cell:
        out["step_in_worker"] = statistics.median(per_cell)
    return out, per


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="minatar")
    p.add_argument("--fragment", type=int, default=50, help="steps of each env per sample()")
    p.add_argument("--seconds", type=float, default=40.0, help="per measurement, all rounds")
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--baseline", default=None, help="a commit: its adder beside this one's")
    p.add_argument("--out", type=Path, default=RESULTS)
    args = p.parse_args(argv)
    torch.set_num_threads(1)

    probes = worker_probes(args.preset, args.fragment)
    timed = probes.pop("_timed")
    us, windows = take_turns(probes, args.seconds, args.rounds, timed)
    limit = us["env"] + us["forward"]
    rest = us["worker"] - us["env"] - us["step_in_worker"]
    print(f"R2D2 worker, preset {args.preset}, CPU microseconds per env step (thread clock)")
    for key, what in (
        ("env", "env alone"),
        ("forward", "forward (LSTM step + argmax, back to back)"),
        ("worker", "worker sample()"),
        ("step_in_worker", "  of which the LSTM step inside the worker"),
    ):
        print(f"  {what:44s} {us[key]:8.1f}")
    print(f"  {'  of which the rest (acting code, adder, loop)':44s} {rest:8.1f}")
    print(f"  limit (env + forward) {limit:.1f}; worker / limit {limit / us['worker']:.3f}")

    adder: dict[str, dict[str, float]] = {}
    base_sha = None
    with tempfile.TemporaryDirectory() as tmp:
        pkgs = ["apex_dask"]
        if args.baseline:
            from version_ab import BASE, unpack_baseline

            base_sha = unpack_baseline(args.baseline, Path(tmp))
            pkgs.append(BASE)
        for n in (1, 8):
            turns = {pkg: adder_probe(pkg, n) for pkg in pkgs}
            got, _ = take_turns(turns, args.seconds / 2, args.rounds, [0.0])
            adder[str(n)] = got
            line = "  ".join(f"{pkg}: {v:6.1f}" for pkg, v in got.items())
            print(f"adder, {n} env(s), us per vector step: {line}")
    doc = {
        "command": "python benchmarks/r2d2_acting.py " + " ".join(sys.argv[1:]),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "preset": args.preset,
        "us_per_env_step": us | {"rest": rest, "limit": limit},
        "worker_of_limit": limit / us["worker"],
        "windows": windows,
        "adder_us_per_vector_step": adder,
        "baseline": base_sha,
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "torch": torch.__version__,
            "load_1m": round(os.getloadavg()[0], 2),
        },
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
