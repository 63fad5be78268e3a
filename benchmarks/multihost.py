"""Bytes per host on a multi-host site made of network namespaces (cluster/netns.sh).

Builds a site (scheduler, driver, learner and env-worker hosts, each its own
namespace), runs ``apex-dask-submit`` on the driver's host and reads every
host's interface counters between two result dicts of the run (steady-state
training: start-up, the final halt and the weights download fall outside).
Prints the byte table and the driver-to-learner ratio; writes JSON.

    sudo .venv/bin/python benchmarks/multihost.py --preset minatar --seconds 90 \\
        --env-hosts 2 --workers-per-host 2 --set workers.num_workers=4 --tls

``--scaling 1,2,4,8,16`` builds one site per count of env workers (the same
hosts each time) and prints env steps/s with the efficiency against linear
from the first count, e.g. on the sleepy env (every step sleeps 2 ms):

    sudo .venv/bin/python benchmarks/multihost.py --preset cartpole --env-hosts 4 \\
        --workers-per-host 1 --seconds 20 --iterations 2 --scaling 1,2,4,8,16 \\
        --set env.env_id=apex_dask.algo.envs.benchmark:ApexSleepy-v0 \\
        --set replay.learning_starts=100000 --set eval.episodes=0 --label sleepy-scaling

Needs root (ip netns) and the venv's bin on PATH (it is put there).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "cluster"))

from netns_bytes import Site, format_table, total, window_between_iterations  # noqa: E402


def run_site(args: argparse.Namespace, workdir: Path) -> dict:
    out = workdir / "out"
    iter_s = max(1.0, args.seconds / max(1, args.iterations))
    submit = [
        "--preset", args.preset,
        "--set", f"report.min_iter_time_s={iter_s:g}",
        "--set", "report.timesteps_per_iteration=1",
        "--stop-iterations", str(args.iterations + 2),
        "--out", str(out), "--quiet", "--no-tensorboard",
    ]  # fmt: skip
    for s in args.set:
        submit += ["--set", s]
    site_args = [
        "--workdir", str(workdir),
        "--env-hosts", str(args.env_hosts),
        "--workers-per-host", str(args.workers_per_host),
        "--learner-processes", str(args.learner_processes),
        "--interface", args.interface,
    ]  # fmt: skip
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}")
    env["APEX_TLS"] = "on" if args.tls else "off"  # on: credentials made for the run
    env["APEX_NETNS_PREFIX"] = "ab" + uuid.uuid4().hex[:4]
    log = open(workdir / "netns.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [str(ROOT / "cluster" / "netns.sh"), *site_args, "--", *submit],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        site = None
        deadline = time.monotonic() + 120
        while site is None:
            if (workdir / "hosts.json").exists():
                site = Site(workdir)
            elif proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the site did not come up; see {workdir}/netns.log")
            else:
                time.sleep(0.1)
        moved, r0, r1 = window_between_iterations(
            site,
            out / "results.jsonl",
            1,
            args.iterations + 1,
            timeout_s=args.seconds + 900,
            alive=lambda: proc.poll() is None,
        )
        rc = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=60)
        log.close()
    iface = args.interface
    learner_rx = moved["learner"][iface]["rx"]
    driver = moved["driver"][iface]
    steps = r1["timesteps_total"] - r0["timesteps_total"]
    return {
        "args": vars(args),
        "exit_code": rc,
        "seconds": r1["time_s"] - r0["time_s"],
        "env_steps": steps,
        "env_steps_per_s": steps / max(1e-9, r1["time_s"] - r0["time_s"]),
        "learner_updates_per_s": (r1["learner/updates"] - r0["learner/updates"])
        / max(1e-9, r1["time_s"] - r0["time_s"]),
        "learner_busy_frac": r1.get("learner/busy_frac"),
        "rollouts_stored": r1["flow/rollouts_stored"] - r0["flow/rollouts_stored"],
        "rollouts_per_s": (r1["flow/rollouts_stored"] - r0["flow/rollouts_stored"])
        / max(1e-9, r1["time_s"] - r0["time_s"]),
        "driver_bytes": driver["rx"] + driver["tx"],
        "learner_rx_bytes": learner_rx,
        "driver_over_learner_rx": (driver["rx"] + driver["tx"]) / max(1, learner_rx),
        "bytes": moved,
        "host_totals": {h: total(v) for h, v in moved.items()},
        "placement": json.loads((out / "placement.json").read_text())
        if (out / "placement.json").exists()
        else None,
    }


def scaling(args: argparse.Namespace) -> None:
    """One site per env-worker count; env steps/s and efficiency against the first."""
    rows = []
    for n in (int(x) for x in args.scaling.split(",")):
        one = argparse.Namespace(**{**vars(args), "set": [*args.set, f"workers.num_workers={n}"]})
        with tempfile.TemporaryDirectory(prefix="apex-multihost-") as tmp:
            r = run_site(one, Path(tmp))
        rows.append({"env_workers": n, **{k: v for k, v in r.items() if k != "args"}})
        base = rows[0]["env_steps_per_s"] / rows[0]["env_workers"]
        rows[-1]["efficiency"] = r["env_steps_per_s"] / (n * base)
        print(
            f"{n:>3} env workers: {r['env_steps_per_s']:8.0f} env steps/s, "
            f"efficiency {rows[-1]['efficiency']:.2f}, driver {r['driver_bytes'] / 1e6:.2f} MB",
            flush=True,
        )
    print("\n| env workers | env steps/s | efficiency vs linear | rollouts/s | driver MB |")
    print("| ---: | ---: | ---: | ---: | ---: |")
    for row in rows:
        print(
            f"| {row['env_workers']} | {row['env_steps_per_s']:,.0f} | {row['efficiency']:.2f} "
            f"| {row['rollouts_per_s']:.1f} | {row['driver_bytes'] / 1e6:.3f} |"
        )
    path = Path(args.json)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[args.label or f"scaling-{time.strftime('%Y%m%d-%H%M%S')}"] = {
        "args": vars(args),
        "rows": rows,
    }
    path.write_text(json.dumps(data, indent=1, default=str))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--preset", default="minatar")
    p.add_argument("--seconds", type=float, default=90.0, help="length of the measured window")
    p.add_argument("--iterations", type=int, default=3, help="result dicts in the window")
    p.add_argument("--env-hosts", type=int, default=2)
    p.add_argument("--workers-per-host", type=int, default=2)
    p.add_argument("--learner-processes", type=int, default=0)
    p.add_argument("--interface", default="eth0", choices=["eth0", "ib0"])
    p.add_argument(
        "--tls",
        action="store_true",
        help="tls:// with credentials made for the run (else plain TCP)",
    )
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE")
    p.add_argument("--json", default=str(ROOT / "benchmarks" / "results" / "multihost.json"))
    p.add_argument("--label", default="", help="name of this measurement in the JSON file")
    p.add_argument("--scaling", default="", help="env-worker counts, one site each: 1,2,4,8,16")
    args = p.parse_args()
    if args.scaling:
        return scaling(args)
    with tempfile.TemporaryDirectory(prefix="apex-multihost-") as tmp:
        r = run_site(args, Path(tmp))
    print(format_table(r["bytes"]))
    print(
        f"\nwindow {r['seconds']:.1f} s, {r['env_steps']:.0f} env steps "
        f"({r['env_steps_per_s']:.0f}/s), {r['learner_updates_per_s']:.1f} learner updates/s, "
        f"rollouts stored {r['rollouts_stored']:.0f}, "
        f"learner busy {r['learner_busy_frac']}\n"
        f"driver host moved {r['driver_bytes'] / 1e6:.3f} MB = "
        f"{100 * r['driver_over_learner_rx']:.2f}% of the {r['learner_rx_bytes'] / 1e6:.2f} MB "
        f"the learner's host received"
    )
    path = Path(args.json)
    data = json.loads(path.read_text()) if path.exists() else {}
    data[args.label or f"{args.preset}-{time.strftime('%Y%m%d-%H%M%S')}"] = r
    path.write_text(json.dumps(data, indent=1, default=str))


if __name__ == "__main__":
    main()
