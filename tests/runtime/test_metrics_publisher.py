"""MetricsPublisher rate limiting, the message format, and the Prometheus mapping."""

from __future__ import annotations

import threading

import pytest

from apex_dask.runtime.observability.http import ApexCollector, prometheus_name
from apex_dask.runtime.observability.metrics import (
    TOPIC,
    ApexMetricsPlugin,
    MetricsPublisher,
    make_message,
)
from apex_dask.runtime.observability.metrics_store import MetricsStore


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def recording_publisher(min_interval_s: float = 1.0, **kw):
    sent: list[tuple[str, dict]] = []
    clock = Clock()
    pub = MetricsPublisher(
        "learner",
        "run-1",
        min_interval_s=min_interval_s,
        sink=lambda topic, m: sent.append((topic, m)),
        clock=clock,
        **kw,
    )
    return pub, sent, clock


def test_publish_sends_at_most_once_per_interval_with_the_latest_values():
    pub, sent, clock = recording_publisher()
    assert pub.publish({"a": 1.0})  # first call sends
    assert not pub.publish({"a": 2.0, "b": 1.0})
    clock.now += 0.5
    assert not pub.publish({"a": 3.0})
    clock.now += 0.6
    assert pub.publish({"c": 4.0})
    assert [m["metrics"] for _, m in sent] == [{"a": 1.0}, {"a": 3.0, "b": 1.0, "c": 4.0}]
    assert {topic for topic, _ in sent} == {TOPIC}
    assert pub.sent == 2


def test_force_sends_now_and_flush_sends_only_pending_values():
    pub, sent, clock = recording_publisher()
    pub.publish({"a": 1.0})
    assert pub.publish({"a": 2.0}, force=True)
    assert not pub.flush()  # nothing pending
    pub.publish({"b": 5.0})
    assert pub.flush()
    assert [m["metrics"] for _, m in sent] == [{"a": 1.0}, {"a": 2.0}, {"b": 5.0}]


def test_message_has_the_documented_format():
    m = make_message("run-7", "replay/3", {"replay/3/size": 12, "bad": "x", "none": None})
    assert set(m) == {"run", "source", "time", "metrics"}
    assert m["run"] == "run-7" and m["source"] == "replay/3"
    assert m["metrics"] == {"replay/3/size": 12.0}
    assert type(m["metrics"]["replay/3/size"]) is float


