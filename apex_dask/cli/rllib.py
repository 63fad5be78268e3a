"""``--from-rllib FILE``: run an RLlib Ape-X experiment file (``apex-dask-submit``), or
sweep its Tune samplers (``apex-dask-sweep``).

::

    apex-dask-submit --from-rllib pong-apex.yaml --experiment pong-apex
    apex-dask-submit --from-rllib params.json --print-config > run.yaml   # see before running
    apex-dask-sweep --from-rllib cartpole-grid.yaml --concurrent 2

The conversion is :mod:`apex_dask.config.rllib`; here it meets the command line:
the env is made once for APEX_DDPG (its noise in action units needs the bounds),
the table is printed, a key apex_dask cannot honour is one line on stderr and exit 2
(``--rllib-lenient``: a warning line and the run goes on), and Tune samplers are
handed to ``apex-dask-sweep``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from apex_dask.cli.checks import UsageError
from apex_dask.config.rllib import (
    Conversion,
    convert,
    pick,
    read_experiments,
    sweep_file,
    table,
    with_table,
)

__all__ = [
    "add_rllib_flags",
    "check_rllib_flags",
    "conversion",
    "print_conversion",
    "sampler_refusal",
    "sweep_spec",
]


def add_rllib_flags(group: argparse._ArgumentGroup) -> None:
    group.add_argument(
        "--from-rllib",
        metavar="FILE",
        help="an RLlib APEX / APEX_DDPG experiment file (Tune YAML with one or more "
        "experiments, a bare config or a params.json); every key is converted, ignored "
        "with its reason, or refused (docs/rllib.md)",
    )
    group.add_argument(
        "--experiment", metavar="NAME", help="with --from-rllib: the experiment of FILE to run"
    )
    group.add_argument(
        "--rllib-lenient",
        action="store_true",
        help="with --from-rllib: a key apex_dask cannot honour is a warning, and the rest runs",
    )


def check_rllib_flags(args: argparse.Namespace, *, exclusive: tuple[str, ...]) -> None:
    """``--experiment`` / ``--rllib-lenient`` need ``--from-rllib``, which excludes ``exclusive``."""
    if not getattr(args, "from_rllib", None):
        for flag in ("experiment", "rllib_lenient"):
            if getattr(args, flag, None):
                raise UsageError(f"--{flag.replace('_', '-')} needs --from-rllib FILE")
        return
    for flag in exclusive:
        if getattr(args, flag.replace("-", "_"), None):
            raise UsageError(
                f"--from-rllib and --{flag} exclude each other: the RLlib file is the config "
                "(add --set KEY=VALUE to change a key)"
            )


def _action_half_range(conv: Conversion) -> float | None:
    """Half the width of the env's action bounds if equal in every dimension (else None)."""
    import numpy as np

    from apex_dask.algo.envs.factory import make_env_factory

    o = conv.overrides
    kwargs = {
        k[len("env.env_kwargs.") :]: v for k, v in o.items() if k.startswith("env.env_kwargs.")
    }
    try:
        env = make_env_factory(str(o.get("env.env_id")), kwargs)()
    except Exception:  # noqa: BLE001 - the checks before start name the problem
        return None
    try:
        space = env.action_space
        low, high = np.asarray(space.low, float), np.asarray(space.high, float)
    except AttributeError:
        return None
    finally:
        env.close()
    half = (high - low) / 2.0
    if half.size == 0 or not np.all(np.isfinite(half)) or not np.allclose(half, half.flat[0]):
        return None
    return float(half.flat[0])


def conversion(args: argparse.Namespace, prog: str) -> Conversion:
    """The checked conversion of ``--from-rllib FILE``; refusals print and raise (exit 2),
    lenient warnings print and go on."""
    path = Path(args.from_rllib).expanduser()
    exp = pick(read_experiments(path), args.experiment, path.name)
    lenient = bool(args.rllib_lenient)
    half = None
    if exp.run == "APEX_DDPG":
        half = _action_half_range(convert(exp, lenient=True))
    conv = convert(exp, lenient=lenient, action_half_range=half)
    hint = " (--rllib-lenient goes on without it, with a warning)"
    lines = [f"{exp.source}: {line}" for line in conv.refusals]
    if len(lines) > 3:  # at most three lines: the first two, then how many more
        more = len(lines) - 2
        lines = [
            *lines[:2],
            f"{exp.source}: {more} more keys refused; --rllib-lenient --print-config lists "
            "every key with what became of it",
        ]
        hint = ""
    for line in lines[:-1]:
        print(f"{prog}: error: {line}{hint}", file=sys.stderr, flush=True)
    if lines:
        raise UsageError(lines[-1] + hint)
    for line in conv.warnings:
        print(f"{prog}: warning: {exp.source}: {line}", file=sys.stderr, flush=True)
    return conv


def sampler_refusal(conv: Conversion, args: argparse.Namespace) -> UsageError:
    e = conv.experiment
    keys = ", ".join(conv.sampled)
    pick_flag = f" --experiment {e.name}" if args.experiment else ""
    return UsageError(
        f"{e.source}: {keys} {'is a Tune sampler' if len(conv.sampled) == 1 else 'are Tune samplers'} "
        f"({conv.trials} trials): one run cannot try several values; run them with "
        f"`apex-dask-sweep --from-rllib {args.from_rllib}{pick_flag}` "
        "(--print-config writes the sweep file)"
    )


def print_conversion(conv: Conversion, cfg: Any, *, yaml_out: bool) -> None:
    """``yaml_out``: the apex_dask YAML (a sweep file with Tune samplers), the table as
    its comments, on stdout; else the table alone."""
    import yaml

    if not yaml_out:
        print("\n".join(table(conv)), flush=True)
        return
    if conv.space:
        text = yaml.safe_dump(sweep_file(conv, cfg), sort_keys=False)
        what = "An apex-dask-sweep file (apex-dask-sweep THIS.yaml)"
    else:
        text = cfg.to_yaml()
        what = "An apex_dask config (apex-dask-submit --config THIS.yaml)"
    sys.stdout.write(with_table(conv, text, what))
    sys.stdout.flush()


def sweep_spec(args: argparse.Namespace) -> Any:
    """``apex-dask-sweep --from-rllib FILE``: the sweep of the file's Tune samplers
    (``grid_search``, ...) as a checked ``SweepSpec``, the table printed."""
    from apex_dask.cli.sweep.spec import spec_from_dict

    conv = conversion(args, "apex-dask-sweep")
    if not conv.space:
        raise UsageError(
            f"{conv.experiment.source}: no Tune sampler (grid_search, ...) to sweep; run it "
            f"with apex-dask-submit --from-rllib {args.from_rllib}"
        )
    base = conv.config()
    print_conversion(conv, base, yaml_out=False)
    path = Path(args.from_rllib).expanduser()
    return spec_from_dict(sweep_file(conv, base), path.parent, name=path.name)
