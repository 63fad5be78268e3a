"""The /apex page, /apex/metrics.json and /metrics during a real short training run.

One module-scoped run serves every test here: a ``LocalCluster`` with two
worker processes and the scheduler preload, an :class:`ApexDriver` training
CartPole (cartpole preset, one result dict a second) and a background thread
consuming ``driver.iterate()``. The routes are fetched over real HTTP
(urllib), the Bokeh document over Bokeh's websocket, and the page is rendered
by headless Chromium. The last test feeds a store two simulated hours of
metrics to check the page's cost stays bounded over long runs.
"""

from __future__ import annotations

import importlib
import json
import math
import re
import threading
import time
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest
from browser import find_chromium, require_chromium, screenshot
from polling import poll

from apex_dask.config import ApexConfig
from apex_dask.runtime import preload
from apex_dask.runtime.observability.dashboard import ApexDashboard
from apex_dask.runtime.observability.metrics import PLUGIN_NAME, ApexMetricsPlugin
from apex_dask.runtime.observability.metrics_store import MetricsStore
from apex_dask.runtime.orchestration.driver import ApexDriver
from apex_dask.runtime.preload import PRELOAD, dashboard_url, ensure_plugin

RUN_BUDGET_S = 150.0  # the consumer halts the run after this, whatever the tests do
NUM_SHARDS = 2
NUM_ENV_WORKERS = 2

# Result-dict names only the driver publishes (no actor reports them), so the
# store's latest value is exactly that of the last result dict it received: among them
# the run totals (flow/*, health/*), which the learner holds too but does not publish.
DRIVER_ONLY = (
    "iteration time_s timesteps_total env/steps_sampled env/steps_per_s env/episode_return_mean "
    "learner/updates_per_s learner/busy_frac learner/replay_ratio replay/size sync/weight_syncs "
    "sync/policy_lag flow/rollouts_sent flow/rollouts_stored flow/batches_received "
    "flow/batches_trained flow/priority_updates_sent health/task_failures"
).split()
# Names actors publish beyond the result dict: per-env-worker detail, the
# evaluator's weights version and the learner's cumulative update time (the
# driver turns it into learner/busy_frac).
# (Result rows hold the env workers' summaries, env/workers/<x>/<stat>; each env worker's
# own env/<i>/<x> and exploration parameter env/<e>/<i> come from the actor alone.)
ACTOR_ONLY = re.compile(
    r"^(env/\d+/[a-z_]+|env/[a-z_]+/\d+|eval/weights_version|learner/grad_total_s)$"
)


def get(url: str) -> tuple[int, str]:
    with urllib.request.urlopen(url, timeout=20) as r:
        return r.status, r.read().decode()


class RealRun:
    """A driver training in the background; ``results`` grows as ``iterate()`` yields."""

    def __init__(self, driver: ApexDriver, client: Any) -> None:
        self.driver = driver
        self.client = client
        url = driver.dashboard_link
        assert url is not None and url.endswith("/apex"), url
        self.page = url
        self.base = url[: -len("apex")]
        self.results: list[dict[str, float]] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._consume, name="apex-results", daemon=True)

    def _consume(self) -> None:
        t0 = time.monotonic()
        try:
            for result in self.driver.iterate():
                self.results.append(result)
                if self._stop.is_set() or time.monotonic() - t0 > RUN_BUDGET_S:
                    break
            self.driver.halt()
        except BaseException as exc:  # surfaced by check()
            self.error = exc

    def start(self) -> None:
        self._thread.start()
        poll(lambda: self.check() or len(self.results) >= 2, timeout_s=120)

    def check(self) -> bool:
        """Raise the run's error, if it failed; False otherwise (for ``poll``)."""
        if self.error is not None:
            raise AssertionError(f"the training run failed: {self.error!r}")
        return False

    def result(self, iteration: int) -> dict[str, float]:
        """The result dict of ``iteration``, once the consumer has it."""

        def find() -> dict[str, float] | None:
            self.check()
            return next((r for r in self.results if r["iteration"] == iteration), None)

        return poll(find)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.driver.stop()


