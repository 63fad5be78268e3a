"""Synthetic Ape-X metrics: a demo of the ``/apex`` page, and test traffic for it.

``python -m apex_dask.runtime.dashboard_demo --seconds 60`` starts a local
cluster with the preload, runs made-up learner / replay-shard / env-worker /
driver sources as actors that publish through :class:`MetricsPublisher`
(the real transport), and prints the page's URL. ``--screenshot PATH`` saves
a picture of the page (needs Chromium).

The numbers follow plausible shapes (a return curve rising to a plateau, a
noisy learner queue, shards filling to capacity); they are not a training run.
"""

from __future__ import annotations

import argparse
import math
import threading
import time
import uuid
from typing import Any

import numpy as np

from apex_dask.runtime.metrics import MetricsPublisher

ROLES = ("learner", "replay", "env", "driver")


def synthetic_metrics(
    role: str, index: int, elapsed_s: float, rng: np.random.Generator, n_envs: int = 8
) -> dict[str, float]:
    """One report of made-up metrics for ``role`` (``replay``/``env`` use ``index``)."""
    t = elapsed_s
    noise = float(rng.normal())
    if role == "learner":
        q = 6.0 + 3.0 * math.sin(t / 7.0) + noise
        updates = 150.0 * t
        return {
            "learner/queue_size": max(q, 0.0),
            "learner/queue_size/q10": max(q - 3.0, 0.0),
            "learner/queue_size/q90": q + 3.0,
            "learner/dequeue_s": 0.0015 + 0.0005 * abs(noise),
            "learner/grad_s": 0.0052 + 0.0003 * noise,
            "learner/overall_s": 0.0070 + 0.0005 * abs(noise),
            "learner/updates_per_s": 150.0 + 5.0 * noise,
            "learner/updates": updates,
            "learner/steps_trained": 512.0 * updates,
            "learner/loss": 1.0 / (1.0 + t / 10.0),
            "learner/enqueue_blocked_s": 0.02 * t,
        }
    if role == "replay":
        size = min(2000.0 * t, 50_000.0) * (1.0 + 0.05 * index)
        return {
            f"replay/{index}/size": size,
            f"replay/{index}/added": 2000.0 * t,
            f"replay/{index}/sampled": 4000.0 * t,
        }
    if role == "env":
        eps = 0.4 ** (1.0 + 7.0 * index / max(n_envs - 1, 1))
        return {f"env/epsilon/{index}": eps}
    if role == "driver":
        ret = 200.0 / (1.0 + math.exp(-(t - 20.0) / 6.0))
        out = {
            "env/steps_per_s": 8000.0 + 300.0 * noise,
            "env/steps_sampled": 8000.0 * t,
            "env/episode_return_mean": ret + 10.0 * noise,
            "sync/weight_syncs": math.floor(t * 4.0),
            "sync/policy_lag": 1.5 + 0.3 * noise,
            "replay/size": 4 * min(2000.0 * t, 50_000.0),
        }
        if int(t) % 5 == 0:
            out["eval/return_mean"] = ret * 1.1
        return out
    raise ValueError(f"unknown role {role!r}; one of {ROLES}")


class SyntheticSource:
    """Actor publishing :func:`synthetic_metrics` for one source every ``period_s``.

    The publisher is created here, in ``__init__``, and used from the actor's
    own thread, as a real actor would.
    """

    def __init__(
        self,
        role: str,
        index: int,
        run: str,
        period_s: float = 0.2,
        min_interval_s: float = 0.5,
        n_envs: int = 8,
        seed: int = 0,
    ) -> None:
        source = f"{role}/{index}" if role in ("replay", "env") else role
        self.publisher = MetricsPublisher(source, run, min_interval_s=min_interval_s)
        self._args = (role, index, n_envs)
        self._period = period_s
        self._rng = np.random.default_rng(seed)
        self._stop = threading.Event()
        self._start = time.monotonic()
        self._thread = threading.Thread(target=self._loop, daemon=True, name=f"synthetic-{source}")
        self._thread.start()

    def _loop(self) -> None:
        role, index, n_envs = self._args
        while not self._stop.wait(self._period):
            elapsed = time.monotonic() - self._start
            self.publisher.publish(synthetic_metrics(role, index, elapsed, self._rng, n_envs))

    def stop(self) -> int:
        """Stop publishing, flush, and return the number of messages sent."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.publisher.flush()
        return self.publisher.sent

    def sent(self) -> int:
        return self.publisher.sent


def start_synthetic_run(
    client: Any, run: str | None = None, n_shards: int = 2, n_envs: int = 4, **kw: Any
) -> tuple[str, list[Any]]:
    """Start one learner, ``n_shards`` shards, ``n_envs`` env workers and a driver source.

    Returns ``(run, actor futures)``; keep the futures while the run should go
    on, and call ``stop()`` on each actor (``f.result().stop()``) to end it.
    """
    run = run or f"synthetic-{uuid.uuid4().hex[:8]}"
    workers = sorted(client.scheduler_info(n_workers=-1)["workers"])
    roles = [("learner", 0), ("driver", 0)]
    roles += [("replay", k) for k in range(n_shards)] + [("env", i) for i in range(n_envs)]
    futures = [
        client.submit(
            SyntheticSource,
            role,
            index,
            run,
            n_envs=n_envs,
            seed=j,
            actor=True,
            workers=[workers[j % len(workers)]],
            pure=False,
            **kw,
        )
        for j, (role, index) in enumerate(roles)
    ]
    for f in futures:
        f.result(timeout=60)
    return run, futures


def stop_synthetic_run(futures: list[Any]) -> int:
    """Stop every source of :func:`start_synthetic_run`; total messages sent."""
    return sum(f.result().stop().result(timeout=30) for f in futures)


def main(argv: list[str] | None = None) -> None:
    from distributed import Client, LocalCluster

    from apex_dask.runtime.preload import PRELOAD, dashboard_url

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=60.0, help="how long to publish")
    p.add_argument("--dashboard-address", default=":8787")
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--envs", type=int, default=8)
    p.add_argument("--screenshot", default=None, help="save a PNG of /apex at the end")
    p.add_argument("--size", default="1400x1150", help="screenshot WIDTHxHEIGHT in pixels")
    args = p.parse_args(argv)
    with (
        LocalCluster(
            n_workers=2,
            threads_per_worker=1,
            processes=True,
            dashboard_address=args.dashboard_address,
            scheduler_kwargs={"preload": [PRELOAD]},
        ) as cluster,
        Client(cluster) as client,
    ):
        url = dashboard_url(client)
        run, futures = start_synthetic_run(client, n_shards=args.shards, n_envs=args.envs)
        print(f"run {run}: Ape-X page at {url}", flush=True)
        time.sleep(args.seconds)
        if args.screenshot and url:
            from apex_dask.runtime.browser import screenshot

            width, height = (int(x) for x in args.size.split("x"))
            shot = screenshot(url, args.screenshot, min_points=10, width=width, height=height)
            print("saved", shot)
        print("messages sent:", stop_synthetic_run(futures))


if __name__ == "__main__":
    main()
