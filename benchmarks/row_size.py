"""The size of one result row at 8, 96 and 360 env workers, per-worker keys against summaries.

A row is built by the runners' own :func:`~apex_dask.experiment.results.build_result`
from each env worker's metric-named stats (``env_metrics``, as an env worker actor
reports them) and a learner's; its size is the bytes of its JSON line in
``results.jsonl`` and its number of keys (TensorBoard scalars, metric-store series).
``before``: every env worker's ``env/<i>/*`` and ``env/epsilon/<i>`` in the row
(``report.per_worker_keys: true``, as every row was); ``after``: their summaries only
(the default)::

    .venv/bin/python benchmarks/row_size.py            # table + benchmarks/results/row_size.json
"""

from __future__ import annotations

import argparse
import json
import math
from pathlib import Path

from apex_dask.experiment.results import IterationWindow, build_result, env_metrics

OUT = Path(__file__).parent / "results" / "row_size.json"


def row(n: int, per_worker_keys: bool) -> dict[str, float]:
    """``per_worker_keys``: the row as it was (each env worker's keys, no summaries)."""
    envs = [
        env_metrics(
            i,
            exploration=0.4 ** (1 + 7 * i / max(1, n - 1)),
            steps_sampled=1000 + i,
            steps_per_s=35.0,
            rollouts_sent=20 + i,
            weights_version=500 + i % 7,
        )
        for i in range(n)
    ]
    learner = {"learner/updates": 10.0, "learner/grad_total_s": 1.0, "learner/steps_trained": 1e4}
    learner["learner/version"] = 510.0
    out = build_result(
        iteration=1,
        time_s=10.0,
        window=IterationWindow(wall_s=10.0, steps=1000),
        steps_total=1000 * n,
        learner=learner,
        prev_learner=None,
        shards=[],
        envs=envs,
        acting_versions=[500] * n,
        weight_syncs=n,
        eval_result=None,
        per_worker_keys=per_worker_keys,
    )
    if per_worker_keys:
        out = {k: v for k, v in out.items() if not k.startswith("env/workers/")}
    return out


def size(r: dict[str, float]) -> tuple[int, int]:
    line = json.dumps({k: (None if math.isnan(v) else v) for k, v in r.items()})
    return len(line.encode()), len(r)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--actors", type=int, nargs="+", default=[8, 96, 360])
    args = ap.parse_args()
    points = []
    print("| env workers | keys before | bytes before | keys after | bytes after |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for n in args.actors:
        (b_bytes, b_keys), (a_bytes, a_keys) = size(row(n, True)), size(row(n, False))
        points.append(
            {"actors": n, "before": {"bytes": b_bytes, "keys": b_keys},
             "after": {"bytes": a_bytes, "keys": a_keys}}
        )  # fmt: skip
        print(f"| {n} | {b_keys:,} | {b_bytes:,} | {a_keys:,} | {a_bytes:,} |")
    OUT.write_text(json.dumps({"points": points}, indent=1) + "\n")


if __name__ == "__main__":
    main()