@pytest.fixture(scope="module")
def real_run() -> Iterator[RealRun]:
    from distributed import Client, LocalCluster

    cfg = ApexConfig.preset("cartpole").override(
        {
            "report.min_iter_time_s": 1,
            "report.timesteps_per_iteration": 200,
            "replay.learning_starts": 500,
            "replay.num_shards": NUM_SHARDS,
            "workers.num_workers": NUM_ENV_WORKERS,
            "eval.interval_s": 2.0,
            "eval.episodes": 2,
            "topology.call_timeout_s": 30.0,
            "seed": 5,
        }
    )
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
        run = RealRun(ApexDriver(cfg, client), client)
        try:
            run.start()
            yield run
        finally:
            run.stop()


def metrics_json(base: str, query: str = "") -> dict[str, Any]:
    status, body = get(base + "apex/metrics.json" + query)
    assert status == 200
    return json.loads(body)


def same(served: float | None, result: float) -> bool:
    """A JSON value (NaN served as null) equals a result-dict value."""
    return math.isnan(result) if served is None else served == result


# -- HTTP -------------------------------------------------------------------------


@pytest.mark.slow
def test_driver_links_the_apex_page_of_its_scheduler(real_run):
    assert real_run.driver.dashboard_link == dashboard_url(real_run.client)
    status, body = get(real_run.base + "status")
    assert status == 200
    assert 'href="apex"' in body  # the navigation bar links the page


@pytest.mark.slow
def test_apex_page_serves_a_bokeh_document_of_the_run(real_run):
    from bokeh.client import pull_session
    from bokeh.models import ColumnDataSource, Div

    status, body = get(real_run.page)
    assert status == 200
    assert "Bokeh.embed" in body
    with pull_session(url=real_run.page) as session:  # the document, over Bokeh's websocket
        doc = session.document
        assert doc.title == "Dask: Ape-X"
        divs = [m for m in doc.select({"type": Div}) if real_run.driver.run_id in m.text]
        assert divs, "the status header names the run"
        assert f"{NUM_SHARDS} replay shards" in divs[0].text
        assert f"{NUM_ENV_WORKERS} env workers" in divs[0].text
        filled = [s for s in doc.select({"type": ColumnDataSource}) if len(s.data["time"]) >= 2]
        assert len(filled) >= 8, "most plot lines carry points of the run"


@pytest.mark.slow
def test_metrics_json_values_grow_while_training(real_run):
    base = real_run.base
    # cumulative counters of each source (learner, shard, driver): one source per name,
    # so a series never steps back to a value read before the one it holds
    growing = [
        "learner/steps_trained",
        "learner/updates",
        "replay/0/added",
        "flow/batches_trained",
        "env/steps_sampled",
        "iteration",
    ]
    first = poll(lambda: (d := metrics_json(base)) and all(n in d["latest"] for n in growing) and d)
    assert first["run"] == real_run.driver.run_id
    expected = {"learner", "driver"}
    expected |= {f"replay/{k}" for k in range(NUM_SHARDS)}
    expected |= {f"env/{i}" for i in range(NUM_ENV_WORKERS)}
    assert set(first["sources"]) >= expected

    def later() -> dict[str, Any] | None:
        real_run.check()
        d = metrics_json(base)
        return d if all(d["latest"][n] > first["latest"][n] for n in growing) else None

    second = poll(later)
    assert second["updated"] > first["updated"]
    for name in growing:
        values = [v for _, v in second["series"][name]]
        assert len(values) >= 2 and values == sorted(values), name  # cumulative: never falls


@pytest.mark.slow
def test_metrics_json_carries_the_result_dict_names_and_values(real_run):
    doc = metrics_json(real_run.base, "?series=0")
    n = int(doc["latest"]["iteration"])
    last = real_run.result(n)  # published before the driver hands it out
    seen = [r for r in real_run.results if r["iteration"] <= n]
    result_names = set().union(*seen)
    served = set(doc["latest"])
    assert result_names <= served, f"result names not served: {sorted(result_names - served)}"
    extra = sorted(name for name in served - result_names if not ACTOR_ONLY.match(name))
    assert extra == [], f"served names that no result dict carries: {extra}"
    for name in DRIVER_ONLY:
        assert same(doc["latest"][name], last[name]), (name, doc["latest"][name], last[name])


