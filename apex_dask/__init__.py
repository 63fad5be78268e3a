"""apex_dask: Ape-X distributed prioritized replay DQN on Dask.

::

    from apex_dask import ApexConfig, ApexDriver, train

    cfg = ApexConfig.preset("cartpole")
    results = train(cfg, stop={"eval_return": 475})          # embedded LocalCluster
    with ApexDriver(cfg, client) as driver:             # your own cluster
        for result in driver.iterate():
            ...

``ApexDriver``, ``train`` and ``run_local`` are imported on first use, so
``import apex_dask`` stays light (no Dask or torch import).
"""

from typing import Any

from apex_dask.config import ApexConfig, ConfigError

__version__ = "0.1.0"
__all__ = ["ApexConfig", "ApexDriver", "ConfigError", "run_local", "train", "__version__"]

_LAZY = {
    "ApexDriver": "apex_dask.runtime.orchestration.driver",
    "train": "apex_dask.runtime.orchestration.driver",
    "run_local": "apex_dask.local",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'apex_dask' has no attribute {name!r}")
