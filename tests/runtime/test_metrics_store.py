"""MetricsStore: bounded series, per-bucket aggregation, run resets, JSON view."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from apex_dask.runtime.observability.metrics_store import MetricsStore
from apex_dask.runtime.observability.metrics_view import RunView


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
    width = store.get()._series["x"].width
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


def test_runs_are_kept_side_by_side_and_the_newest_is_read_by_default():
    store = MetricsStore()
    store.ingest(msg("a", a=1.0), now=1.0)
    generation = store.generation
    store.ingest(msg("b", b=2.0), now=2.0)
    store.ingest(msg("a", a=3.0), now=3.0)  # the older run goes on: nothing is reset
    assert store.run == "b" and store.generation == generation + 1
    assert store.names() == ["b"] and store.names("a") == ["a"]
    assert store.since("a", run="a") == [(1.0, 1.0), (3.0, 3.0)]
    assert [r["run"] for r in store.runs()] == ["b", "a"]
    assert store.to_json(run="a")["latest"] == {"a": 3.0}
    with pytest.raises(KeyError):
        store.to_json(run="zzz")


def test_out_folder_and_done_are_recorded_per_run():
    store = MetricsStore()
    store.ingest({**msg("a", x=1.0), "out": "/runs/a"}, now=1.0)
    store.ingest(msg("b", x=2.0), now=2.0)
    store.ingest({**msg("a"), "done": True}, now=3.0)
    by_run = {r["run"]: r for r in store.runs()}
    assert (by_run["a"]["out"], by_run["a"]["done"]) == ("/runs/a", True)
    assert (by_run["b"]["out"], by_run["b"]["done"]) == (None, False)
    assert store.to_json(run="a")["done"] is True


def test_finished_runs_are_dropped_first_and_stay_dropped():
    store = MetricsStore(max_runs=3)
    for i, run in enumerate(["a", "b", "c"]):
        store.ingest(msg(run, x=float(i)), now=float(i))
    store.ingest({**msg("b"), "done": True}, now=5.0)
    store.ingest(msg("d", x=4.0), now=6.0)  # one too many: the finished "b" goes
    assert [r["run"] for r in store.runs()] == ["d", "c", "a"]
    assert not store.ingest(msg("b", x=9.0), now=7.0)  # a straggler does not bring it back
    store.ingest(msg("e", x=5.0), now=8.0)  # none finished: the one silent longest ("a")
    assert [r["run"] for r in store.runs()] == ["e", "d", "c"]


def test_a_view_follows_its_run_or_the_newest():
    store = MetricsStore()
    store.ingest(msg("a", x=1.0), now=1.0)
    newest, pinned = RunView(store), RunView(store, "a")
    g = newest.generation
    store.ingest(msg("b", x=2.0), now=2.0)
    assert newest.run == "b" and newest.generation == g + 1
    assert pinned.run == "a" and pinned.latest == {"x": 1.0}
    pinned.select(None)
    assert pinned.run == "b"


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


# -- the memory bound ---------------------------------------------------------------


def fill(store: MetricsStore, run: str, n_series: int, n_points: int, t0: float = 0.0) -> None:
    for k in range(n_points):
        metrics = {f"{run}/{i}": float(k) for i in range(n_series)}
        store.ingest({"run": run, "source": "s", "metrics": metrics}, now=t0 + k)


def test_points_stay_within_max_points_as_series_grow_and_every_series_spans_its_run():
    store = MetricsStore(maxlen=64, max_points=640)  # at least 4 points a series: 160 series
    assert store.memory_bound_bytes == 640 * 16
    for run, n in (("a", 5), ("b", 20), ("c", 75)):  # 5, then 25, then 100 series
        fill(store, run, n, 300, t0=1000.0)
        assert store.points_held() <= 640, (run, store.points_held())
        assert store.n_series * store.capacity <= 640
    assert store.capacity == 4 and store.dropped_names == 0  # halved 64 -> 4, none dropped
    for run in "abc":
        for name in store.names(run):
            points = store.since(name, run=run)
            assert 1 <= len(points) <= 4
            assert points[-1] == (1299.0, 299.0)  # the newest point is always kept
    # 70 more series: 60 fit; past 160 nothing finished can make room: 10 are not kept
    fill(store, "d", 70, 3, t0=2000.0)
    assert store.n_series == 160 and len(store.names("d")) == 60
    assert store.get("d").dropped_names == 3 * 10  # counted at each of the 3 reports
    assert store.points_held() <= 640


def test_a_finished_run_makes_room_for_a_live_runs_series():
    store = MetricsStore(maxlen=64, max_points=640)
    fill(store, "old", 150, 20)
    store.ingest({"run": "old", "source": "driver", "metrics": {}, "done": True}, now=30.0)
    fill(store, "new", 50, 20, t0=100.0)  # 200 series > 160: the finished run goes
    assert [r["run"] for r in store.runs()] == ["new"]
    assert store.dropped_names == 0 and len(store.names()) == 50
    assert store.points_held() <= 640
    assert store.capacity == 8  # with 50 series, each may hold more again (50 x 8 <= 640)


def test_encoded_document_is_the_to_json_document():
    store = MetricsStore()
    fill(store, "r", 12, 40)
    store.ingest(msg("r", **{"r/0": math.inf, "r/1": math.nan}), now=50.0)
    for kw in ({}, {"names": ["r/1*"]}, {"since": 20.5}, {"series": False}):
        assert json.loads(b"".join(store.json_chunks(**kw))) == json.loads(
            json.dumps(store.to_json(**kw), allow_nan=False)
        ), kw


def test_name_filter_matches_as_fnmatch_does_with_one_expression():
    from fnmatch import fnmatchcase

    from apex_dask.runtime.observability.metrics_store import name_filter

    names = [f"replay/{i}/size" for i in range(20)] + ["learner/q10", "env/epsilon/3", "a[b]"]
    patterns = ["replay/1*/size", "learner/q?0", "*[[]b]", "env/*/3", "nothing"]
    keep = name_filter(patterns)
    assert [n for n in names if keep(n)] == [
        n for n in names if any(fnmatchcase(n, p) for p in patterns)
    ]
    assert name_filter([])("anything") and name_filter([""])("anything")


def test_animations_larger_than_the_cap_are_not_kept():
    from apex_dask.runtime.observability.metrics_store import MAX_ANIMATION_BYTES

    store = MetricsStore()
    store.ingest(msg("r", x=1.0), now=1.0)
    assert not store.set_animation({"run": "r", "gif": b"x" * (MAX_ANIMATION_BYTES + 1)})
    assert store.set_animation({"run": "r", "gif": b"GIF89a"})
