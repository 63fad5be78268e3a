"""/apex page components: feed a MetricsStore, call update(), read source.data."""

from __future__ import annotations

import pytest

from apex_dask.runtime.observability.dashboard import (
    EMPTY_TEXT,
    ApexDashboard,
    HealthStrip,
    Line,
    QueueSizeFigure,
    ReplaySizeFigure,
    RunStatus,
    TimeSeriesFigure,
)
from apex_dask.runtime.observability.metrics_store import MetricsStore


def ingest(store: MetricsStore, now: float, run: str = "r1", source: str = "learner", **m):
    assert store.ingest({"run": run, "source": source, "metrics": m}, now=now)


def test_page_shows_an_empty_state_until_a_run_reports():
    store = MetricsStore()
    page = ApexDashboard(store)
    page.update()
    assert EMPTY_TEXT in page.status.root.text
    assert page.grid.visible is False
    assert page.queue.source.data["time"] == []
    ingest(store, 1.0, **{"learner/queue_size": 3.0})
    page.update()
    assert EMPTY_TEXT not in page.status.root.text
    assert page.grid.visible is True
    assert page.queue.source.data["value"] == [3.0]


def test_update_streams_only_points_not_seen_before():
    store = MetricsStore()
    fig = TimeSeriesFigure(store, "t", [Line("env/steps_per_s", "steps", "red")], "steps/s")
    ingest(store, 1.0, **{"env/steps_per_s": 10.0})
    ingest(store, 2.0, **{"env/steps_per_s": 20.0})
    fig.update()
    assert fig.source.data == {"time": [1000.0, 2000.0], "value": [10.0, 20.0]}
    fig.update()
    assert len(fig.source.data["time"]) == 2
    ingest(store, 3.0, **{"env/steps_per_s": 30.0})
    fig.update()
    assert fig.source.data["value"] == [10.0, 20.0, 30.0]


def test_rollover_bounds_the_plotted_points():
    store = MetricsStore()
    fig = TimeSeriesFigure(store, "t", [Line("x", "x", "red")], "x", rollover=5)
    for t in range(20):
        ingest(store, float(t), x=float(t))
        fig.update()
    assert fig.source.data["value"] == [15.0, 16.0, 17.0, 18.0, 19.0]


def test_timers_are_plotted_in_milliseconds():
    store = MetricsStore()
    page = ApexDashboard(store)
    ingest(store, 1.0, **{"learner/dequeue_s": 0.002, "learner/grad_s": 0.005})
    page.update()
    assert page.timers.sources["learner/dequeue_s"].data["value"] == [pytest.approx(2.0)]
    assert page.timers.sources["learner/grad_s"].data["value"] == [pytest.approx(5.0)]
    assert page.timers.sources["learner/overall_s"].data["value"] == []


def test_queue_band_spans_q10_to_q90():
    store = MetricsStore()
    fig = QueueSizeFigure(store)
    for t, (lo, mean, hi) in enumerate([(1.0, 3.0, 5.0), (2.0, 4.0, 7.0)]):
        ingest(
            store,
            float(t),
            **{
                "learner/queue_size": mean,
                "learner/queue_size/q10": lo,
                "learner/queue_size/q90": hi,
            },
        )
    fig.update()
    assert fig.source.data["value"] == [3.0, 4.0]
    assert fig.band_source.data == {"time": [0.0, 1000.0], "lower": [1.0, 2.0], "upper": [5.0, 7.0]}


def test_replay_plot_adds_one_line_per_shard_as_shards_appear():
    store = MetricsStore()
    fig = ReplaySizeFigure(store)
    ingest(store, 1.0, source="replay/2", **{"replay/2/size": 50.0})
    fig.update()
    assert sorted(fig.sources) == [2]
    ingest(store, 2.0, source="replay/0", **{"replay/0/size": 10.0, "replay/size": 60.0})
    ingest(store, 3.0, source="replay/2", **{"replay/2/size": 70.0})
    fig.update()
    assert sorted(fig.sources) == [0, 2]
    assert fig.sources[2].data["value"] == [50.0, 70.0]
    assert fig.sources[0].data["value"] == [10.0]
    assert len(fig.root.renderers) == 2
    labels = sorted(item.label["value"] for item in fig.root.legend[0].items)
    assert labels == ["shard 0", "shard 2"]


