"""RLlib keys that only concern Ray and Tune's machinery (ignored, each group with its
reason), and Python hooks a file cannot carry (refused unless unset).
"""

from __future__ import annotations

from typing import Any

from apex_dask.config.rllib.rules import (
    Ctx,
    Mapped,
    Outcome,
    Refused,
    group,
    ignore,
    noop,
    rule,
)

__all__ = ["RAY_RULES"]


_TUNE = (
    "local_dir",
    "storage_path",
    "name",
    "trial_name_creator",
    "trial_dirname_creator",
    "sync_config",
    "upload_dir",
    "sync_to_driver",
    "log_to_file",
    "verbose",
    "loggers",
    "export_formats",
    "checkpoint_score_attr",
    "checkpoint_config",
    "reuse_actors",
    "raise_on_failed_trial",
    "fail_fast",
    "queue_trials",
    "progress_reporter",
)


_RAY_MACHINERY = (
    "sample_async",
    "worker_cls",
    "enable_async_evaluation",
    "ope_split_batch_by_episode",
    "rl_module_spec",
    "_AlgorithmConfig__prior_exploration_config",
    "learner_class",
    "offline_sampling",
    "_use_trajectory_view_api",
    "remote_worker_envs",
    "remote_env_batch_wait_ms",
    "sampler_perf_stats_ema_coef",
    "max_requests_in_flight_per_sampler_worker",
    "max_requests_in_flight_per_replay_worker",
    "timeout_s_sampler_manager",
    "timeout_s_replay_manager",
    "create_env_on_driver",
    "enable_connectors",
    "sample_collector",
    "fake_sampler",
    "_disable_preprocessor_api",
    "_disable_action_flattening",
    "_disable_execution_plan_api",
    "_disable_initialize_loss_from_dummy_batch",
    "_enable_rl_module_api",
    "_enable_learner_api",
    "_enable_new_api_stack",
    "enable_rl_module_and_learner",
    "enable_env_runner_and_connector_v2",
    "simple_optimizer",
    "optimizer.debug",
    "synchronize_filters",
    "validate_workers_after_construction",
    "worker_health_probe_timeout_s",
    "worker_restore_timeout_s",
    "num_consecutive_worker_failures_tolerance",
    "ignore_worker_failures",
    "recreate_failed_workers",
    "restart_failed_env_runners",
    "recreate_failed_env_runners",
    "max_num_worker_restarts",
    "delay_between_worker_restarts_s",
    "disable_env_checking",
    "auto_wrap_old_gym_envs",
    "action_space",
    "observation_space",
    "env_task_fn",
    "actions_in_input_normalized",
    "export_native_model_files",
    "checkpoint_trainable_policies_only",
    "logger_config",
    "logger_creator",
    "log_sys_usage",
    "log_level",
    "policy_states_are_swappable",
    "collect_metrics_timeout",
    "metrics_episode_collection_timeout_s",
    "keep_per_episode_custom_metrics",
    "_validate_config",
    "is_atari",
    "in_evaluation",
    "always_attach_evaluation_results",
    "evaluation_num_workers",
    "evaluation_num_env_runners",
    "evaluation_parallel_to_training",
    "input_evaluation",
    "off_policy_estimation_methods",
    "postprocess_inputs",
    "shuffle_buffer_size",
    "output_compress_columns",
    "output_max_file_size",
    "input_config",
    "output_config",
)


_FRAMEWORK = (
    "framework",
    "use_pytorch",
    "eager",
    "eager_tracing",
    "eager_max_retraces",
    "tf_session_args",
    "local_tf_session_args",
    "_tf_policy_handles_more_than_one_loss",
    "enable_tf1_exec_eagerly",
    "torch_compile_learner",
    "torch_compile_worker",
)


_RAY_RESOURCES = (
    "num_cpus_per_worker",
    "num_gpus_per_worker",
    "num_cpus_for_driver",
    "custom_resources_per_worker",
    "placement_strategy",
    "num_cpus_for_local_worker",
    "memory",
    "object_store_memory",
    "memory_per_worker",
    "object_store_memory_per_worker",
    "num_learner_workers",
    "num_gpus_per_learner_worker",
    "num_cpus_per_learner_worker",
    "num_learners",
    "num_gpus_per_learner",
    "num_cpus_per_learner",
    "num_cpus_per_env_runner",
    "num_gpus_per_env_runner",
    "custom_resources_per_env_runner",
    "_fake_gpus",
    "extra_python_environs_for_driver",
    "extra_python_environs_for_worker",
    "resources_per_trial",
    "trial_resources",
    "resources",
)


def _callbacks(value: Any, ctx: Ctx) -> Outcome:
    if not value or "DefaultCallbacks" in str(value):
        return Mapped({}, "RLlib's default callbacks")
    return Refused("RLlib callbacks do not run in apex_dask")


RAY_RULES = [
    rule(("callbacks",), _callbacks, "-", "RLlib's defaults: nothing; others refused"),
    rule(
        ("input",),
        noop(("sampler", None), "samples from the envs", "offline input is not available"),
        "-",
        "sampler: nothing",
    ),
    rule(
        ("output",), ignore("apex_dask does not write RLlib's offline sample files"), "ignored", ""
    ),
    group(
        ("render_env", "record_env", "monitor"),
        ignore("apex-dask-eval --video records a trained policy"),
        "ignored",
        "",
    ),
    rule(
        ("lr_schedule",),
        noop((None,), "", "a learning-rate schedule is not available"),
        "-",
        "null: nothing",
    ),
    rule(
        ("before_learn_on_batch",),
        noop(
            (None,),
            "",
            "RLlib's Python hook cannot be read "
            "from a file; give an import path as learner.before_learn_on_batch",
        ),
        "-",
        "null: nothing",
    ),
    group(
        _RAY_RESOURCES,
        ignore(
            "Ray's resource requests; apex_dask runs on the Dask workers "
            "it is given (docs/cluster.md)"
        ),
        "ignored",
        "Ray resources",
    ),
    group(
        _FRAMEWORK,
        ignore("apex_dask's networks are PyTorch; the framework does not change what is learned"),
        "ignored",
        "the deep-learning framework",
    ),
    group(
        _RAY_MACHINERY,
        ignore(
            "Ray's own machinery (actors, sampling requests, logging, "
            "filters); apex_dask's counterparts are in docs/architecture.md"
        ),
        "ignored",
        "Ray's machinery",
    ),
    group(
        _TUNE,
        ignore("Tune's bookkeeping; apex_dask writes its run folder with --out"),
        "ignored",
        "Tune's bookkeeping",
    ),
]
