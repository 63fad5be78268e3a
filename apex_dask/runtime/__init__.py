"""The Dask runtime of Ape-X, by role.

- :mod:`.actors`: replay shard, env worker and learner actors (+ prefetcher,
  call helpers): thin wrappers around :mod:`apex_dask.algo` objects;
- :mod:`.orchestration`: the driver, the execution plan, placement, actor
  creation, fault handling, cluster start/connect;
- :mod:`.observability`: metrics transport and store, the ``/apex``
  dashboard page, JSON/Prometheus routes, the scheduler preload
  (also importable as :mod:`apex_dask.runtime.preload`).

Layers: ``observability`` imports nothing else of the runtime; ``actors``
may import ``observability``; ``orchestration`` may import both. All may
import :mod:`apex_dask.experiment`, :mod:`apex_dask.config` and
:mod:`apex_dask.algo`; none imports :mod:`apex_dask.local` or
:mod:`apex_dask.cli`.
"""
