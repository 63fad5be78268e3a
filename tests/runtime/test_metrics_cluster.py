"""The Ape-X metrics path on a real cluster, checked over real HTTP.

Actors on worker processes publish through ``MetricsPublisher`` (the real
``log_event`` transport) into the plugin the scheduler preload registered;
``/apex``, ``/apex/metrics.json``, ``/metrics`` and ``/status`` are fetched
with urllib.

The metrics come from synthetic sources (``start_synthetic_run``). To check
the same things during a real short training run, replace the body of the
``metrics_run`` fixture by a short run started in the background; the tests
only rely on the run id and on metrics changing over time.
"""

from __future__ import annotations

import importlib
import json
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from apex_dask.runtime import preload
from apex_dask.runtime.dashboard_demo import start_synthetic_run, stop_synthetic_run
from apex_dask.runtime.metrics import PLUGIN_NAME, ApexMetricsPlugin, publish_from_client
from apex_dask.runtime.preload import PRELOAD, dashboard_url, ensure_plugin


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.status, r.read().decode()


def poll(fn, timeout_s: float = 20.0, interval_s: float = 0.1) -> Any:
    """Call ``fn`` until it returns something truthy; return that."""
    deadline = time.monotonic() + timeout_s
    while True:
        out = fn()
        if out:
            return out
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout_s} s")
        time.sleep(interval_s)


@pytest.fixture(scope="module")
def apex_client() -> Iterator[Any]:
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=":0",
            memory_limit="2GiB",
            scheduler_kwargs={"preload": [PRELOAD]},
        ) as cluster,
        Client(cluster, direct_to_workers=True) as client,
    ):
        yield client


@pytest.fixture(scope="module")
def metrics_run(apex_client) -> Iterator[dict[str, str]]:
    """A run publishing metrics from actors: ``{"run": id, "base": dashboard base URL}``."""
    run, futures = start_synthetic_run(
        apex_client, n_shards=2, n_envs=2, period_s=0.05, min_interval_s=0.2
    )
    url = dashboard_url(apex_client)
    assert url is not None and url.endswith("/apex")
    yield {"run": run, "base": url[: -len("apex")]}
    assert stop_synthetic_run(futures) > 0


def metrics_json(base: str, query: str = "") -> dict[str, Any]:
    status, body = get(base + "apex/metrics.json" + query)
    assert status == 200
    return json.loads(body)


def test_apex_page_serves_a_bokeh_document(metrics_run):
    from bokeh.client import pull_session
    from bokeh.models import ColumnDataSource, Div

    url = metrics_run["base"] + "apex"
    status, body = get(url)
    assert status == 200
    assert "Bokeh.embed" in body
    with pull_session(url=url) as session:  # the document itself, over Bokeh's websocket
        doc = session.document
        assert doc.title == "Dask: Ape-X"
        divs = [m for m in doc.select({"type": Div}) if metrics_run["run"] in m.text]
        assert divs, "the status header names the run"
        sizes = [len(s.data.get("time", [])) for s in doc.select({"type": ColumnDataSource})]
        assert max(sizes) > 0, "plots carry data"


def test_metrics_json_reports_every_source_and_changes_over_time(metrics_run):
    base, run = metrics_run["base"], metrics_run["run"]
    expected_sources = {"learner", "driver", "replay/0", "replay/1", "env/0", "env/1"}
    first = poll(lambda: (d := metrics_json(base)) and set(d["sources"]) >= expected_sources and d)
    assert first["run"] == run
    for name in ["learner/queue_size", "replay/0/size", "replay/1/size", "env/epsilon/1"]:
        assert name in first["latest"] and first["series"][name]
    later = poll(
        lambda: (
            (d := metrics_json(base))["latest"]["learner/updates"]
            > first["latest"]["learner/updates"]
            and d
        )
    )
    assert later["updated"] > first["updated"]
    assert len(later["series"]["learner/updates"]) >= len(first["series"]["learner/updates"])