def test_a_new_run_clears_every_plot():
    store = MetricsStore()
    page = ApexDashboard(store)
    ingest(store, 1.0, **{"learner/queue_size": 3.0, "learner/queue_size/q10": 1.0})
    ingest(store, 1.0, source="replay/0", **{"replay/0/size": 5.0})
    ingest(store, 1.0, **{"learner/queue_size/q90": 4.0})
    page.update()
    assert page.replay.sources[0].data["value"] == [5.0]
    ingest(store, 2.0, run="r2", **{"learner/queue_size": 9.0})
    page.update()
    assert page.queue.source.data["value"] == [9.0]
    assert page.queue.band_source.data["time"] == []
    assert page.replay.sources[0].data["value"] == []
    assert "r2" in page.status.root.text


def test_status_names_the_run_its_sources_and_key_values():
    store = MetricsStore()
    status = RunStatus(store)
    ingest(store, 1.0, run="<run&1>", source="driver", **{"env/steps_per_s": 8123.0})
    ingest(store, 1.0, run="<run&1>", source="replay/0", **{"replay/0/size": 1.0})
    ingest(store, 1.0, run="<run&1>", source="env/4", **{"env/epsilon/4": 0.1})
    status.update()
    text = status.root.text
    assert "&lt;run&amp;1&gt;" in text  # escaped
    assert "1 replay shards" in text and "1 env workers" in text and "driver" in text
    assert "8,123" in text and "env steps/s" in text


def test_replay_memory_plot_follows_each_shards_bytes():
    store = MetricsStore()
    fig = ReplaySizeFigure(store, metric="bytes")
    ingest(store, 1.0, source="replay/1", **{"replay/1/size": 5.0, "replay/1/bytes": 4096.0})
    fig.update()
    assert sorted(fig.sources) == [1] and fig.sources[1].data["value"] == [4096.0]
    assert fig.root.title.text == "Replay bytes per shard"


def test_the_selector_lists_every_run_and_shows_the_chosen_one():
    store = MetricsStore()
    page = ApexDashboard(store)
    ingest(store, 1.0, run="a", **{"env/steps_per_s": 10.0})
    page.update()
    assert not page.selector.root.visible  # one run: nothing to choose
    assert store.ingest({"run": "b", "source": "driver", "out": "/runs/b", "metrics": {}}, 2.0)
    ingest(store, 2.0, run="b", **{"env/steps_per_s": 99.0})
    store.ingest({"run": "a", "source": "driver", "done": True, "metrics": {}}, now=3.0)
    page.update()
    options = dict(page.selector.root.options)
    assert page.selector.root.visible and set(options) == {"", "a", "b"}
    assert options["b"] == "b /runs/b" and options["a"] == "a (done)"
    assert page.env_steps.sources["env/steps_per_s"].data["value"] == [99.0]  # the newest
    assert "/runs/b" in page.status.root.text and "(running)" in page.status.root.text
    page.selector.root.value = "a"  # as the browser does
    page.update()
    assert page.env_steps.sources["env/steps_per_s"].data["value"] == [10.0]
    assert "Run <b>a</b> (done)" in page.status.root.text


def test_the_animation_box_shows_the_shown_runs_newest_gif():
    store = MetricsStore()
    page = ApexDashboard(store)
    ingest(store, 1.0, run="a", **{"eval/return_mean": 9.0})
    page.update()
    assert "<img" not in page.animation.root.text and "eval.animation" in page.animation.root.text
    assert not store.set_animation({"run": "zzz", "gif": b"GIF89a"})  # not a kept run
    assert store.set_animation({"run": "a", "gif": b"GIF89a-1", "time": 2.0, "return": 7.0})
    page.update()
    assert "data:image/gif;base64,R0lGODlhLTE=" in page.animation.root.text
    assert "return 7" in page.animation.root.text
    assert (
        store.to_json()["animation"]["return"] == 7.0 and "gif" not in store.to_json()["animation"]
    )
    ingest(store, 3.0, run="b", **{"eval/return_mean": 1.0})  # a newer run, no animation yet
    page.update()
    assert "<img" not in page.animation.root.text
    page.selector.root.value = "a"
    page.update()
    assert "R0lGODlhLTE=" in page.animation.root.text