@pytest.mark.slow
def test_each_env_workers_epsilon_is_served_while_rows_hold_its_summary(real_run):
    """The per-worker epsilon view: each env worker's epsilon, published by the actor, in
    /apex/metrics.json (latest and series); result rows carry only the summary."""
    names = {f"env/epsilon/{i}" for i in range(NUM_ENV_WORKERS)}

    def served() -> dict[str, Any] | None:
        d = metrics_json(real_run.base, "?names=env/epsilon/*")
        return d if set(d["latest"]) == names and all(d["series"][n] for n in names) else None

    doc = poll(served)
    eps = sorted(doc["latest"].values())
    assert 0 < eps[0] < eps[-1] <= 1, eps  # the Ape-X ladder: one epsilon per worker
    row = real_run.result(2)
    assert not [k for k in row if re.match(r"^env/(\d+/|epsilon/\d)", k)], sorted(row)
    assert row["env/workers/epsilon/min"] == pytest.approx(eps[0])
    assert row["env/workers/epsilon/max"] == pytest.approx(eps[-1])


@pytest.mark.slow
def test_every_replay_shard_reports_its_size(real_run):
    base = real_run.base
    names = {f"replay/{k}/size" for k in range(NUM_SHARDS)}
    doc = poll(lambda: (d := metrics_json(base, "?names=replay/*/size")) and d["series"] and d)
    assert set(doc["latest"]) == names
    for name in names:
        assert doc["series"][name], name
    assert sum(doc["latest"].values()) > 0
    cut = doc["series"]["replay/0/size"][-1][0]
    newer = metrics_json(base, f"?names=replay/0/size&since={cut}")
    assert all(t > cut for t, _ in newer["series"]["replay/0/size"])
    latest_only = metrics_json(base, "?names=replay/*/size,learner/queue_size&series=0")
    assert "series" not in latest_only
    assert set(latest_only["latest"]) == names | {"learner/queue_size"}


@pytest.mark.slow
def test_prometheus_endpoint_carries_apex_gauges_of_the_run(real_run):
    from prometheus_client.parser import text_string_to_metric_families

    poll(lambda: "env/steps_per_s" in metrics_json(real_run.base, "?series=0")["latest"])
    status, text = get(real_run.base + "metrics")
    assert status == 200
    run = real_run.driver.run_id
    samples = {  # this run's samples, keyed by their other labels
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "run"))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("apex_") and s.labels.get("run") == run
    }
    gauges = (
        "apex_learner_queue_size apex_learner_dequeue_seconds apex_learner_grad_seconds "
        "apex_learner_overall_seconds apex_learner_updates_per_second apex_learner_steps_trained "
        "apex_env_steps_per_second apex_env_steps_sampled apex_sync_policy_lag "
        "apex_learner_enqueue_blocked_seconds apex_replay_size_all"
    ).split()
    for name in gauges:
        assert (name, ()) in samples, name
    assert samples[("apex_learner_steps_trained", ())] > 0
    assert ("apex_learner_queue_size_quantile", (("quantile", "0.9"),)) in samples
    for k in range(NUM_SHARDS):
        assert samples[("apex_replay_size", (("shard", str(k)),))] >= 0
    for i in range(NUM_ENV_WORKERS):
        assert ("apex_env_epsilon", (("worker", str(i)),)) in samples
        assert samples[("apex_env_worker_steps_sampled", (("worker", str(i)),))] > 0
    assert samples[("apex_run_info", (("out", ""),))] == 1.0  # running, no --out
    assert not [n for n, _ in samples if re.search(r"_\d+_", n)], "no index inside a gauge name"


