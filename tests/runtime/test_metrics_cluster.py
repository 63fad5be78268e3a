"""Metrics collection on a scheduler without the preload or a Bokeh dashboard.

The driver registers the plugin itself (``ensure_plugin``) and publishes its
result dicts from the client; they are served as JSON over real HTTP. The
routes during a real training run (``/apex``, JSON, ``/metrics``, a real
browser) are checked in ``test_dashboard_run.py``.
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any

import pytest
from polling import poll

from apex_dask.runtime.observability.metrics import PLUGIN_NAME, publish_from_client
from apex_dask.runtime.preload import dashboard_url, ensure_plugin

pytestmark = pytest.mark.slow  # starts a LocalCluster (in-process scheduler and HTTP server)


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.status, r.read().decode()


def metrics_json(base: str) -> dict[str, Any]:
    status, body = get(base + "apex/metrics.json")
    assert status == 200
    return json.loads(body)


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
