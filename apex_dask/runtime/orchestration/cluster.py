"""Start or reach the Dask cluster an Ape-X run uses, with bounded waits and one-line errors.

::

    cluster, client = start_local_cluster(n_workers=4)        # embedded, owns both
    client = connect("tcp://10.0.0.5:8786", timeout=10)       # a running scheduler
    client = connect(scheduler_file="~/scheduler.json")       # HPC: shared file
    workers = wait_for_workers(client, n=1, timeout_s=30)

Every failure raises :class:`~apex_dask.runtime.errors.ApexRuntimeError`
whose message is one line (scheduler unreachable, scheduler file missing or
unreadable, no workers within the wait). Clients made here talk to workers
directly (``direct_to_workers=True``): actor calls skip the scheduler hop.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.placement import WorkerInfo, workers_from_scheduler_info

if TYPE_CHECKING:
    from distributed import Client, LocalCluster

__all__ = ["connect", "start_local_cluster", "wait_for_workers"]


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def connect(
    address: str | None = None,
    *,
    scheduler_file: str | os.PathLike | None = None,
    timeout: float = 10.0,
) -> Client:
    """A client on a running scheduler, given its ``address`` or its ``scheduler_file``.

    Gives up after ``timeout`` seconds with a one-line :class:`ApexRuntimeError`.
    """
    from distributed import Client

    if (address is None) == (scheduler_file is None):
        raise ApexRuntimeError("give exactly one of a scheduler address or a scheduler file")
    if scheduler_file is not None:
        path = Path(scheduler_file).expanduser()
        if not path.is_file():
            raise ApexRuntimeError(
                f"scheduler file {str(path)!r} does not exist; start the scheduler with "
                f"`dask scheduler --scheduler-file {path}` or pass its address"
            )
        try:
            address = str(json.loads(path.read_text())["address"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ApexRuntimeError(
                f"scheduler file {str(path)!r} is not a Dask scheduler file ({_first_line(exc)})"
            ) from None
    assert address is not None
    try:
        return Client(address, timeout=timeout, direct_to_workers=True)
    except (OSError, TimeoutError) as exc:
        raise ApexRuntimeError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s "
            f"({_first_line(exc)}); is `dask scheduler` running there?"
        ) from None
    except ValueError as exc:  # malformed address
        raise ApexRuntimeError(f"bad scheduler address {address!r}: {_first_line(exc)}") from None


def wait_for_workers(client: Client, n: int = 1, timeout_s: float = 30.0) -> list[WorkerInfo]:
    """Wait until the scheduler has at least ``n`` workers; return them (sorted).

    Raises :class:`ApexRuntimeError` after ``timeout_s`` seconds without them.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        info = client.scheduler_info(n_workers=-1)
        workers = workers_from_scheduler_info(info)
        if len(workers) >= n:
            return workers
        if time.monotonic() >= deadline:
            raise ApexRuntimeError(
                f"the Dask scheduler at {client.scheduler.address} has {len(workers)} worker(s), "
                f"needs {n}, after waiting {timeout_s:g} s; start workers with "
                f"`dask worker {client.scheduler.address}`"
            )
        time.sleep(0.1)


def start_local_cluster(
    n_workers: int | None = None,
    *,
    dashboard_address: str | None = ":8787",
    preload: bool = True,
    **kwargs: Any,
) -> tuple[LocalCluster, Client]:
    """An embedded ``LocalCluster`` (worker processes, one thread each) and a client on it.

    ``n_workers`` defaults to one per CPU core. With ``preload`` the scheduler
    loads the Ape-X dashboard page and metrics plugin. When ``dashboard_address``
    is taken, Dask picks another port; None turns the dashboard off. The
    caller owns both objects and closes them (client first).
    """
    from distributed import Client, LocalCluster

    n = int(n_workers or os.cpu_count() or 1)
    scheduler_kwargs: dict[str, Any] = dict(kwargs.pop("scheduler_kwargs", {}) or {})
    if preload:
        from apex_dask.runtime.observability.preload import PRELOAD

        scheduler_kwargs.setdefault("preload", [PRELOAD])
    try:
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            dashboard_address=dashboard_address,
            scheduler_kwargs=scheduler_kwargs,
            **kwargs,
        )
    except Exception as exc:
        raise ApexRuntimeError(f"cannot start a local Dask cluster: {_first_line(exc)}") from None
    try:
        client = Client(cluster, direct_to_workers=True)
    except Exception as exc:
        cluster.close()
        raise ApexRuntimeError(f"cannot connect to the local cluster: {_first_line(exc)}") from None
    return cluster, client
