"""What both runners share: the config-to-component mapping, results, stop rule, messages.

- :mod:`.builder`: config -> the learner's, shards' and env workers' arguments;
- :mod:`.results`: the one result builder (metric names of ``docs/metrics.md``);
- :mod:`.stop`: the one stop rule;
- :mod:`.messages`: the named types that cross actor boundaries.

The in-process runner (:mod:`apex_dask.local`) and the Dask runtime
(:mod:`apex_dask.runtime`) both import this layer and never each other.
"""
