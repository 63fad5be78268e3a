"""Start or reach the Dask cluster an Ape-X run uses, with bounded waits and one-line errors.

::

    cluster, client = start_local_cluster(n_workers=4)        # embedded, owns both (TLS)
    client = connect("tcp://10.0.0.5:8786", timeout=10)       # a running scheduler
    client = connect(scheduler_file="~/scheduler.json")       # HPC: shared file
    workers = wait_for_workers(client, n=1, timeout_s=30)

Every failure raises :class:`~apex_dask.runtime.errors.ApexRuntimeError`
whose message is one line (scheduler unreachable, a listener that is not a
Dask scheduler, scheduler file missing or unreadable, no workers within the
wait). ``connect``'s ``timeout`` bounds the whole connection: before making a
``Client`` it opens the TCP connection and asks the peer for its identity
over Dask's own comm, in a thread with a hard deadline (a ``Client`` pointed
at, say, the dashboard port can hang far past its ``timeout=``, or read HTTP
bytes as a frame length and raise ``MemoryError``). Clients made here talk to
workers directly (``direct_to_workers=True``): actor calls skip the scheduler
hop. :func:`shield_workers_from_ctrl_c` makes the worker processes of local
clusters started afterwards ignore the terminal's Ctrl-C, so the driver alone
decides how a run ends.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import sys
import tempfile
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from apex_dask.runtime.credentials import (
    OPEN_LOCAL,
    TLS_DIR_NAME,
    RunCredentials,
    find_credentials,
    make_run_credentials,
)
from apex_dask.runtime.errors import ApexRuntimeError, describe
from apex_dask.runtime.orchestration.placement import WorkerInfo, workers_from_scheduler_info

if TYPE_CHECKING:
    from distributed import Client, LocalCluster

__all__ = [
    "close_local_cluster",
    "connect",
    "shield_workers_from_ctrl_c",
    "start_local_cluster",
    "wait_for_workers",
]

LOOPBACK = "127.0.0.1"
"""Where an embedded cluster listens unless asked otherwise."""


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
        from apex_dask.config.reader import read_document

        try:
            address = str(read_document(path, "scheduler file", json_text=True)["address"])
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise ApexRuntimeError(
                f"scheduler file {str(path)!r} is not a Dask scheduler file ({describe(exc)})"
            ) from None
    assert address is not None
    security = _tls_security(address, scheduler_file)
    deadline = time.monotonic() + timeout
    _probe_scheduler(address, timeout, security)
    left = max(1.0, deadline - time.monotonic())
    try:
        return Client(address, timeout=left, direct_to_workers=True, security=security)
    except (OSError, TimeoutError) as exc:
        raise ApexRuntimeError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s "
            f"({describe(exc)}); is `dask scheduler` running there?"
        ) from None
    except ValueError as exc:  # malformed address
        raise ApexRuntimeError(f"bad scheduler address {address!r}: {describe(exc)}") from None


def _tls_security(address: str, scheduler_file: str | os.PathLike | None) -> Any:
    """The ``Security`` for a ``tls://`` scheduler: None (Dask's own configuration) for
    ``tcp://`` or when this process is configured with a client certificate, else the
    run's credentials beside ``scheduler_file``; a one-line error when there are none."""
    import dask

    if not address.startswith("tls://") or dask.config.get("distributed.comm.tls.client.cert"):
        return None
    needs = f"the Dask scheduler at {address} requires TLS and this client has no certificate"
    own = "or set DASK_DISTRIBUTED__COMM__TLS__CA_FILE, ..._CLIENT__CERT and ..._CLIENT__KEY"
    if scheduler_file is None:
        raise ApexRuntimeError(
            f"{needs}: connect with --scheduler-file RUN/scheduler.json (the run's credentials "
            f"are in RUN/{TLS_DIR_NAME}/ beside it), {own}"
        )
    folder = Path(scheduler_file).expanduser().resolve().parent / TLS_DIR_NAME
    creds = find_credentials(scheduler_file)
    if creds is None:
        raise ApexRuntimeError(
            f"{needs}: no credentials in {folder} beside the scheduler file (ca.pem, cert.pem, "
            f"key.pem, written by the run's launcher), {own}"
        )
    unreadable = [p.name for p in (creds.ca_file, creds.cert_file, creds.key_file)
                  if not os.access(p, os.R_OK)]  # fmt: skip
    if unreadable:
        raise ApexRuntimeError(
            f"{needs}: its credentials in {folder} ({', '.join(unreadable)}) are not readable "
            "by this user (mode 0600: only the run's owner may connect)"
        )
    return creds.security()


