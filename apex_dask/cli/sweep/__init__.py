"""``apex-dask-sweep``: Optuna searches over config keys, K trials at once on one cluster.

- :mod:`.spec`: the sweep file (base, space, objective, budget, sampler, pruner);
  the space itself is :mod:`apex_dask.config.space` (pure, shared with other front ends);
- :mod:`.study`: the Optuna study in ``DIR/study.journal``; each point exactly once;
- :mod:`.start`: the folder and study before trials run (new, or resumed and repaired);
- :mod:`.groups`: which workers each concurrent trial gets (pure);
- :mod:`.trial`: one trial, an ``ApexDriver`` run in ``DIR/trial-NNNN/``, pruned or not;
- :mod:`.runner`: K slots, each running trials one after the other;
- :mod:`.report`: the table, ``best.yaml``, ``trials.json`` and the plots;
- :mod:`.main`: flags, checks, exit codes.

Optuna is imported only inside this package, and only once a sweep runs.
"""

from apex_dask.cli.sweep.main import build_parser, main, run

__all__ = ["build_parser", "main", "run"]
