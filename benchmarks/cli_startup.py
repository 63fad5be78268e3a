"""How long ``apex-dask-submit`` takes to start: this tree against another commit.

The other commit's ``apex_dask`` is unpacked (``git archive``) into a temporary folder,
this tree's copied into another, and each put first on ``PYTHONPATH`` of its runs
(started from a third folder): both are imported the same way (an editable install's
import hook would cost this tree alone). The two versions take turns, command by
command, and each command's median wall time is reported. Bytecode is cached as users have it
(``PYTHONDONTWRITEBYTECODE`` is unset; one run of each command first warms the cache).

* ``--help``, ``--print-config``, ``--list-keys``, a config error: parsing, the config
  tree, the presets;
* a memory refusal: the pre-start checks (config, the env probe, the replay's and the
  networks' memory) up to their one-line refusal;
* the ``training`` line of a real ``cartpole`` run: the embedded cluster up, the
  actors made.

::

    python benchmarks/cli_startup.py --baseline 30e1d41 --runs 9

Prints a table (ratio: this tree / baseline) and writes ``benchmarks/results/cli_startup.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SUBMIT = Path(sys.executable).parent / "apex-dask-submit"
COMMANDS = {
    "--help": ["--help"],
    "--print-config": ["--preset", "cartpole", "--print-config"],
    "--list-keys": ["--list-keys"],
    "a config error": ["--preset", "cartpole", "--set", "replay.alpha=fast"],
    "a memory refusal (pre-start checks)": [
        "--preset", "minatar", "--set", "replay.capacity=2000000000",
        "--set", "replay.learning_starts=100", "--stop-iterations", "1",
    ],
}  # fmt: skip
RUN = ["--preset", "cartpole", "--stop-iterations", "1", "--no-tensorboard"]


def unpack(rev: str, into: Path) -> str:
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", "--format=tar", rev, "apex_dask"],
        capture_output=True,
        check=False,
    )
    if archive.returncode != 0:
        sys.exit(f"cli_startup: git archive {rev} failed: {archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive.stdout, check=True)
    return subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", rev], capture_output=True, text=True
    ).stdout.strip()


def environ(path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = str(path)
    return env


def timed(args: list[str], env: dict[str, str], cwd: Path) -> float:
    t = time.perf_counter()
    subprocess.run([str(SUBMIT), *args], env=env, cwd=cwd, capture_output=True, check=False)
    return time.perf_counter() - t


def to_training(env: dict[str, str], cwd: Path) -> float:
    """Seconds until a real run prints that it is training."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        [str(SUBMIT), *RUN], env=env, cwd=cwd, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, text=True,
    )  # fmt: skip
    took = float("nan")
    for line in proc.stdout or []:
        if " training " in line and took != took:
            took = time.perf_counter() - t
    proc.wait()
    return took


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", required=True, help="a commit (anything git rev-parse takes)")
    ap.add_argument("--runs", type=int, default=9, help="runs of each command, each version")
    ap.add_argument("--real-runs", type=int, default=3, help="real cartpole runs, each version")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "cli_startup.json"
    )
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="cli_startup-") as tmp:
        base_dir, current_dir = Path(tmp) / "baseline", Path(tmp) / "current"
        base_dir.mkdir()
        sha = unpack(args.baseline, base_dir)
        ignore = shutil.ignore_patterns("__pycache__")
        shutil.copytree(ROOT / "apex_dask", current_dir / "apex_dask", ignore=ignore)
        versions = {"baseline": environ(base_dir), "current": environ(current_dir)}
        cwd = Path(tempfile.mkdtemp(dir=tmp))  # neither checkout on the path
        for env in versions.values():  # warm the bytecode caches
            for cmd in COMMANDS.values():
                timed(cmd, env, cwd)
        times: dict[str, dict[str, list[float]]] = {k: {v: [] for v in versions} for k in COMMANDS}
        times["the 'training' line of a run"] = {v: [] for v in versions}
        for i in range(args.runs):
            order = list(versions) if i % 2 == 0 else list(versions)[::-1]
            for name in order:
                for key, cmd in COMMANDS.items():
                    times[key][name].append(timed(cmd, versions[name], cwd))
                if i < args.real_runs:
                    times["the 'training' line of a run"][name].append(
                        to_training(versions[name], cwd)
                    )
    rows = {
        k: {v: statistics.median(t) for v, t in d.items()} | {"runs": len(d["current"])}
        for k, d in times.items()
    }
    print(f"{'command':<38} {'baseline s':>10} {'current s':>10}  ratio")
    for key, r in rows.items():
        ratio = r["current"] / r["baseline"]
        print(f"{key:<38} {r['baseline']:>10.3f} {r['current']:>10.3f}  {ratio:.3f}")
    head = subprocess.run(
        ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True, text=True
    ).stdout.strip()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    record = {
        "baseline": sha,
        "current": head,
        "python": platform.python_version(),
        "load_avg": os.getloadavg(),
        "median_s": rows,
    }
    args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