@pytest.mark.slow
def test_the_evaluators_animation_reaches_the_page(real_run):
    """cartpole turns eval.animation on: the first eval episode comes as a small GIF."""
    import io

    from PIL import Image

    doc = poll(lambda: (d := metrics_json(real_run.base, "?series=0")).get("animation") and d)
    anim = doc["animation"]
    assert anim["length"] >= 1 and anim["weights_version"] >= 0
    assert "gif" not in anim  # the JSON carries what it shows, not the bytes

    def page_gif(dask_scheduler) -> bytes:
        return dask_scheduler.plugins[PLUGIN_NAME].store.get().animation["gif"]

    gif = Image.open(io.BytesIO(real_run.client.run_on_scheduler(page_gif)))
    assert gif.format == "GIF" and max(gif.size) <= 96 and gif.n_frames >= 2


@pytest.mark.slow
def test_preload_and_plugin_registration_are_idempotent(real_run):
    client, base = real_run.client, real_run.base

    def plugin_id(dask_scheduler) -> int:
        return id(dask_scheduler.plugins[PLUGIN_NAME])

    before = client.run_on_scheduler(plugin_id)
    messages = metrics_json(base, "?series=0")
    importlib.reload(preload)  # Dask may import a preload module twice
    importlib.import_module(PRELOAD)
    client.run_on_scheduler(lambda dask_scheduler: preload.dask_setup(dask_scheduler))
    assert ensure_plugin(client) is True
    assert ensure_plugin(client) is True  # as the driver does on a running scheduler
    client.register_plugin(ApexMetricsPlugin())  # idempotent: keeps the first one
    assert client.run_on_scheduler(plugin_id) == before
    after = metrics_json(base, "?series=0")
    assert after["run"] == messages["run"] == real_run.driver.run_id
    assert after["started"] == messages["started"]  # data kept
    _, text = get(base + "metrics")
    assert text.count("apex_run_info{") == 1  # one collector
    _, status_page = get(base + "status")
    assert status_page.count('href="apex"') == 1  # one navigation link
    assert get(real_run.page)[0] == 200


# -- a real browser ---------------------------------------------------------------


# Plot line colours (Category10) and the plots drawing them on the /apex page.
LINE_COLOURS = {
    "blue": (0x1F, 0x77, 0xB4),  # queue size, dequeue, replay shard 0, episode return
    "orange": (0xFF, 0x7F, 0x0E),  # grad, replay shard 1, policy lag
    "green": (0x2C, 0x98, 0x2C),  # overall (learner timers only)
    "purple": (0x94, 0x67, 0xBD),  # env steps/s only
}


def plot_area_stats(path: Any) -> dict[str, float]:
    """Below the navigation bar: grey-level standard deviation, fraction of coloured
    pixels, and the number of pixels close to each plot line colour."""
    from PIL import Image, ImageStat

    img = Image.open(path).convert("RGB")
    w, h = img.size
    body = img.crop((0, 80, w, h))
    out = {"std": ImageStat.Stat(body.convert("L")).stddev[0]}
    saturation = body.convert("HSV").getchannel("S").point(lambda s: 255 if s > 80 else 0)
    out["coloured"] = ImageStat.Stat(saturation).mean[0] / 255.0
    counts = body.getcolors(maxcolors=w * h) or []
    for name, ref in LINE_COLOURS.items():
        out[name] = float(
            sum(
                c
                for c, rgb in counts
                if sum(abs(a - b) for a, b in zip(rgb, ref, strict=True)) <= 24
            )
        )
    return out


@pytest.mark.slow
def test_chromium_renders_live_plots_of_the_run(real_run, tmp_path):
    chromium = require_chromium()
    shot = screenshot(
        real_run.page, tmp_path / "apex.png", min_points=5, timeout_s=90, chromium=chromium
    )
    real_run.check()
    stats = plot_area_stats(shot)
    print({k: round(v, 4) for k, v in stats.items()})
    assert stats["std"] > 10.0, f"page body looks blank: {stats}"
    assert stats["coloured"] > 0.002, f"no coloured plot lines: {stats}"
    # A legend swatch is a few dozen pixels; a line across a plot is hundreds.
    for name in LINE_COLOURS:
        assert stats[name] > 300, f"no {name} plot line drawn: {stats}"


