"""Driving a run on Dask: the driver, the plan and what they lean on.

- :mod:`.driver`: ``ApexDriver`` and ``train`` (the public entry points);
- :mod:`.plan`: the seed's operations (store, replay + update, report);
- :mod:`.tasks`: calls in flight with a handler each;
- :mod:`.pacing`: optional ``min_replay_ratio`` pacing of env workers;
- :mod:`.faults`: lost actors: check, replace, or stop the run;
- :mod:`.launch`: creating, replacing and releasing the actors;
- :mod:`.placement`: which worker each actor goes to (pure);
- :mod:`.cluster`: embedded ``LocalCluster`` and connecting to a scheduler.
"""
