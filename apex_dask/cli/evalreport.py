"""What ``apex-dask-eval`` prints and writes: the table and ``RUN_DIR/eval-<time>.json``.

::

    summary = summarize(rows, wall_s)     # return mean/std/min/max, length mean/max, episodes/s
    print(format_table(trained, summary, args, seed, workers))
    path = write_report(trained, summary, played, args, seed, stamp, videos)
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import numpy as np

from apex_dask.cli.outdir import write_json

__all__ = ["format_table", "summarize", "write_report"]


def summarize(rows: list[dict[str, Any]], wall_s: float) -> dict[str, float]:
    """Statistics over the episodes (population std, as the evaluator's ``eval/return_std``)."""
    returns = np.array([r["return"] for r in rows], dtype=np.float64)
    lengths = np.array([r["length"] for r in rows], dtype=np.float64)
    return {
        "episodes": len(rows),
        "return_mean": float(returns.mean()),
        "return_std": float(returns.std()),
        "return_min": float(returns.min()),
        "return_max": float(returns.max()),
        "length_mean": float(lengths.mean()),
        "length_max": int(lengths.max()),
        "episodes_per_s": len(rows) / wall_s if wall_s > 0 else float("inf"),
        "wall_s": wall_s,
    }


def format_table(
    trained: Any, summary: dict[str, float], args: argparse.Namespace, seed: int, workers: int
) -> str:
    head = (
        f"Evaluation of {trained.folder} ({trained.source}, version {trained.version}): "
        f"{summary['episodes']} episodes of {trained.env_id}, epsilon {args.epsilon:g}, "
        f"seed {seed}, {workers} worker(s)"
    )
    rows = [
        ("return mean", f"{summary['return_mean']:.2f}"),
        ("return std", f"{summary['return_std']:.2f}"),
        ("return min", f"{summary['return_min']:.2f}"),
        ("return max", f"{summary['return_max']:.2f}"),
        ("length mean", f"{summary['length_mean']:.1f}"),
        ("length max", f"{summary['length_max']:d}"),
        ("episodes/s", f"{summary['episodes_per_s']:.2f}  ({summary['wall_s']:.2f} s)"),
    ]
    width = max(len(k) for k, _ in rows)
    return "\n".join([head, *(f"  {k:<{width}}  {v}" for k, v in rows)])


def write_report(
    trained: Any,
    summary: dict[str, float],
    played: Any,
    args: argparse.Namespace,
    seed: int,
    stamp: str,
    videos: list[str],
) -> Path:
    """Write ``RUN_DIR/eval-<stamp>.json`` (atomically; ``--policy FILE``: beside FILE); its
    path. ``trained`` is the run (or the exported file) played: its ``folder``, ``source``,
    ``version`` and ``env_id``."""
    doc = {
        "run_dir": str(trained.folder),
        "weights": trained.source,
        "weights_version": trained.version,
        "env_id": trained.env_id,
        "episodes": summary["episodes"],
        "epsilon": args.epsilon,
        "seed": seed,
        "workers": played.workers,
        "summary": summary,
        "returns": [r["return"] for r in played.rows],
        "lengths": [r["length"] for r in played.rows],
        "videos": videos,
        "export": args.export,
        "policy": args.policy,
        "time": stamp,
    }
    path = trained.folder / f"eval-{stamp}.json"
    n = 1
    while path.exists():  # two evaluations in one second keep both files
        n += 1
        path = trained.folder / f"eval-{stamp}-{n}.json"
    write_json(path, doc)
    return path
