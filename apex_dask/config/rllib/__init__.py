"""Convert RLlib Ape-X experiment files (``run: APEX`` / ``APEX_DDPG``, three eras of key
names, Tune's ``grid_search`` and samplers) to apex_dask configs.

::

    from apex_dask.config.rllib import convert, pick, read_experiments

    exp = pick(read_experiments("pong-apex.yaml"), name=None, where="pong-apex.yaml")
    conv = convert(exp, lenient=False)
    conv.refusals or conv.config()     # one line per key apex_dask cannot honour, else the config

The mapping is a table of rules (:mod:`.registry`; every key with its meaning in
``docs/rllib.md``); :mod:`.convert` applies it, :mod:`.report` prints it. Pure: no
env is made here (the CLI passes the action bounds DDPG's noise needs).
"""

from apex_dask.config.rllib.convert import Conversion, Row, convert
from apex_dask.config.rllib.files import RUNS, Experiment, RLlibError, pick, read_experiments
from apex_dask.config.rllib.report import flat_config, sweep_file, table, with_table

__all__ = [
    "RUNS",
    "Conversion",
    "Experiment",
    "RLlibError",
    "Row",
    "convert",
    "flat_config",
    "pick",
    "read_experiments",
    "sweep_file",
    "table",
    "with_table",
]
