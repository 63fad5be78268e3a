"""The model of ``docs/scaling.md`` from a ``benchmarks/scale.py`` run: per component, a
least-squares line ``cores = fixed + ms_per_rollout / 1000 * rollouts/s`` over the run's
points, and the actors it carries at the Ape-X paper's rate.

    python benchmarks/scale.py --model after      # prints the fits and the projection
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["PAPER_ROLLOUTS_PER_S", "fit", "print_model"]

FRAGMENT = 50
PAPER_STEPS_PER_S = 139 / 4  # 139 frames/s per actor at frame skip 4
PAPER_ROLLOUTS_PER_S = PAPER_STEPS_PER_S / FRAGMENT  # ~0.7 rollouts/s per actor

COMPONENTS = {
    "driver": "driver_cores",
    "scheduler": "scheduler_cores",
    "learner process (4 shards + learner)": "learner_process_cores",
    "shard add() alone (4 shards)": "shard_ingest_cores",
    "env processes (simulated actors)": "env_process_cores",
}


def fit(points: list[dict[str, Any]], key: str) -> tuple[float, float]:
    """``(fixed cores, ms of CPU per stored rollout)`` of ``key`` against stored rollouts/s."""
    x = np.array([p["stored_rollouts_per_s"] for p in points], float)
    y = np.array([p[key] for p in points], float)
    if len(x) < 2:
        return 0.0, 1e3 * float(y[0] / x[0])
    slope, intercept = np.polyfit(x, y, 1)
    return float(intercept), 1e3 * float(slope)


def print_model(run: dict[str, Any]) -> dict[str, Any]:
    pts = sorted(run["points"].values(), key=lambda p: p["actors"])
    per_actor = PAPER_ROLLOUTS_PER_S
    print(
        f"\nmodel over {[p['actors'] for p in pts]} actors; one actor = {per_actor:.3f} rollouts/s"
    )
    print(
        f"{'component':40s} {'fixed cores':>11s} {'ms/rollout':>10s} {'actors/0.5 core':>15s}"
        f" {'actors/core':>11s} {'cores @1000':>11s}"
    )
    out: dict[str, Any] = {}
    for name, key in COMPONENTS.items():
        a, b = fit(pts, key)
        per = max(b, 1e-9) / 1e3 * per_actor  # cores per actor
        half = (0.5 - max(a, 0.0)) / per
        one = (1.0 - max(a, 0.0)) / per
        at_1000 = max(a, 0.0) + 1000 * per
        out[name] = {
            "fixed_cores": a,
            "ms_per_rollout": b,
            "actors_half_core": half,
            "actors_per_core": one,
            "cores_at_1000": at_1000,
        }
        print(f"{name:40s} {a:11.3f} {b:10.3f} {half:15.0f} {one:11.0f} {at_1000:11.2f}")
    syncs = [p["weight_sync_bytes_per_s"] / p["actors"] for p in pts if p["actors"] >= 32]
    if syncs:
        b = float(np.median(syncs))
        out["weight_sync_bytes_per_s_per_actor"] = b
        print(f"weight syncs: {b / 1e3:.1f} KB/s per actor -> {1000 * b / 1e6:.1f} MB/s at 1000")
    return out
