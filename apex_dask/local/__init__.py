"""The whole Ape-X loop in one process, with the same pieces as the Dask runtime.

``run_local(config)`` yields one flat result dict per iteration (metric names
in ``docs/metrics.md``)::

    from apex_dask.config import ApexConfig
    from apex_dask.local import run_local

    for result in run_local(ApexConfig.preset("cartpole"), stop={"eval_return": 475}):
        print(result["iteration"], result["eval/return_mean"])

The three concurrent operations of Ape-X run here as one round-robin
(:meth:`LocalApex.step`), repeated:

1. **rollouts**: each env worker (epsilon_i from :func:`apex_epsilons`)
   samples one fragment; it goes with its initial priorities to a random
   replay shard; a worker that has produced ``max_weight_sync_delay`` steps
   since its last sync gets the learner's weights, if a newer version exists;
2. **replay + learn**: batches are sampled from the shards that hold at least
   ``learning_starts / num_shards`` items (round-robin over those), trained
   on, and their new priorities go back to the source shard. Updates per round:
   with ``learner.max_replay_ratio`` = rho, as many as keep
   ``steps_trained <= rho * steps_sampled`` (transitions trained / env steps
   sampled); without it, one update per fragment stored (what a round-robin of
   RLlib's concurrent ops does), a replay ratio of batch_size / fragment_length;
3. **evaluation**: every ``eval.interval_s`` seconds (``0``: at the end of each
   iteration), ``eval.episodes`` greedy episodes on a separate env with the
   learner's newest weights.

An iteration ends once it lasted ``report.min_iter_time_s`` seconds *and*
sampled ``report.timesteps_per_iteration`` env steps, or when a stop
condition holds. ``torch.set_num_threads(1)`` is called for the process.
"""

from apex_dask.local.runner import LocalApex, run_local

__all__ = ["LocalApex", "run_local"]