async def _identity(address: str, timeout: float, security: Any = None) -> tuple[str, Any]:
    """``("unreachable", exc)``, ``("silent", exc)`` or ``("answered", identity)``."""
    from distributed.comm import connect as comm_connect
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.security import Security

    deadline = time.monotonic() + timeout
    scheme, loc = parse_address(address)
    if scheme in ("tcp", "tls"):  # first: does anything listen there at all?
        host, port = parse_host_port(loc)
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout)
        except (OSError, asyncio.TimeoutError) as exc:
            return "unreachable", exc
        writer.close()
    try:
        args = (security or Security()).get_connection_args("client")
        left = max(0.1, deadline - time.monotonic())
        comm = await asyncio.wait_for(comm_connect(address, timeout=left, **args), left)
        try:
            left = max(0.1, deadline - time.monotonic())
            await asyncio.wait_for(comm.write({"op": "identity", "reply": True}), left)
            reply = await asyncio.wait_for(comm.read(), max(0.1, deadline - time.monotonic()))
        finally:
            comm.abort()
    except BaseException as exc:  # noqa: BLE001 - MemoryError: bytes read as a frame length
        return "silent", exc
    return "answered", reply


def _probe_scheduler(address: str, timeout: float, security: Any = None) -> None:
    """Raise a one-line :class:`ApexRuntimeError` unless a Dask scheduler answers at
    ``address`` within ``timeout`` seconds (the probe runs in its own thread and loop)."""
    from distributed.comm.addressing import parse_address, parse_host_port

    try:
        scheme, loc = parse_address(address)
        if scheme in ("tcp", "tls"):
            parse_host_port(loc)
    except (ValueError, TypeError) as exc:
        raise ApexRuntimeError(f"bad scheduler address {address!r}: {describe(exc)}") from None
    box: dict[str, Any] = {}

    def probe() -> None:
        try:
            box["out"] = asyncio.run(_identity(address, timeout, security))
        except BaseException as exc:  # noqa: BLE001
            box["out"] = ("silent", exc)

    thread = threading.Thread(target=probe, name="apex-scheduler-probe", daemon=True)
    thread.start()
    thread.join(timeout + 2.0)
    kind, got = box.get("out", ("silent", TimeoutError("no answer")))
    if kind == "unreachable":
        raise ApexRuntimeError(
            f"cannot reach the Dask scheduler at {address} within {timeout:g} s "
            f"({describe(got)}); is `dask scheduler` running there?"
        )
    if kind == "silent":
        if isinstance(got, TimeoutError | asyncio.TimeoutError):
            why = f"no answer within {timeout:g} s"
        elif isinstance(got, MemoryError):  # its bytes were read as a frame length
            why = "it sent bytes that are not Dask's protocol"
        else:
            why = describe(got)
        if address.startswith("tls://") and "TLS" in why.upper().replace("SSL", "TLS"):
            raise ApexRuntimeError(
                f"the TLS handshake with the Dask scheduler at {address} failed ({why}): this "
                f"client's certificate is not the run's; use its credentials (RUN/{TLS_DIR_NAME}/ "
                "beside RUN/scheduler.json: --scheduler-file)"
            )
        raise ApexRuntimeError(
            f"{address} is not a Dask scheduler: it accepted the connection but did not answer "
            f"Dask's handshake ({why}); check the port (a scheduler usually listens on :8786, "
            "its dashboard on :8787) and the protocol (a run that requires TLS listens on tls://)"
        )
    kind_of_peer = got.get("type") if isinstance(got, dict) else None
    if kind_of_peer != "Scheduler":
        raise ApexRuntimeError(
            f"{address} is not a Dask scheduler (it says it is a {kind_of_peer or 'something else'}); "
            "pass the scheduler's address, e.g. tcp://host:8786"
        )


FORKSERVER_PRELOAD = ("distributed", "distributed.nanny", "apex_dask.runtime.actors")
"""Modules the forkserver of local clusters imports once for every process it forks."""


