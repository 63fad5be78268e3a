"""What each export format costs: time to write, size on disk, actions/s in its runtime on CPU.

For each case (an agent and network of a preset; the weights are the learner's
seeded initial ones, which cost the same as trained ones) and each format
(``.onnx``, ``.pt2``, ``.pt``):

* **export s**: ``export_policy`` writing the file and its JSON (one run; the
  first ONNX export of the process also imports the exporter, so cases run in
  the order given and the first case's ONNX number includes that);
* **size KiB**: the file on disk;
* **actions/s at batch 1 and 256**: the file loaded by its own runtime
  (onnxruntime, ``torch.export.load(...).module()``, ``torch.jit.load``), one
  thread, called on batches of that many observations (a recurrent program: with
  its state in and out); the median of ``--rounds`` windows of ``--seconds``, the
  runtimes taking turns so that load from other processes falls on all alike.

    python benchmarks/export_formats.py
    python benchmarks/export_formats.py --cases cartpole atari --seconds 1 --rounds 5

Prints a table and writes ``benchmarks/results/export_formats.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from gymnasium import spaces  # noqa: E402

from apex_dask.algo.agents.registry import make_learner  # noqa: E402
from apex_dask.algo.play.export import FORMATS, export_policy  # noqa: E402
from apex_dask.algo.play.exported import PolicyFile, _loader  # noqa: E402
from apex_dask.config import ApexConfig  # noqa: E402
from apex_dask.experiment.builder import agent_spec, env_factory  # noqa: E402

RESULTS = Path(__file__).parent / "results"
CASES = {  # name: (preset, spaces when the env is not made here)
    "cartpole": ("cartpole", None),  # DQN, dueling MLP
    "minatar": ("minatar", None),  # DQN, conv torso on a 10x10 grid
    "atari": ("atari", (spaces.Box(0, 255, (4, 84, 84), np.uint8), spaces.Discrete(6))),
    "pendulum": ("pendulum", None),  # DPG actor
    "cartpole_pomdp": ("cartpole_pomdp", None),  # R2D2, LSTM state in and out
}
BATCHES = (1, 256)


def case_parts(name: str):
    preset, given = CASES[name]
    cfg = ApexConfig.preset(preset).override({"learner.device": "cpu"})
    if given is None:
        env = env_factory(cfg)()
        given = (env.observation_space, env.action_space)
        env.close()
    obs_space, act_space = given
    spec = agent_spec(cfg)
    torch.manual_seed(0)
    weights = make_learner(spec, obs_space, act_space, seed=0).get_weights()[1]
    return cfg, spec, obs_space, act_space, weights


def measure(name: str, folder: Path, seconds: float, rounds: int) -> list[dict]:
    cfg, spec, obs_space, act_space, weights = case_parts(name)
    about = {"env_id": cfg.env.env_id, "env_kwargs": dict(cfg.env.env_kwargs)}
    rows, runners = [], {}
    rng = np.random.default_rng(0)
    for suffix, kind in FORMATS.items():
        path = folder / f"{name}{suffix}"
        t0 = time.perf_counter()
        export_policy(path, spec, obs_space, act_space, weights, about=about)
        export_s = time.perf_counter() - t0
        exported = PolicyFile.read(path)
        names = [i["name"] for i in exported.doc["inputs"]]
        run = _loader(kind)(exported.data, names)
        state = [s["shape"] for s in exported.doc["state"]]
        row = {
            "case": name,
            "algo": cfg.algo,
            "format": kind,
            "export_s": export_s,
            "size_bytes": path.stat().st_size,
            "dynamic_batch": exported.doc["batch"]["dynamic"],
        }
        rows.append(row)
        for b in BATCHES:
            obs = np.stack([obs_space.sample() for _ in range(b)]).astype(obs_space.dtype)
            ins = [obs, *(rng.normal(0, 0.1, (b, *s)).astype(np.float32) for s in state)]
            runners[kind, b] = (row, run, ins)
    rates: dict[tuple[str, int], list[float]] = {k: [] for k in runners}
    for _ in range(rounds):
        for key, (_, run, ins) in runners.items():
            run(*ins)  # warm
            n, t0 = 0, time.perf_counter()
            while (elapsed := time.perf_counter() - t0) < seconds:
                run(*ins)
                n += 1
            rates[key].append(n * key[1] / elapsed)
    for key, values in rates.items():
        runners[key][0][f"actions_per_s_b{key[1]}"] = statistics.median(values)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", nargs="+", choices=sorted(CASES), default=list(CASES))
    p.add_argument("--seconds", type=float, default=0.5, help="length of one timing window")
    p.add_argument("--rounds", type=int, default=3, help="windows per measurement (median)")
    p.add_argument("--out", type=Path, default=RESULTS / "export_formats.json")
    args = p.parse_args()
    torch.set_num_threads(1)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.cases:
            rows += measure(name, Path(tmp), args.seconds, args.rounds)
            print(f"  {name}: done", flush=True)
    head = f"{'case':<15}{'format':<12}{'export s':>9}{'size KiB':>10}{'b1 act/s':>11}"
    head += f"{'b256 act/s':>12}  batch"
    print(head)
    for r in rows:
        print(
            f"{r['case']:<15}{r['format']:<12}{r['export_s']:>9.2f}{r['size_bytes'] / 1024:>10.1f}"
            f"{r['actions_per_s_b1']:>11.0f}{r['actions_per_s_b256']:>12.0f}  "
            f"{'dynamic' if r['dynamic_batch'] else 'fixed'}"
        )
    import onnxruntime

    doc = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": onnxruntime.__version__,
        "threads": 1,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "rows": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
