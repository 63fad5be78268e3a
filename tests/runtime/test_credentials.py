"""Per-run TLS credentials (apex_dask.runtime.credentials) and connecting to a secured run.

Quick: the files (mode 0600, folder 0700, the certificate signed by the run's
CA, no CA key kept), the ``python -m`` entry, and the one-line errors of a
client without credentials. Slow: a real ``dask scheduler`` that requires TLS
with a run's credentials: ``connect(scheduler_file=...)`` gets in with the
files beside the scheduler file and nothing else configured; a client without
them, one with another run's, and a plain-TCP one are refused. And the
embedded LocalCluster listens on 127.0.0.1 only (dashboard included).
"""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from polling import poll

from apex_dask.runtime.credentials import (
    RunCredentials,
    find_credentials,
    make_run_credentials,
)
from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.cluster import connect

BIN = Path(sys.executable).parent


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_credentials_are_private_and_the_certificate_is_signed_by_the_run_ca(tmp_path):
    from cryptography import x509
    from cryptography.x509.oid import ExtendedKeyUsageOID

    creds = make_run_credentials(tmp_path / "run" / "tls")
    assert sorted(p.name for p in creds.folder.iterdir()) == ["ca.pem", "cert.pem", "key.pem"]
    assert mode(creds.folder) == 0o700
    assert all(mode(p) == 0o600 for p in (creds.ca_file, creds.cert_file, creds.key_file))
    ca = x509.load_pem_x509_certificate(creds.ca_file.read_bytes())
    cert = x509.load_pem_x509_certificate(creds.cert_file.read_bytes())
    cert.verify_directly_issued_by(ca)  # raises if not
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH} <= set(usage)
    assert ca.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    # A second call (a requeued job) makes a new CA: the old certificate no longer fits.
    again = make_run_credentials(creds.folder)
    ca2 = x509.load_pem_x509_certificate(again.ca_file.read_bytes())
    assert ca2.fingerprint(ca2.signature_hash_algorithm) != ca.fingerprint(
        ca.signature_hash_algorithm
    )
    assert all(mode(p) == 0o600 for p in (again.ca_file, again.cert_file, again.key_file))


def test_credentials_are_found_beside_the_scheduler_file(tmp_path):
    assert find_credentials(tmp_path / "scheduler.json") is None
    made = make_run_credentials(tmp_path / "tls")
    assert find_credentials(tmp_path / "scheduler.json") == made
    env = made.environ()
    assert env["DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION"] == "True"
    assert env["DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"] == str(made.key_file)
    assert made.security().require_encryption


def test_the_module_entry_makes_the_files_or_fails_in_one_line(tmp_path):
    run = [sys.executable, "-m", "apex_dask.runtime.credentials"]
    ok = subprocess.run([*run, str(tmp_path / "tls")], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert RunCredentials.in_folder(tmp_path / "tls").exist()
    (tmp_path / "file").write_text("")
    bad = subprocess.run([*run, str(tmp_path / "file" / "tls")], capture_output=True, text=True)
    assert bad.returncode == 2
    assert len(bad.stderr.strip().splitlines()) == 1 and "cannot make TLS credentials" in bad.stderr


def test_a_tls_address_without_credentials_is_a_one_line_error_naming_the_fix(tmp_path):
    with pytest.raises(ApexRuntimeError) as err:
        connect("tls://127.0.0.1:9", timeout=2)
    assert "requires TLS" in str(err.value) and "--scheduler-file" in str(err.value)
    sched = tmp_path / "scheduler.json"
    sched.write_text(json.dumps({"address": "tls://127.0.0.1:9"}))
    with pytest.raises(ApexRuntimeError) as err:
        connect(scheduler_file=sched, timeout=2)
    assert "requires TLS" in str(err.value) and str(tmp_path / "tls") in str(err.value)
    assert "\n" not in str(err.value)


@pytest.fixture
def tls_scheduler(tmp_path):
    """A `dask scheduler` requiring TLS with a run's credentials; yields its scheduler file."""
    creds = make_run_credentials(tmp_path / "run" / "tls")
    sched = tmp_path / "run" / "scheduler.json"
    env = dict(os.environ, **creds.environ())
    proc = subprocess.Popen(
        [str(BIN / "dask"), "scheduler", "--host", "127.0.0.1", "--protocol", "tls", "--port",
         "0", "--dashboard-address", "127.0.0.1:0", "--scheduler-file", str(sched)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        poll(lambda: sched.exists() and sched.stat().st_size > 0, 60)
        yield sched
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


PROBE = """
import sys
from distributed import Client
try:
    with Client(sys.argv[1], timeout=8):
        print("CONNECTED")
except BaseException as exc:
    print("REFUSED", type(exc).__name__)
"""


def plain_client_connects(address: str, env: dict[str, str] | None = None) -> bool:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("DASK_DISTRIBUTED__COMM")}
    out = subprocess.run([sys.executable, "-c", PROBE, address], env={**clean, **(env or {})},
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    return "CONNECTED" in out.stdout


@pytest.mark.slow
def test_only_a_client_with_the_run_credentials_gets_in(tls_scheduler, tmp_path):
    address = json.loads(tls_scheduler.read_text())["address"]
    assert address.startswith("tls://127.0.0.1:")
    client = connect(scheduler_file=tls_scheduler, timeout=20)  # finds run/tls by itself
    try:
        assert client.scheduler_info(n_workers=0)["type"] == "Scheduler"
    finally:
        client.close()
    ca = RunCredentials.in_folder(tls_scheduler.parent / "tls").ca_file
    other = make_run_credentials(tmp_path / "other")
    assert not plain_client_connects(address)  # no certificate at all
    no_cert = {"DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(ca)}  # trusts the CA, no cert
    assert not plain_client_connects(address, no_cert)
    assert not plain_client_connects(address, other.environ())  # another run's CA
    assert not plain_client_connects(address.replace("tls://", "tcp://"))
    with pytest.raises(ApexRuntimeError, match="TLS handshake .* failed"):
        import dask

        with dask.config.set(
            {
                "distributed.comm.tls.ca-file": str(other.ca_file),
                "distributed.comm.tls.client.cert": str(other.cert_file),
                "distributed.comm.tls.client.key": str(other.key_file),
            }
        ):
            connect(address, timeout=10)


@pytest.mark.slow
def test_the_embedded_cluster_listens_on_loopback_only():
    import psutil

    from apex_dask.runtime.orchestration.cluster import start_local_cluster

    cluster, client = start_local_cluster(1, dashboard_address=":0", preload=False)
    try:
        pids = [os.getpid(), *(w.process.process.pid for w in cluster.workers.values())]
        listening = [
            c.laddr.ip
            for pid in pids
            for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN
        ]
        assert len(listening) >= 4, listening  # scheduler, dashboard, nanny, worker
        assert set(listening) == {"127.0.0.1"}, listening
        assert client.dashboard_link.startswith("http://127.0.0.1:")
    finally:
        client.close()
        cluster.close()