def test_metrics_json_filters_names_and_time(metrics_run):
    base = metrics_run["base"]
    poll(lambda: "replay/1/size" in metrics_json(base)["latest"])
    doc = metrics_json(base, "?names=replay/*/size&series=0")
    assert set(doc["latest"]) == {"replay/0/size", "replay/1/size"}
    assert "series" not in doc
    now = time.time()
    recent = metrics_json(base, f"?names=learner/updates&since={now}")
    assert all(t > now for t, _ in recent["series"]["learner/updates"])


def test_prometheus_endpoint_carries_apex_gauges(metrics_run):
    from prometheus_client.parser import text_string_to_metric_families

    base, run = metrics_run["base"], metrics_run["run"]
    poll(lambda: "replay/1/size" in metrics_json(base)["latest"])
    status, text = get(base + "metrics")
    assert status == 200
    samples = {
        (s.name, tuple(sorted(s.labels.items())))
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("apex_")
    }
    for name in [
        "apex_learner_queue_size",
        "apex_learner_dequeue_seconds",
        "apex_learner_grad_seconds",
        "apex_learner_overall_seconds",
        "apex_learner_updates_per_second",
        "apex_env_steps_per_second",
        "apex_env_episode_return_mean",
        "apex_sync_policy_lag",
        "apex_learner_enqueue_blocked_seconds",
    ]:
        assert (name, ()) in samples
    assert ("apex_replay_size", (("shard", "0"),)) in samples
    assert ("apex_replay_size", (("shard", "1"),)) in samples
    assert ("apex_env_epsilon", (("worker", "1"),)) in samples
    assert ("apex_run_info", (("run", run),)) in samples


def test_navigation_bar_links_the_apex_page(metrics_run):
    status, body = get(metrics_run["base"] + "status")
    assert status == 200
    assert 'href="apex"' in body


def test_preload_and_plugin_registration_are_idempotent(apex_client, metrics_run):
    base = metrics_run["base"]
    poll(lambda: metrics_json(base)["latest"])

    def plugin_id(dask_scheduler) -> int:
        return id(dask_scheduler.plugins[PLUGIN_NAME])

    before = apex_client.run_on_scheduler(plugin_id)
    messages = metrics_json(base)
    importlib.reload(preload)  # Dask may import a preload module twice
    importlib.import_module(PRELOAD)
    apex_client.run_on_scheduler(lambda dask_scheduler: preload.dask_setup(dask_scheduler))
    assert ensure_plugin(apex_client) is True
    assert ensure_plugin(apex_client) is True
    apex_client.register_plugin(ApexMetricsPlugin())  # idempotent: keeps the first one
    assert apex_client.run_on_scheduler(plugin_id) == before
    after = metrics_json(base)
    assert after["run"] == messages["run"]
    assert after["started"] == messages["started"]  # data kept
    _, text = get(base + "metrics")
    assert text.count("apex_run_info{") == 1  # one collector
    _, status_page = get(base + "status")
    assert status_page.count('href="apex"') == 1  # one navigation link
    assert get(base + "apex")[0] == 200


def test_driver_side_registration_on_a_scheduler_without_dashboard():
    from distributed import Client, LocalCluster

    with (
        LocalCluster(
            n_workers=0,
            processes=False,
            dashboard_address=None,  # no Bokeh dashboard; the HTTP server still runs
            scheduler_kwargs={"dashboard_address": ":0"},
        ) as cluster,
        Client(cluster) as client,
    ):
        assert dashboard_url(client) is None
        assert ensure_plugin(client) is False  # no page without a dashboard...
        publish_from_client(client, "driver-run", {"env/steps_per_s": 5.0, "iteration": 1})

        def latest(dask_scheduler) -> dict[str, float]:
            return dict(dask_scheduler.plugins[PLUGIN_NAME].store.latest)

        # ...but the plugin collects what the driver publishes, served as JSON
        assert poll(lambda: client.run_on_scheduler(latest)) == {
            "env/steps_per_s": 5.0,
            "iteration": 1.0,
        }
        port = client.scheduler_info()["services"]["dashboard"]
        doc = metrics_json(f"http://127.0.0.1:{port}/")
        assert doc["run"] == "driver-run" and doc["latest"]["iteration"] == 1.0
