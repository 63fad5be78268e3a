"""MetricsStore: bounded series, per-bucket aggregation, run resets, JSON view."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from apex_dask.runtime.observability.metrics_store import MetricsStore


def msg(run: str = "r1", source: str = "learner", **metrics: float) -> dict:
    return {"run": run, "source": source, "time": 0.0, "metrics": metrics}


def feed(store: MetricsStore, name: str, points: list[tuple[float, float]], run: str = "r1"):
    for t, v in points:
        assert store.ingest({"run": run, "source": "s", "metrics": {name: v}}, now=t)


def test_last_value_in_a_one_second_bucket_wins():
    store = MetricsStore()
    feed(store, "x", [(10.1, 1.0), (10.5, 2.0), (11.2, 3.0), (11.9, 4.0), (12.0, 5.0)])
    assert store.since("x") == [(10.5, 2.0), (11.9, 4.0), (12.0, 5.0)]
    assert store.latest["x"] == 5.0


def test_series_stays_bounded_and_still_spans_the_whole_run():
    store = MetricsStore(maxlen=100)
    feed(store, "x", [(float(t), float(t)) for t in range(10_000)])
    points = store.since("x")
    assert len(points) < 100
    assert points[0][0] < 200.0  # the start of the run is still there
    assert points[-1] == (9999.0, 9999.0)
    times = [t for t, _ in points]
    assert times == sorted(times)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_coarsened_series_is_the_last_point_of_each_final_bucket(seed):
    rng = np.random.default_rng(seed)
    times = np.cumsum(rng.exponential(0.7, size=3000)) + 1000.0
    raw = [(float(t), float(v)) for t, v in zip(times, rng.normal(size=times.size), strict=True)]
    store = MetricsStore(maxlen=64)
    feed(store, "x", raw)
    width = store._series["x"].width
    assert width > 1.0  # it did coarsen
    last_per_bucket: dict[int, tuple[float, float]] = {}
    for t, v in raw:
        last_per_bucket[math.floor(t / width)] = (t, v)
    assert store.since("x") == [last_per_bucket[k] for k in sorted(last_per_bucket)]


def test_since_returns_only_later_points():
    store = MetricsStore()
    feed(store, "x", [(1.0, 1.0), (2.0, 2.0), (3.0, 3.0)])
    assert store.since("x", 1.5) == [(2.0, 2.0), (3.0, 3.0)]
    assert store.since("x", 3.0) == []
    assert store.since("missing") == []


def test_new_run_resets_series_and_keeps_previous_latest():
    store = MetricsStore()
    store.ingest(msg("a", a=1.0), now=1.0)
    generation = store.generation
    store.ingest(msg("b", b=2.0), now=2.0)
    assert store.run == "b"
    assert store.generation == generation + 1
    assert store.names() == ["b"]
    assert store.previous == {"run": "a", "latest": {"a": 1.0}}


def test_messages_from_a_replaced_run_are_ignored():
    store = MetricsStore()
    store.ingest(msg("a", x=1.0), now=1.0)
    store.ingest(msg("b", x=2.0), now=2.0)
    assert not store.ingest(msg("a", x=99.0), now=3.0)
    assert store.run == "b"
    assert store.latest == {"x": 2.0}


def test_malformed_messages_and_non_numbers_are_dropped():
    store = MetricsStore()
    assert not store.ingest({"metrics": {"x": 1.0}})
    assert not store.ingest({"run": "r", "metrics": [1, 2]})
    assert store.ingest({"run": "r", "metrics": {"x": "not a number", "y": 2, "z": None}})
    assert store.latest == {"y": 2.0}


def test_sources_are_tracked_with_their_last_report_time():
    store = MetricsStore()
    store.ingest(msg(source="replay/0", **{"replay/0/size": 1.0}), now=5.0)
    store.ingest(msg(source="env/3", **{"env/epsilon/3": 0.4}), now=6.0)
    assert store.sources == {"replay/0": 5.0, "env/3": 6.0}
    assert store.updated == 6.0 and store.started == 5.0


def test_number_of_names_is_bounded():
    store = MetricsStore(max_names=3)
    store.ingest(msg(**{f"m{i}": float(i) for i in range(5)}), now=1.0)
    assert len(store.names()) == 3
    assert store.dropped_names == 2


def test_to_json_filters_with_patterns_and_nulls_non_finite_values():
    store = MetricsStore()
    store.ingest(msg(**{"replay/0/size": 1.0, "replay/1/size": 2.0, "learner/loss": math.nan}), 1.0)
    store.ingest(msg(**{"replay/0/size": 3.0}), now=2.5)
    doc = store.to_json(names=["replay/*/size"])
    assert doc["run"] == "r1"
    assert doc["latest"] == {"replay/0/size": 3.0, "replay/1/size": 2.0}
    assert doc["series"]["replay/0/size"] == [[1.0, 1.0], [2.5, 3.0]]
    full = json.loads(json.dumps(store.to_json(), allow_nan=False))
    assert full["latest"]["learner/loss"] is None
    assert store.to_json(since=2.0)["series"]["replay/0/size"] == [[2.5, 3.0]]
    assert "series" not in store.to_json(series=False)
