"""Checkpoints, in one place: their files, their folders, and what saves and restores itself.

::

    stateful     Stateful: state_dict() / load_state_dict(), the one interface of the
                 replay shard, each agent's learner and the in-process runner
    store        a checkpoint directory: .npz and JSON parts, a checksummed manifest,
                 written atomically (StagedCheckpoint for parts written by other processes)
    npz_check    an .npz checked against its own size before numpy allocates anything
    folder       a folder of ckpt-N: leftovers of interrupted writes, the newest that verifies
    runner       the in-process runner's checkpoint: its parts, NaN-weight refusal, resume

The Dask runtime's checkpoints use the same files: its learner and shard
actors write their parts into a staged checkpoint and the driver commits it
(``apex_dask.runtime.orchestration.checkpointing``, on the driver's event
loop, where the layers put it).
"""
