"""Weights bytes per host on a multi-host site: relays on against relays off, one run set.

Builds one ``cluster/netns.sh`` site per mode (scheduler, driver, learner and
``--env-hosts`` env hosts, each its own network namespace with its own byte
counters), runs ``apex-dask-submit`` on the driver's host with ``--actors-per-host``
simulated env workers on each env host (``simulate.env_steps_per_s``: no env
work, the real weight syncs) and reads every host's interface counters between
two result rows of steady-state training. The network is ``--hiddens`` wide, so
one weights blob (about 1 MB at 512x512) dwarfs everything else the learner's
host sends; every env worker asks for weights after each rollout, more often
than the learner makes versions (its replay ratio is capped), so without relays
each env worker takes every version.

Per mode it reports, per weights version the learner made in the window: the
bytes out of the learner's host (``tx``, headers included), that over
(env hosts x blob size) (the goal with relays: at most 1.2) and over
(env workers x blob size); the blobs the learner handed out
(``learner/weight_sends``); the bytes into each env host; and the policy lag
(learner version minus each env worker's weights version, pooled over the env
workers and the rows of the window) p50 and p99. Prints a table, writes JSON
(``benchmarks/results/weights_hosts.json``, keyed by ``--label``)::

    sudo env PATH=$PWD/.venv/bin:$PATH nice .venv/bin/python benchmarks/weights_hosts.py \\
        --env-hosts 4 --actors-per-host 4 --seconds 24

Needs root (ip netns).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
from multihost import run_site  # noqa: E402

OUT = ROOT / "benchmarks" / "results" / "weights_hosts.json"


def site_args(args: argparse.Namespace, relays: bool) -> argparse.Namespace:
    actors = args.env_hosts * args.actors_per_host
    fragment = 20
    sets = [
        f"workers.num_workers={actors}",
        f"workers.rollout_fragment_length={fragment}",
        f"workers.max_weight_sync_delay={fragment}",  # a sync after every rollout
        f"simulate.env_steps_per_s={args.steps_per_s:g}",
        f"dqn.hiddens=[{args.hiddens},{args.hiddens}]",
        "replay.learning_starts=500",
        "learner.min_replay_ratio=null",
        f"learner.max_replay_ratio={args.replay_ratio:g}",
        "eval.episodes=0",
        "eval.animation=false",
        "checkpoint.interval_s=0",
        "report.per_worker_keys=true",  # each env worker's weights version, for the lag
        f"topology.weight_relays={'true' if relays else 'false'}",
    ]
    return argparse.Namespace(
        preset="cartpole",
        seconds=args.seconds,
        iterations=args.iterations,
        env_hosts=args.env_hosts,
        workers_per_host=1,
        learner_processes=0,
        interface="eth0",
        tls=False,
        set=sets,
    )


def window_rows(out: Path, first: int, last: int) -> list[dict[str, Any]]:
    rows = [json.loads(x) for x in (out / "results.jsonl").read_text().splitlines() if x]
    return rows[first - 1 : last]


def lags(rows: list[dict[str, Any]]) -> list[float]:
    """Learner version minus each env worker's weights version, every row and worker."""
    out = []
    for r in rows:
        for k, v in r.items():
            if k.startswith("env/") and k.endswith("/weights_version") and k.count("/") == 2:
                if v is not None and v >= 0:
                    out.append(r["learner/version"] - v)
    return out