def test_publishing_from_many_threads_loses_no_final_value():
    pub, sent, _ = recording_publisher(min_interval_s=0.0)

    def work(k: int) -> None:
        for i in range(500):
            pub.publish({f"t{k}": float(i)})

    threads = [threading.Thread(target=work, args=(k,)) for k in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pub.flush()
    final: dict[str, float] = {}
    for _, m in sent:
        final.update(m["metrics"])
    assert final == {f"t{k}": 499.0 for k in range(4)}


def test_publisher_outside_a_worker_is_disabled_but_callable():
    pub = MetricsPublisher("learner", "r")
    assert not pub.enabled
    assert not pub.publish({"a": 1.0}, force=True)
    assert not pub.flush()


def test_a_failing_sink_does_not_raise():
    def broken(topic, m):
        raise RuntimeError("worker closing")

    pub = MetricsPublisher("learner", "r", sink=broken)
    assert not pub.publish({"a": 1.0}, force=True)
    assert pub.errors == 1


def test_plugin_stores_only_its_topic():
    plugin = ApexMetricsPlugin()
    plugin.log_event("other-topic", make_message("r", "learner", {"a": 1.0}))
    plugin.log_event(TOPIC, "not a dict")
    assert plugin.store.run is None
    plugin.log_event(TOPIC, make_message("r", "learner", {"a": 1.0}))
    assert plugin.store.latest == {"a": 1.0}


def test_plugin_pickles_with_its_settings_but_not_its_data():
    import pickle

    plugin = ApexMetricsPlugin(maxlen=50, resolution_s=2.0)
    plugin.log_event(TOPIC, make_message("r", "learner", {"a": 1.0}))
    copy = pickle.loads(pickle.dumps(plugin))
    assert copy.name == plugin.name and copy.topic == TOPIC
    assert (copy.store.maxlen, copy.store.resolution_s) == (50, 2.0)
    assert copy.store.run is None


@pytest.mark.parametrize(
    "metric, family, labels",
    [
        ("learner/queue_size", "apex_learner_queue_size", {}),
        ("learner/dequeue_s", "apex_learner_dequeue_seconds", {}),
        ("learner/grad_s", "apex_learner_grad_seconds", {}),
        ("learner/overall_s", "apex_learner_overall_seconds", {}),
        ("learner/updates_per_s", "apex_learner_updates_per_second", {}),
        ("learner/enqueue_blocked_s", "apex_learner_enqueue_blocked_seconds", {}),
        ("learner/device_busy", "apex_learner_device_busy", {}),
        ("learner/h2d_s", "apex_learner_h2d_seconds", {}),
        ("learner/device_mem_peak_bytes", "apex_learner_device_mem_peak_bytes", {}),
        ("env/steps_per_s", "apex_env_steps_per_second", {}),
        ("env/episode_return_mean", "apex_env_episode_return_mean", {}),
        ("eval/return_mean", "apex_eval_return_mean", {}),
        ("sync/policy_lag", "apex_sync_policy_lag", {}),
        ("replay/0/size", "apex_replay_size", {"shard": "0"}),
        ("replay/12/sample_s", "apex_replay_sample_seconds", {"shard": "12"}),
        ("replay/size", "apex_replay_size_all", {}),
        ("env/epsilon/3", "apex_env_epsilon", {"worker": "3"}),
        ("env/noise_scale/2", "apex_env_noise_scale", {"worker": "2"}),
        ("learner/queue_size/q90", "apex_learner_queue_size_quantile", {"quantile": "0.9"}),
        ("learner/queue_size/std", "apex_learner_queue_size_std", {}),
        ("time_s", "apex_time_seconds", {}),
        (
            "health/task_failures/driver.pacing",
            "apex_health_task_failures",
            {"task": "driver.pacing"},
        ),
        ("health/task_failures", "apex_health_task_failures_all", {}),
        (
            "health/invariant_violations/rollouts",
            "apex_health_invariant_violations",
            {"law": "rollouts"},
        ),
        ("health/invariant_violations", "apex_health_invariant_violations_all", {}),
        ("odd-name.x", "apex_odd_name_x", {}),
    ],
)
def test_prometheus_names(metric, family, labels):
    assert prometheus_name(metric) == (family, labels)


def test_collector_exposes_latest_values_as_gauges():
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    store = MetricsStore()
    registry = CollectorRegistry()
    registry.register(ApexCollector(store))
    assert generate_latest(registry) == b""  # no run yet: no gauges
    store.ingest(
        make_message(
            "r9",
            "learner",
            {"learner/queue_size": 4, "replay/0/size": 10, "replay/1/size": 20, "replay/size": 30},
        )
    )
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
    }
    r9 = ("run", "r9")
    assert samples == {
        ("apex_run_info", (("out", ""), r9)): 1.0,
        ("apex_learner_queue_size", (r9,)): 4.0,
        ("apex_replay_size", (r9, ("shard", "0"))): 10.0,
        ("apex_replay_size", (r9, ("shard", "1"))): 20.0,
        ("apex_replay_size_all", (r9,)): 30.0,
    }
    # a second run on the same scheduler: both runs' gauges, told apart by their label
    store.ingest(make_message("r10", "learner", {"learner/queue_size": 7}, out="/runs/b"))
    store.ingest(make_message("r9", "driver", {}, done=True))
    samples = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(generate_latest(registry).decode())
        for s in fam.samples
    }
    assert samples[("apex_learner_queue_size", (("run", "r10"),))] == 7.0
    assert samples[("apex_learner_queue_size", (r9,))] == 4.0
    assert samples[("apex_run_info", (("out", "/runs/b"), ("run", "r10")))] == 1.0
    assert samples[("apex_run_info", (("out", ""), r9))] == 0.0  # done
