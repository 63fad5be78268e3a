"""apex-dask-eval on the embedded cluster: episodes per second with 1 and with 2 workers.

    .venv/bin/python benchmarks/eval_scaling.py --run runs/cartpole          # a trained run
    .venv/bin/python benchmarks/eval_scaling.py --run runs/cartpole --episodes 100 --repeats 3

Each repeat runs the command line itself, ``apex-dask-eval RUN --episodes N
--seed 0 --workers W``, for W = 1 then 2 (interleaved, so a load change on
the machine hits both), and reads the ``episodes_per_s`` it wrote to
``RUN/eval-<time>.json``: episodes over the seconds from the first episode
task sent to the last result (the cluster's start and the workers' imports
are not in it; the whole command's wall time is shown beside it). The same
seed plays the same episodes on any number of workers, so both columns play
identical work. Prints a table and writes ``benchmarks/results/eval_scaling.json``.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

EVAL = str(Path(sys.executable).parent / "apex-dask-eval")


def one(run: str, episodes: int, workers: int) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run(
        [EVAL, run, "--episodes", str(episodes), "--seed", "0", "--workers", str(workers)],
        capture_output=True,
        text=True,
        timeout=1200,
    )
    command_s = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"eval_scaling: apex-dask-eval failed: {proc.stderr.strip()}")
    path = re.search(r"wrote (\S+\.json)", proc.stdout).group(1)
    doc = json.loads(Path(path).read_text())
    Path(path).unlink()  # the run folder keeps no benchmark files
    return {
        "workers": doc["workers"],
        "episodes_per_s": doc["summary"]["episodes_per_s"],
        "play_s": doc["summary"]["wall_s"],
        "command_s": command_s,
        "return_mean": doc["summary"]["return_mean"],
        "length_mean": doc["summary"]["length_mean"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--run", required=True, help="the --out folder of a trained run")
    p.add_argument("--episodes", type=int, default=100)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", default="benchmarks/results/eval_scaling.json")
    args = p.parse_args()
    rows: dict[int, list[dict]] = {1: [], 2: []}
    for r in range(args.repeats):
        for w in (1, 2):
            got = one(args.run, args.episodes, w)
            rows[w].append(got)
            print(
                f"repeat {r + 1}: {w} worker(s) {got['episodes_per_s']:.2f} episodes/s "
                f"(play {got['play_s']:.2f} s, command {got['command_s']:.1f} s)",
                flush=True,
            )
    med = {w: statistics.median(x["episodes_per_s"] for x in rows[w]) for w in rows}
    speedup = med[2] / med[1]
    ratios = [
        b["episodes_per_s"] / a["episodes_per_s"] for a, b in zip(rows[1], rows[2], strict=True)
    ]
    lengths = rows[1][0]["length_mean"], rows[1][0]["return_mean"]
    print()
    print(f"{args.episodes} episodes (mean length {lengths[0]:.1f}, mean return {lengths[1]:.1f})")
    print("| workers | episodes/s (median) | play s (median) | command s (median) |")
    print("| ---: | ---: | ---: | ---: |")
    for w in rows:
        play = statistics.median(x["play_s"] for x in rows[w])
        cmd = statistics.median(x["command_s"] for x in rows[w])
        print(f"| {w} | {med[w]:.2f} | {play:.2f} | {cmd:.1f} |")
    print(
        f"speedup 2 vs 1 worker: {speedup:.2f}x (per repeat: "
        f"{', '.join(f'{r:.2f}' for r in ratios)})"
    )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "episodes": args.episodes,
        "runs": rows,
        "median_episodes_per_s": med,
        "speedup": speedup,
        "speedup_per_repeat": ratios,
    }
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
