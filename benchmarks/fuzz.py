"""Fuzz the CLIs' inputs for a while: config files, ``--set`` values, sweep files, RLlib files.

The cases of ``tests/fuzz_cases.py`` (the suite runs a fixed budget of them in
``tests/test_fuzz_inputs.py``), here drawn at random for ``--minutes`` split over the
targets. Each case calls the CLI's parse-and-validate entry point in this process and
must end in exit 0, or exit 2 with at most three one-line errors, never a traceback,
within 2 s and 200 MB (tracemalloc's peak). Every case that does not is kept (its input
and what went wrong) rather than shrunk.

    .venv/bin/python benchmarks/fuzz.py --minutes 15

Prints a table per target (cases, exit 0, exit 2, problems, slowest, largest) and writes
``benchmarks/results/fuzz.json`` with the problems' inputs.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


class _Done(BaseException):
    """The target's time is up (a BaseException: Hypothesis lets it through)."""


def fuzz_target(target: str, seconds: float, seed: int) -> dict:
    from fuzz_cases import STRATEGIES, run_case
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    stats = {"cases": 0, "exit_0": 0, "exit_2": 0, "max_s": 0.0, "max_mb": 0.0, "problems": []}
    deadline = time.monotonic() + seconds

    @hseed(seed)
    @settings(
        max_examples=10**9,
        deadline=None,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(doc=STRATEGIES[target])
    def one(doc):
        if time.monotonic() > deadline:
            raise _Done
        case = run_case(target, doc)
        stats["cases"] += 1
        stats[f"exit_{case.code}"] = stats.get(f"exit_{case.code}", 0) + 1
        stats["max_s"] = max(stats["max_s"], case.seconds)
        stats["max_mb"] = max(stats["max_mb"], case.peak_mb)
        problem = case.problem()
        if problem is not None:
            stats["problems"].append(
                {"problem": problem, "argv": case.argv, "stderr": case.err[:3],
                 "input": str(doc)[:100_000]}
            )  # fmt: skip

    try:
        one()
    except _Done:
        pass
    return stats


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=15.0, help="all targets together")
    ap.add_argument("--targets", default="config,set,sweep,rllib")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "fuzz.json"))
    args = ap.parse_args()
    targets = [t for t in args.targets.split(",") if t]
    import warnings

    warnings.simplefilter("ignore")  # retired keys, Optuna: not what is measured
    results = {}
    for target in targets:
        results[target] = fuzz_target(target, 60.0 * args.minutes / len(targets), args.seed)
        r = results[target]
        print(f"{target}: {r['cases']} cases, {len(r['problems'])} problems", file=sys.stderr)
    head = f"{'target':<8} {'cases':>7} {'exit 0':>7} {'exit 2':>7} {'problems':>8} {'max s':>6} {'max MB':>7}"
    print(head)
    print("-" * len(head))
    for target, r in results.items():
        print(
            f"{target:<8} {r['cases']:>7} {r.get('exit_0', 0):>7} {r.get('exit_2', 0):>7} "
            f"{len(r['problems']):>8} {r['max_s']:>6.2f} {r['max_mb']:>7.1f}"
        )
    for target, r in results.items():
        for p in r["problems"][:5]:
            print(f"{target}: {p['problem']}: {' '.join(p['argv'])[:120]}")
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(
        json.dumps({"minutes": args.minutes, "seed": args.seed, "targets": results}, indent=1)
        + "\n"
    )
    return 1 if any(r["problems"] for r in results.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
