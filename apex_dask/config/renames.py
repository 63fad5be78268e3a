"""Config keys and values that changed: old config files and checkpoints still load.

``RETIRED`` keys are accepted and ignored with one ``FutureWarning`` line naming what
replaced them; :func:`renamed` maps a renamed key (or env id) to its new form.
"""

from __future__ import annotations

import warnings
from typing import Any

__all__ = ["RENAMED_ENV_IDS", "RETIRED", "renamed"]


RETIRED = {
    "workers.max_env_errors_per_min": (
        "workers.max_env_errors_per_min is no longer used and is ignored: a cap per minute "
        "ended runs of fast envs and let slow broken ones go on; env errors are now capped "
        "by workers.max_env_errors_per_1k_steps (default 10) and "
        "workers.max_consecutive_env_errors (default 5)"
    ),
}
"""Keys that are accepted (old config files and checkpoints still load) but ignored; each
gives one ``FutureWarning`` line naming what replaced it."""


RENAMED_ENV_IDS = {
    "apex_dask.algo.benchmark_envs:ApexSleepy-v0": "apex_dask.algo.envs.benchmark:ApexSleepy-v0",
}
"""Env ids that moved with their module: the old id still works, with one line naming the new."""


def renamed(key: Any, value: Any) -> tuple[Any, Any]:
    """Keys (and env ids) that were renamed, as their new key and value (old config files
    keep working)."""
    if key == "env.env_id" and value in RENAMED_ENV_IDS:
        new = RENAMED_ENV_IDS[value]
        warnings.warn(
            f"env.env_id {value} is now {new}; the old id still works", FutureWarning, stacklevel=3
        )
        return key, new
    if key == "replay.colocate_with_learner":
        if isinstance(value, str):
            value = value.strip().lower() in ("true", "yes", "on", "1")
        return "replay.placement", "learner_process" if value else "spread"
    return key, value
