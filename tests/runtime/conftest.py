"""Shared fixtures for runtime tests: real Dask clusters with worker processes."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


@pytest.fixture(scope="module")
def local_cluster() -> Iterator[object]:
    """A real ``LocalCluster``: 2 worker processes, 1 thread each, dashboard on a free port."""
    from distributed import LocalCluster

    cluster = LocalCluster(
        n_workers=2,
        threads_per_worker=1,
        processes=True,
        dashboard_address=":0",
        memory_limit="2GiB",
    )
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.fixture(scope="module")
def client(local_cluster) -> Iterator[object]:
    """A client on :func:`local_cluster`, talking to workers directly."""
    from distributed import Client

    with Client(local_cluster, direct_to_workers=True) as c:
        yield c


@pytest.fixture(scope="module")
def worker_addresses(client) -> list[str]:
    """The cluster's worker addresses, sorted."""
    return sorted(client.scheduler_info()["workers"])


def _count_actors(dask_worker) -> int:
    return len(dask_worker.state.actors)


@pytest.fixture
def actors_per_worker():
    """``f(client) -> {worker address: number of live actors}``."""
    return lambda client: client.run(_count_actors)
