"""What ``apex-dask-submit`` checks before it starts anything.

::

    check_cluster_flags(args)              # exclusive flags, finite positive waits
    cfg = resolve_config(args)             # :mod:`.resolve`: --preset / --config / --set / --stop-*
    spaces = probe_env(cfg)                # one env, made here: spaces, env_kwargs
    check_device(cfg)                      # embedded runs: the learner's device exists
                                           # (remote runs: :mod:`.remote`, once connected)
    check_memory(cfg, spaces, plan_holdings(...), limits, names)   # :mod:`.memory`

Each failure is a :class:`UsageError` (or the config's ``ConfigError``) whose
message is one line naming the input and how to fix it; the CLI prints it
and exits with status 2.
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from apex_dask.config import ApexConfig

__all__ = [
    "EnvSpaces",
    "UsageError",
    "check_cluster_flags",
    "check_device",
    "cuda_device_count",
    "device_problem",
    "parse_adapt",
    "probe_env",
]


class UsageError(Exception):
    """Bad input from the user: printed as one line, exit status 2."""


def _short(obj: Any, n: int = 100) -> str:
    text = " ".join(str(obj).split())
    return text if len(text) <= n else text[: n - 3] + "..."


# ---------------------------------------------------------------------------
# flags
# ---------------------------------------------------------------------------


def _seconds(flag: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value > 0):
        raise UsageError(f"{flag} {value} must be a finite number of seconds > 0")


def check_cluster_flags(args: argparse.Namespace) -> None:
    """At most one cluster flag; a scheduler file that exists; finite positive waits
    (the flags of :func:`apex_dask.cli.clusterflags.add_cluster_flags`)."""
    chosen = [f for f in ("scheduler", "scheduler_file", "cluster") if getattr(args, f, None)]
    if len(chosen) > 1:
        names = " and ".join("--" + f.replace("_", "-") for f in chosen)
        raise UsageError(f"{names} exclude each other; give at most one")
    if args.scheduler_file and not Path(args.scheduler_file).expanduser().is_file():
        raise UsageError(
            f"scheduler file {args.scheduler_file!r} does not exist; start "
            f"`dask scheduler --scheduler-file {args.scheduler_file}` first or fix the path"
        )
    if (args.scheduler or args.scheduler_file) and getattr(args, "no_tls", False):
        raise UsageError(
            "--no-tls applies to a cluster this command starts (embedded or --cluster); "
            "a running scheduler keeps its own protocol: drop --no-tls"
        )
    if (args.scheduler or args.scheduler_file) and getattr(args, "dashboard_address", None):
        raise UsageError(
            "--dashboard-address applies to a cluster this command starts; a running "
            "scheduler's dashboard is set where it was started: drop --dashboard-address"
        )
    if getattr(args, "jobs", 1) < 1:
        raise UsageError(f"--jobs {args.jobs} must be >= 1")
    adapt = getattr(args, "adapt", None)
    if adapt is not None:
        if not getattr(args, "cluster", None):
            raise UsageError("--adapt needs --cluster slurm|pbs (jobqueue's adapt scales jobs)")
        parse_adapt(adapt)
    _seconds("--connect-timeout", args.connect_timeout)
    _seconds("--jobqueue-wait", getattr(args, "jobqueue_wait", None))


def parse_adapt(text: str) -> tuple[int, int]:
    """``--adapt MIN:MAX``: env-worker jobs adapt scales between (0 <= MIN <= MAX, MAX >= 1)."""
    lo, sep, hi = str(text).partition(":")
    try:
        bounds = (int(lo), int(hi)) if sep else None
    except ValueError:
        bounds = None
    if bounds is None or not 0 <= bounds[0] <= bounds[1] or bounds[1] < 1:
        raise UsageError(
            f"--adapt {text!r} must be MIN:MAX env-worker jobs with 0 <= MIN <= MAX and "
            "MAX >= 1, e.g. --adapt 1:8"
        )
    return bounds


# ---------------------------------------------------------------------------
# the environment, the device
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class EnvSpaces:
    """What one env made by the driver says about itself."""

    observation_space: Any
    action_space: Any


def probe_env(cfg: ApexConfig) -> EnvSpaces:
    """Make one env as the env workers will; check its spaces and ``env_kwargs``.

    The spaces must be ones the run's agent can take (its builder's
    ``check_spaces``: ``dqn`` a ``Discrete`` action space and a ``Box`` of rank 1-3,
    ``dpg`` bounded ``Box`` es of rank 1). Making it may take ``env.make_timeout_s``;
    a constructor that does not return is one line.
    """

    from apex_dask.algo.envs.factory import UnknownEnvError, make_env_factory

    env_id, kwargs = cfg.env.env_id, dict(cfg.env.env_kwargs)
    try:
        factory = make_env_factory(env_id, kwargs)
    except UnknownEnvError as exc:
        raise UsageError(str(exc)) from None
    if cfg.workers.vector_mode == "native":
        from apex_dask.algo.envs.native import native_game, native_kwargs

        if native_game(factory) is not None:
            try:
                native_kwargs(kwargs)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
    from apex_dask.algo.envs.guard import BoundedCaller, Late

    timeout = cfg.env.make_timeout_s
    maker = BoundedCaller("apex-probe-env")
    try:
        env = maker.call(factory, timeout)
        maker.close()
    except Late:  # its thread is abandoned (a daemon: it does not hold up the exit)
        raise UsageError(
            f"env {env_id!r} was not made within env.make_timeout_s={timeout:g} s (its "
            "constructor did not return); start what it needs, or raise env.make_timeout_s"
        ) from None
    except TypeError as exc:
        if kwargs:
            raise UsageError(
                f"env.env_kwargs {_short(kwargs, 60)} are not accepted by "
                f"gymnasium.make({env_id!r}): {_short(exc)}"
            ) from None
        raise UsageError(f"cannot make env {env_id!r}: TypeError: {_short(exc)}") from None
    except Exception as exc:
        raise UsageError(
            f"cannot make env {env_id!r}{' with env.env_kwargs ' + _short(kwargs, 60) if kwargs else ''}: "
            f"{type(exc).__name__}: {_short(exc)}"
        ) from None
    try:
        obs, act = env.observation_space, env.action_space
    finally:
        try:
            env.close()
        except Exception:  # closing a probe env must not fail the run
            pass
    from apex_dask.experiment.builder import agent_of

    agent = agent_of(cfg)
    problem = agent.check_spaces(obs, act, cfg.agent)
    if problem is not None:
        raise UsageError(
            f"env {env_id!r} has observation space {_short(obs, 60)} and action space "
            f"{_short(act, 60)}; {problem}"
        )
    return EnvSpaces(obs, act)


def cuda_device_count() -> int:
    """The CUDA devices torch sees in this process (run on a worker to ask it)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def device_problem(device: str, count: int, where: str) -> str | None:
    """Why ``learner.device=device`` cannot run where ``count`` CUDA devices are seen."""
    if not device.startswith("cuda"):
        return None
    index = int(device.partition(":")[2] or 0)
    if count == 0:
        return (
            f"learner.device={device!r} but torch sees no CUDA device on {where}; "
            "use learner.device=cpu (or auto)"
        )
    if index >= count:
        return (
            f"learner.device={device!r} but torch sees {count} CUDA device(s) on {where} "
            f"(cuda:0..cuda:{count - 1})"
        )
    return None


def check_device(cfg: ApexConfig) -> None:
    """The learner's device exists on this machine (embedded runs: the learner runs here)."""
    if cfg.learner.device.startswith("cuda"):
        problem = device_problem(cfg.learner.device, cuda_device_count(), "this machine")
        if problem:
            raise UsageError(problem)
