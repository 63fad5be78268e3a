"""apex_dask: Ape-X distributed prioritized replay DQN on Dask."""

from apex_dask.config import ApexConfig, ConfigError

__version__ = "0.1.0"
__all__ = ["ApexConfig", "ConfigError", "__version__"]