def test_device_plot_shows_a_cuda_learners_metrics_and_stays_empty_without_them():
    store = MetricsStore()
    page = ApexDashboard(store)
    ingest(store, 1.0, **{"learner/grad_s": 0.005})  # a CPU learner: no device metrics
    page.update()
    assert all(s.data["value"] == [] for s in page.device.sources.values())
    assert "device busy" not in page.status.root.text
    device = {
        "learner/device_busy": 0.85,
        "learner/h2d_s": 0.0012,
        "learner/device_mem_bytes": 2.0 * 2**30,
        "learner/device_mem_peak_bytes": 3.0 * 2**30,
    }
    ingest(store, 2.0, **device)
    page.update()
    src = page.device.sources
    assert src["learner/device_busy"].data["value"] == [pytest.approx(0.85)]
    assert src["learner/h2d_s"].data["value"] == [pytest.approx(1.2)]  # ms
    assert src["learner/device_mem_peak_bytes"].data["value"] == [pytest.approx(3.0)]  # GiB
    assert "85%" in page.status.root.text and "device busy" in page.status.root.text


def test_the_health_strip_is_green_while_all_holds_and_names_what_broke():
    store = MetricsStore()
    page = ApexDashboard(store)
    ingest(store, 1.0, source="learner", **{"learner/queue_size": 3.0})
    page.update()
    assert page.health.root.visible is False  # no result with health counts yet
    healthy = {
        "health/task_failures": 0.0,
        "health/task_failures/learner.priority_sender": 0.0,
        "health/invariant_violations": 0.0,
        "health/invariant_violations/sampling": 0.0,
    }
    ingest(store, 2.0, source="driver", **healthy)
    page.update()
    assert page.health.root.visible is True
    text = page.health.root.text
    assert "every background task running, every law holding" in text
    assert HealthStrip.OK_STYLE in text and "0 task failures, 0 invariant violations" in text
    broken = {
        **healthy,
        "health/task_failures": 2.0,
        "health/task_failures/learner.priority_sender": 2.0,
        "health/invariant_violations": 3.0,
        "health/invariant_violations/sampling": 3.0,
    }
    ingest(store, 3.0, source="driver", **broken)
    page.update()
    text = page.health.root.text
    assert HealthStrip.BAD_STYLE in text
    assert "learner.priority_sender failed x2" in text and "sampling violated x3" in text
    assert "2 task failures, 3 invariant violations" in text


def test_each_agents_declared_metrics_are_drawn_from_its_builders_declaration():
    """r2d2's ``learner/state_staleness`` (``chart="sync"``) is a line of the sync chart
    because its builder declares it; the JSON document lists every declared metric."""
    from apex_dask.algo.agents.registry import AGENTS, declared_metrics

    store = MetricsStore()
    page = ApexDashboard(store)
    synced = {m.name for b in AGENTS.values() for m in b.metrics if m.chart == "sync"}
    assert synced == {"learner/state_staleness"}
    assert synced <= set(page.sync.sources)
    ingest(store, 1.0, **{"learner/state_staleness": 3.5, "sync/policy_lag": 2.0})
    page.update()
    assert page.sync.sources["learner/state_staleness"].data["value"] == [3.5]
    listed = store.to_json()["agent_metrics"]
    assert set(listed) == set(declared_metrics()) >= {"env/noise_scale/<i>", *synced}
    assert listed["env/noise_scale/<i>"]["agents"] == ["dpg"]
    assert "noise scale" in listed["env/noise_scale/<i>"]["meaning"]
