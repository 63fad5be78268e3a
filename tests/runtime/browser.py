"""Screenshots of dashboard pages with headless Chromium, driven over DevTools.

Chromium's own ``--screenshot`` fires at page load, before a Bokeh server
page has opened its websocket and drawn; this drives the DevTools protocol
instead (through Tornado's websocket client, already a Dask dependency):
open the page, wait until a JavaScript condition holds (by default: Bokeh
has rendered a document with data), then capture.

    shot = screenshot("http://127.0.0.1:8787/apex", "apex.png")
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")

# True once Bokeh has rendered a document holding at least `min_points` rows in some source.
BOKEH_READY_JS = """
(() => {
  const B = window.Bokeh;
  if (!B || !B.documents || B.documents.length === 0) return false;
  if (!B.index || Object.keys(B.index).length === 0) return false;
  for (const m of B.documents[0].all_models) {
    if (typeof m.get_length === "function" && (m.get_length() || 0) >= %d) return true;
  }
  return false;
})()
"""


def find_chromium() -> str | None:
    """Path of a Chromium/Chrome binary (``$CHROMIUM`` first), or None."""
    env = os.environ.get("CHROMIUM")
    if env and shutil.which(env):
        return shutil.which(env)
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


def in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def require_chromium() -> str:
    """The Chromium binary; skip without one, except in CI where it must be installed."""
    import pytest

    path = find_chromium()
    if path is None:
        reason = "Chromium not found: apt-get install -y chromium (or set $CHROMIUM)"
        if in_ci():
            pytest.fail(f"{reason}; CI must run the browser test (.ci/run installs it)")
        pytest.skip(reason)
    return path


def screenshot(
    url: str,
    path: str | Path,
    ready_js: str | None = None,
    min_points: int = 3,
    width: int = 1400,
    height: int = 1600,
    timeout_s: float = 60.0,
    settle_s: float = 1.5,
    chromium: str | None = None,
) -> Path:
    """Open ``url``, wait for ``ready_js`` to be true, then save a PNG at ``path``.

    Raises ``TimeoutError`` if the page is not ready within ``timeout_s`` and
    ``FileNotFoundError`` if no Chromium is found.
    """
    binary = chromium or find_chromium()
    if binary is None:
        raise FileNotFoundError("no chromium binary found (apt-get install -y chromium)")
    js = ready_js if ready_js is not None else BOKEH_READY_JS % min_points
    with tempfile.TemporaryDirectory(
        prefix="apex-chromium-", ignore_cleanup_errors=True
    ) as profile:
        proc = subprocess.Popen(
            [
                binary,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                "--hide-scrollbars",
                f"--user-data-dir={profile}",
                f"--window-size={width},{height}",
                "--remote-debugging-address=127.0.0.1",
                "--remote-debugging-port=0",
                "about:blank",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: its helpers go with it
        )
        try:
            port = _devtools_port(Path(profile), proc, timeout_s)
            png = asyncio.run(
                _capture(port, url, js, width, height, time.monotonic() + timeout_s, settle_s)
            )
        finally:
            _stop(proc)
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(png)
    return out


def _stop(proc: subprocess.Popen) -> None:
    """End the Chromium we started and its helper processes (its process group)."""
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(timeout=wait_s)
            break
        except subprocess.TimeoutExpired:
            continue


def _devtools_port(profile: Path, proc: subprocess.Popen, timeout_s: float) -> int:
    """Chromium writes its DevTools port to ``<profile>/DevToolsActivePort``."""
    deadline = time.monotonic() + timeout_s
    marker = profile / "DevToolsActivePort"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"chromium exited with status {proc.returncode}")
        if marker.exists():
            first = marker.read_text().splitlines()[:1]
            if first and re.fullmatch(r"\d+", first[0]):
                return int(first[0])
        time.sleep(0.05)
    raise TimeoutError("chromium did not open its DevTools port")


def _page_ws_url(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as r:
        targets = json.load(r)
    for target in targets:
        if target.get("type") == "page":
            return target["webSocketDebuggerUrl"]
    raise RuntimeError("chromium has no page target")


async def _capture(
    port: int, url: str, js: str, width: int, height: int, deadline: float, settle_s: float
) -> bytes:
    from tornado.websocket import websocket_connect

    ws = await websocket_connect(_page_ws_url(port), max_message_size=256 * 2**20)
    ids = itertools.count(1)

    async def call(method: str, **params: Any) -> dict[str, Any]:
        i = next(ids)
        await ws.write_message(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"no answer to {method}")
            raw = await asyncio.wait_for(ws.read_message(), timeout=left)
            if raw is None:
                raise RuntimeError("DevTools connection closed")
            msg = json.loads(raw)
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    try:
        await call(
            "Emulation.setDeviceMetricsOverride",
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        await call("Page.navigate", url=url)
        while True:
            res = await call("Runtime.evaluate", expression=js, returnByValue=True)
            if res.get("result", {}).get("value") is True:
                break
            if time.monotonic() > deadline:
                raise TimeoutError(f"page not ready: {url}")
            await asyncio.sleep(0.25)
        await asyncio.sleep(settle_s)  # let streamed points and layout paint
        shot = await call("Page.captureScreenshot", format="png")
        return base64.b64decode(shot["data"])
    finally:
        ws.close()
