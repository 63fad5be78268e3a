"""Driving a run on Dask: the driver, the plan and what they lean on.

- :mod:`.driver`: ``ApexDriver`` and ``train`` (the public entry points);
- :mod:`.plan`: the execution plan: builds the operations and jobs, ticks them;
- :mod:`.state`: the run's state (handles, counters), each piece kept once;
- :mod:`.operations`: the seed's store and replay + update operations;
- :mod:`.report`, :mod:`.evaluation`: one result per iteration, greedy evaluations;
- :mod:`.health`, :mod:`.checkpointing`, :mod:`.recovery`, :mod:`.pacing`: upkeep jobs;
- :mod:`.faults`: lost env workers: check, replace, or stop the run;
- :mod:`.tasks`: calls in flight with a handler each, and the ``Job`` base;
- :mod:`.launch`: creating, replacing and releasing the actors;
- :mod:`.placement`: which worker each actor goes to (pure);
- :mod:`.cluster`: embedded ``LocalCluster`` and connecting to a scheduler.
"""