def test_blank_page_fails_the_pixel_check(tmp_path):
    """The pixel check itself rejects a page without plots."""
    from PIL import Image

    blank = tmp_path / "blank.png"
    Image.new("RGB", (1400, 1600), (250, 250, 250)).save(blank)
    stats = plot_area_stats(blank)
    assert stats["std"] < 10.0 and stats["coloured"] < 0.002
    assert all(stats[name] == 0 for name in LINE_COLOURS)


# -- long runs --------------------------------------------------------------------


def test_two_hour_run_keeps_series_bounded_and_page_updates_incremental():
    """Two hours of 1 Hz reports of 30 metrics (7,400 messages): every series stays
    within ``maxlen`` points yet spans the run, the JSON document stays bounded, and
    a page update hands out only the points that arrived since the last one."""
    maxlen, seconds, t0 = 3600, 7400, 1_000.0
    store = MetricsStore(maxlen=maxlen)
    page = ApexDashboard(store)
    page_names = (
        "learner/queue_size learner/queue_size/q10 learner/queue_size/q90 learner/dequeue_s "
        "learner/grad_s learner/overall_s learner/updates_per_s env/steps_per_s "
        "env/episode_return_mean eval/return_mean sync/policy_lag sync/weight_syncs "
        "learner/enqueue_blocked_s replay/0/size replay/1/size workers/env_workers "
        "workers/dask_workers learner/state_staleness "
        "learner/device_busy learner/h2d_s learner/device_mem_bytes learner/device_mem_peak_bytes"
    ).split()  # learner/state_staleness: an r2d2 learner's; the last four: a CUDA learner's
    names = page_names + [f"extra/{i}" for i in range(30 - len(page_names))]

    def report(t: float) -> None:
        metrics = {name: t + j for j, name in enumerate(names)}
        assert store.ingest({"run": "long", "source": "learner", "metrics": metrics}, now=t)

    plotted = 0
    for s in range(seconds):
        report(t0 + s)
        if s % 60 == 59:  # a page open all along, updated once a (simulated) minute
            page.update()
            plotted += 1
    assert plotted == seconds // 60

    point_counts = {name: len(store.since(name)) for name in names}
    assert max(point_counts.values()) < maxlen
    assert min(point_counts.values()) >= maxlen // 4  # coarsened, not truncated
    for name in names:
        points = store.since(name)
        assert points[0][0] < t0 + 10 and points[-1][0] == t0 + seconds - 1  # spans the run
    doc = store.to_json()
    assert sum(len(s) for s in doc["series"].values()) == sum(point_counts.values())

    shown = [f for f in page.figures if f is not page.agent]  # that of installed agents
    sources = [s for fig in shown for s in getattr(fig, "sources", {}).values()]
    sources.append(page.queue.band_source)
    lengths = [len(s.data["time"]) for s in sources]
    assert len(sources) == 21 and min(lengths) > 0
    assert max(lengths) <= page.queue.rollover  # the browser's copy is bounded too

    page.update()  # catch up with the reports since the last minute's update
    before = [list(s.data["time"]) for s in sources]
    t_new = t0 + seconds + 0.5
    report(t_new)  # one more report: exactly one new point per line
    page.update()
    for source, old in zip(sources, before, strict=True):
        now = source.data["time"]
        assert now[-1] == t_new * 1000.0 and now[-2] == old[-1]
        assert len(now) == min(len(old) + 1, page.queue.rollover)
    page.update()  # nothing new: nothing streamed
    assert all(
        s.data["time"][-2:] == [old[-1], t_new * 1000.0]
        for s, old in zip(sources, before, strict=True)
    )


def test_chromium_check_is_mandatory_in_ci(monkeypatch, tmp_path):
    """Without Chromium the browser test skips locally but fails when ``CI`` is set."""
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no browser on it
    monkeypatch.delenv("CHROMIUM", raising=False)
    assert find_chromium() is None
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception):
        require_chromium()
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception):
        require_chromium()