def shield_workers_from_ctrl_c() -> None:
    """Worker processes of local clusters started from now on ignore SIGINT.

    Ctrl-C in a terminal reaches the whole process group; the workers must
    survive it so the driver can stop the run, fetch the weights and close
    the cluster itself. Dask then starts worker processes through a
    multiprocessing *forkserver*: every process forked from it (nanny
    restarts included) ignores SIGINT: it is born with SIGINT blocked and
    first imports :mod:`apex_dask.runtime.sigint`. This process keeps its
    own handler throughout, so a Ctrl-C during start-up is never lost. A
    no-op outside the main thread.
    """
    import multiprocessing.forkserver as forkserver
    import multiprocessing.resource_tracker as resource_tracker
    import signal

    import dask
    import distributed  # noqa: F401 - registers the distributed.* config defaults read here

    if threading.current_thread() is not threading.main_thread():
        return
    # what the nanny would set before a spawn must be in place before the forkserver
    # starts: its children are forked with its environment (hash seed, BLAS threads)
    env = {
        k: str(v) for k, v in (dask.config.get("distributed.nanny.pre-spawn-environ") or {}).items()
    }
    if os.environ.get("PYTHONHASHSEED") in (None, "0"):
        env["PYTHONHASHSEED"] = "6640"  # the nanny's choice, so every worker hashes alike
    for key, value in env.items():
        os.environ.setdefault(key, value)
    # The forkserver is born with SIGINT blocked (a Ctrl-C during its start stays pending
    # there, and is dropped once it ignores SIGINT), then imports apex_dask.runtime.sigint
    # first, which ignores it; its children get both. Here SIGINT is only blocked, never
    # ignored: one that comes meanwhile is delivered when it is unblocked, not lost.
    # The caller's __main__ is never re-imported. The forkserver then imports what every
    # nanny and worker process would (Dask, torch, the actors: about 3.5 CPU-s each), once:
    # each process forked from it starts with them (nothing there starts a thread or CUDA).
    forkserver.set_forkserver_preload(["apex_dask.runtime.sigint", *FORKSERVER_PRELOAD])
    # the resource tracker first: starting it unblocks SIGINT in the calling thread
    resource_tracker.ensure_running()
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        forkserver.ensure_running()
    finally:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
    dask.config.set({"distributed.worker.multiprocessing-method": "forkserver"})


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
    host: str = LOOPBACK,
    dashboard_address: str | None = ":8787",
    preload: bool = True,
    tls: bool = True,
    tls_dir: str | os.PathLike | None = None,
    warn: Callable[[str], None] | None = None,
    **kwargs: Any,
) -> tuple[LocalCluster, Client]:
    """An embedded ``LocalCluster`` (worker processes, one thread each) and a client on it.

    ``n_workers`` defaults to one per CPU core. With ``preload`` the scheduler
    loads the Ape-X dashboard page and metrics plugin. The scheduler, the
    workers and the dashboard listen on ``host`` only (default 127.0.0.1: no
    other machine reaches them); a ``dashboard_address`` without a host
    (``":8787"``) binds to ``host`` too. (Dask 2026.8 itself binds the
    scheduler and workers to 127.0.0.1 but a ``":8787"`` dashboard to every
    interface.) When the dashboard's port is taken, Dask picks another; None
    turns the dashboard off.

    Loopback keeps out other machines, not other users of this one: with
    ``tls`` (the default) every connection requires TLS with a CA and
    certificate made for this cluster (:mod:`apex_dask.runtime.credentials`)
    in ``tls_dir``, default a new private temporary folder that goes when the
    cluster is closed (or collected); ``cluster.apex_credentials`` are those
    files, ``cluster.security`` the matching ``Security``. ``tls=False``: plain
    TCP, and one warning line (to ``warn``, default stderr). The caller owns
    both objects and closes them (client first).
    """
    from distributed import Client, LocalCluster

    n = int(n_workers or os.cpu_count() or 1)
    if dashboard_address is not None and dashboard_address.startswith(":"):
        dashboard_address = f"{host}{dashboard_address}"
    scheduler_kwargs: dict[str, Any] = dict(kwargs.pop("scheduler_kwargs", {}) or {})
    if preload:
        from apex_dask.runtime.observability.preload import PRELOAD

        scheduler_kwargs.setdefault("preload", [PRELOAD])
    creds, temporary = None, None
    if tls:
        creds, temporary = _cluster_credentials(tls_dir)
        kwargs.update(protocol="tls://", security=creds.security())
    try:
        cluster = LocalCluster(
            n_workers=n,
            threads_per_worker=1,
            processes=True,
            host=host,
            dashboard_address=dashboard_address,
            scheduler_kwargs=scheduler_kwargs,
            **kwargs,
        )
    except Exception as exc:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise ApexRuntimeError(f"cannot start a local Dask cluster: {describe(exc)}") from None
    cluster.apex_credentials = creds
    if temporary is not None:  # the files must outlive every connection the cluster makes
        weakref.finalize(cluster, shutil.rmtree, temporary, ignore_errors=True)
    if creds is None:
        line = f"TLS off: the Dask cluster at {cluster.scheduler_address} {OPEN_LOCAL}"
        if warn is None:
            print(f"WARNING: {line}", file=sys.stderr, flush=True)
        else:
            warn(line)
    try:
        client = Client(cluster, direct_to_workers=True)
    except Exception as exc:
        cluster.close(timeout=30)
        raise ApexRuntimeError(f"cannot connect to the local cluster: {describe(exc)}") from None
    return cluster, client


def _cluster_credentials(tls_dir: str | os.PathLike | None) -> tuple[RunCredentials, str | None]:
    """``(credentials, folder to remove afterwards or None)`` for an embedded cluster."""
    temporary = None
    if tls_dir is None:
        temporary = tls_dir = tempfile.mkdtemp(prefix="apex-tls-")  # mode 0700
    try:
        return make_run_credentials(tls_dir), temporary
    except (OSError, ValueError) as exc:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
        raise ApexRuntimeError(
            f"cannot make TLS credentials in {tls_dir}: {describe(exc)}"
        ) from None


def close_local_cluster(client: Any, cluster: Any, timeout_s: float = 40.0) -> None:
    """Close ``client``, then ``cluster`` (one :func:`start_local_cluster` made), within
    about ``timeout_s``; an error closing the client does not keep the cluster open,
    and a cluster still closing then is left to finish (its worker processes end with
    this one)."""
    end = time.monotonic() + timeout_s
    try:
        client.close(timeout=max(0.5, min(10.0, 0.3 * timeout_s)))
    except Exception:
        pass
    try:
        cluster.close(timeout=max(0.5, end - time.monotonic()))
    except TimeoutError:
        pass
