"""The one config of a run, from the command line: ``--preset``, ``--config``, ``--set``
and the ``--stop-*`` flags.

::

    cfg = resolve_config(args)             # base preset, the file's keys, --set, --stop-*
    overrides = cli_overrides(args)        # --set and --stop-* as dotted keys

A malformed ``--set`` or a config file that is not a mapping is a
:class:`~apex_dask.cli.checks.UsageError` (one line); a bad key or value is
the config's ``ConfigError``.
"""

from __future__ import annotations

import argparse
from typing import Any

from apex_dask.cli.checks import UsageError
from apex_dask.config import ApexConfig
from apex_dask.config.reader import MAX_BYTES

__all__ = ["DEFAULT_PRESET", "cli_overrides", "resolve_config", "stop_flags"]

DEFAULT_PRESET = "cartpole"
"""The base of a run when neither --preset nor the --config file names one."""


def _read_yaml(path: str) -> dict[str, Any]:
    from apex_dask.config.reader import read_document

    data = read_document(path, "config file")
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise UsageError(
            f"config file {path!r} must hold a mapping of sections, got {type(data).__name__}"
        )
    return data


def resolve_config(args: argparse.Namespace) -> ApexConfig:
    """The one ApexConfig from --preset, --config, --set and --stop-*.

    The base is --preset, else the file's ``preset:``, else
    :data:`DEFAULT_PRESET` (what ``--help`` says); the file's keys apply on
    top, then every --set, then the --stop-* flags.
    """
    if args.config:
        data = _read_yaml(args.config)
        if args.preset or "preset" not in data:
            data["preset"] = args.preset or DEFAULT_PRESET
        cfg = ApexConfig.from_dict(data)
    else:
        cfg = ApexConfig.preset(args.preset or DEFAULT_PRESET)
    overrides = cli_overrides(args)
    return cfg.override(overrides) if overrides else cfg


def cli_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """Every --set, then the --stop-* flags (and --elastic), as dotted config keys."""
    overrides: dict[str, Any] = {}
    for item in args.set:
        if "=" not in item:
            raise UsageError(
                f"--set {item!r} must look like KEY=VALUE, e.g. --set replay.alpha=0.5"
            )
        key, value = item.split("=", 1)
        if len(value) > MAX_BYTES:
            raise UsageError(
                f"--set {key.strip()[:60]}=...: the value is longer than {MAX_BYTES // 1024} KiB, "
                "the most apex_dask reads"
            )
        overrides[key.strip()] = value
    overrides.update(stop_flags(args))
    if getattr(args, "elastic", False) or getattr(args, "adapt", None):
        overrides["topology.elastic"] = True
    return overrides


def stop_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--stop-*`` flags given, as config keys (``stop.time_s``, ...)."""
    pairs = (
        ("stop_timesteps", "stop.timesteps"),
        ("stop_reward", "stop.reward"),
        ("stop_train_return", "stop.train_return"),
        ("stop_eval_return", "stop.eval_return"),
        ("stop_time", "stop.time_s"),
        ("stop_iterations", "stop.iterations"),
    )
    return {
        key: getattr(args, flag) for flag, key in pairs if getattr(args, flag, None) is not None
    }