def measure(args: argparse.Namespace, relays: bool) -> dict[str, Any]:
    one = site_args(args, relays)
    with tempfile.TemporaryDirectory(prefix="apex-weights-hosts-") as tmp:
        r = run_site(one, Path(tmp))
        rows = window_rows(Path(tmp) / "out", 1, one.iterations + 1)
        final_path = Path(tmp) / "out" / "final.json"
        final = json.loads(final_path.read_text()) if final_path.exists() else {}
    r0, r1 = rows[0], rows[-1]
    versions = r1["learner/version"] - r0["learner/version"]
    sends = r1["learner/weight_sends"] - r0["learner/weight_sends"]
    sent = r1["learner/weight_bytes_sent"] - r0["learner/weight_bytes_sent"]
    blob = sent / max(1.0, sends)
    moved = r["bytes"]
    hosts = [f"env{j}" for j in range(1, args.env_hosts + 1)]
    actors = args.env_hosts * args.actors_per_host
    tx = moved["learner"]["eth0"]["tx"]
    lag = lags(rows)
    return {
        "relays": relays,
        "exit_code": r["exit_code"],
        "seconds": r["seconds"],
        "env_hosts": args.env_hosts,
        "actors": actors,
        "blob_bytes": blob,
        "versions": versions,
        "learner_weight_sends": sends,
        "learner_weight_bytes_sent": sent,
        "relay_count": r1.get("relay/count", 0.0),
        "weight_syncs": r1["sync/weight_syncs"] - r0["sync/weight_syncs"],
        "learner_host_tx_bytes": tx,
        "learner_host_tx_per_version": tx / max(1.0, versions),
        "per_version_over_hosts_blob": tx / max(1.0, versions) / (args.env_hosts * blob),
        "per_version_over_actors_blob": tx / max(1.0, versions) / (actors * blob),
        "sends_per_version": sends / max(1.0, versions),
        "env_host_rx_per_version": {h: moved[h]["eth0"]["rx"] / max(1.0, versions) for h in hosts},
        "policy_lag_p50": float(np.percentile(lag, 50)) if lag else float("nan"),
        "policy_lag_p99": float(np.percentile(lag, 99)) if lag else float("nan"),
        "policy_lag_samples": len(lag),
        "row_policy_lag_mean": float(np.mean([x["sync/policy_lag"] for x in rows])),
        "env_steps_per_s": r["env_steps_per_s"],
        # after the halt (final.json): sent = stored + lost, lost 0 without faults
        "final_rollouts_sent": final.get("flow/rollouts_sent"),
        "final_rollouts_stored": final.get("flow/rollouts_stored"),
        "final_rollouts_lost": final.get("flow/rollouts_lost"),
        "faults": {k: v for k, v in r1.items() if k.startswith("faults/") and v},
        "invariant_violations": r1.get("health/invariant_violations", 0.0),
        "relay_fallbacks": r1.get("env/workers/relay_fallbacks/max", 0.0),
        "bytes": moved,
    }


def table(points: list[dict[str, Any]]) -> str:
    head = (
        "| relays | versions | blob KB | learner sends / version | learner host MB out / version"
        " | / (hosts x blob) | / (actors x blob) | MB into each env host / version"
        " | policy lag p50 | p99 |"
    )
    lines = [head, "| --- |" + " ---: |" * 9]
    for p in points:
        into = ", ".join(f"{v / 1e6:.2f}" for v in p["env_host_rx_per_version"].values())
        lines.append(
            f"| {'on' if p['relays'] else 'off'} | {p['versions']:.0f} | {p['blob_bytes'] / 1e3:.0f}"
            f" | {p['sends_per_version']:.2f} | {p['learner_host_tx_per_version'] / 1e6:.2f}"
            f" | {p['per_version_over_hosts_blob']:.2f} | {p['per_version_over_actors_blob']:.2f}"
            f" | {into} | {p['policy_lag_p50']:.1f} | {p['policy_lag_p99']:.1f} |"
        )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env-hosts", type=int, default=4)
    p.add_argument("--actors-per-host", type=int, default=4)
    p.add_argument("--hiddens", type=int, default=512, help="width of the two hidden layers")
    p.add_argument("--steps-per-s", type=float, default=50.0, help="per simulated env worker")
    p.add_argument("--replay-ratio", type=float, default=0.08, help="learner.max_replay_ratio")
    p.add_argument("--seconds", type=float, default=24.0, help="length of the measured window")
    p.add_argument("--iterations", type=int, default=4, help="result rows in the window")
    p.add_argument("--modes", default="off,on", help="relays off, on, in this order")
    p.add_argument("--label", default="", help="name of this run set in the JSON file")
    p.add_argument("--json", type=Path, default=OUT)
    args = p.parse_args()
    points = []
    for mode in args.modes.split(","):
        points.append(measure(args, relays=mode.strip() == "on"))
        print(table(points[-1:]), flush=True)
    print()
    print(table(points))
    data = json.loads(args.json.read_text()) if args.json.exists() else {}
    data[args.label or time.strftime("%Y%m%d-%H%M%S")] = {
        "command": " ".join(sys.argv),
        "args": vars(args),
        "points": points,
    }
    args.json.write_text(json.dumps(data, indent=1, default=str) + "\n")


if __name__ == "__main__":
    main()
