"""A real browser (headless Chromium) renders the /apex page while metrics stream.

Skipped when no Chromium is installed (``apt-get install -y chromium``, or
point ``$CHROMIUM`` at a binary). Metrics come from synthetic actor sources;
to check the page during a real short training run, start that run in the
``streaming_page`` fixture instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from apex_dask.runtime.browser import find_chromium, screenshot
from apex_dask.runtime.dashboard_demo import start_synthetic_run, stop_synthetic_run
from apex_dask.runtime.preload import PRELOAD, dashboard_url

needs_chromium = pytest.mark.skipif(
    find_chromium() is None,
    reason="Chromium not found: apt-get install -y chromium (or set $CHROMIUM)",
)


@pytest.fixture(scope="module")
def streaming_page() -> Iterator[str]:
    """URL of /apex on a real cluster while actors publish metrics."""
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
        _, futures = start_synthetic_run(
            client, n_shards=2, n_envs=2, period_s=0.05, min_interval_s=0.2
        )
        url = dashboard_url(client)
        assert url is not None
        try:
            yield url
        finally:
            stop_synthetic_run(futures)


def plot_area_stats(path: Any) -> tuple[float, float]:
    """(grey-level standard deviation, fraction of coloured pixels) below the nav bar."""
    from PIL import Image, ImageStat

    img = Image.open(path).convert("RGB")
    w, h = img.size
    body = img.crop((0, 80, w, h))
    std = ImageStat.Stat(body.convert("L")).stddev[0]
    hsv = body.convert("HSV")
    saturation = hsv.getchannel("S").point(lambda s: 255 if s > 80 else 0)
    coloured = ImageStat.Stat(saturation).mean[0] / 255.0
    return std, coloured


@needs_chromium
def test_chromium_renders_live_plots_of_the_run(streaming_page, tmp_path):
    shot = screenshot(streaming_page, tmp_path / "apex.png", min_points=5, timeout_s=90)
    std, coloured = plot_area_stats(shot)
    print(f"grey std {std:.1f}, coloured {coloured:.3%}")
    assert std > 10.0, f"page body looks blank (grey std {std:.1f})"
    assert coloured > 0.002, f"no coloured plot lines ({coloured:.4%} coloured pixels)"


def test_blank_page_fails_the_check(tmp_path):
    """The pixel check itself rejects a page without plots."""
    from PIL import Image

    blank = tmp_path / "blank.png"
    Image.new("RGB", (1400, 1600), (250, 250, 250)).save(blank)
    std, coloured = plot_area_stats(blank)
    assert std < 10.0 and coloured < 0.002
