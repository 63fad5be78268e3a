"""Per-run TLS credentials: a CA that exists for one run and one certificate it signed.

Anyone who can open a TCP connection to a Dask scheduler can run any code on
its workers (``Client(address).run(...)``), as the user who owns the job. A
run secured here requires TLS on every connection (``tls://``,
``require-encryption``) and trusts only its own CA, whose private key is
thrown away once the run's one certificate is signed: only a process that
can read the run folder's ``tls/`` (mode 0700, files 0600) gets in. Dask
does not check host names, so one certificate serves the scheduler, every
worker and every client, on any node::

    creds = make_run_credentials("apex-123/tls")        # ca.pem, cert.pem, key.pem
    client = Client(address, security=creds.security())
    os.environ.update(creds.environ())                  # the same, as Dask configuration
    creds = find_credentials("apex-123/scheduler.json")  # the run's, beside its scheduler file

The shell launchers run ``python -m apex_dask.runtime.credentials DIR``; the
embedded clusters (``start_local_cluster``: the CLI's, the notebooks') make
them in a private temporary folder. Loopback is no exception: other users of
the machine can open TCP connections to 127.0.0.1 too.
Keys are ECDSA P-256 (made in milliseconds; TLS 1.2+), made with the
``cryptography`` package, not an ``openssl`` binary that a node may lack.
"""

from __future__ import annotations

import argparse
import datetime
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = [
    "OPEN_CLUSTER",
    "OPEN_LOCAL",
    "TLS_DIR_NAME",
    "RunCredentials",
    "find_credentials",
    "make_run_credentials",
    "main",
]

TLS_DIR_NAME = "tls"
"""Folder of a run's credentials, beside its ``scheduler.json``."""

OPEN_CLUSTER = (
    "the cluster is open to anyone who can reach its nodes, and they can run any code as you"
)
"""What a launcher says when TLS is turned off."""

OPEN_LOCAL = "accepts any user of this machine, who can run any code as you (plain TCP)"
"""What a local cluster's launcher says when TLS is turned off."""

_ROLES = ("scheduler", "worker", "client")


@dataclass(frozen=True)
class RunCredentials:
    """The three PEM files of a run: its CA, its certificate and that certificate's key."""

    ca_file: Path
    cert_file: Path
    key_file: Path

    @classmethod
    def in_folder(cls, folder: str | os.PathLike) -> RunCredentials:
        """The files ``ca.pem``, ``cert.pem``, ``key.pem`` of ``folder`` (which may not exist)."""
        base = Path(folder).expanduser().absolute()
        return cls(base / "ca.pem", base / "cert.pem", base / "key.pem")

    @property
    def folder(self) -> Path:
        return self.cert_file.parent

    def exist(self) -> bool:
        return all(p.is_file() for p in (self.ca_file, self.cert_file, self.key_file))

    def security(self) -> Any:
        """A ``distributed.Security`` that requires TLS with these files, for every role."""
        from distributed.security import Security

        files = {
            f"tls_{role}_{kind}": str(path)
            for role in _ROLES
            for kind, path in (("cert", self.cert_file), ("key", self.key_file))
        }
        return Security(require_encryption=True, tls_ca_file=str(self.ca_file), **files)

    def environ(self) -> dict[str, str]:
        """The same settings as Dask configuration variables (inherited by child processes)."""
        env = {
            "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
            "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": str(self.ca_file),
        }
        for role in _ROLES:
            env[f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__CERT"] = str(self.cert_file)
            env[f"DASK_DISTRIBUTED__COMM__TLS__{role.upper()}__KEY"] = str(self.key_file)
        return env


def find_credentials(scheduler_file: str | os.PathLike) -> RunCredentials | None:
    """The run's credentials in ``tls/`` beside ``scheduler_file``, or None if there are none."""
    creds = RunCredentials.in_folder(Path(scheduler_file).expanduser().parent / TLS_DIR_NAME)
    return creds if creds.exist() else None


def _write_private(path: Path, data: bytes) -> None:
    """Write ``path`` with mode 0600 from its first byte, replacing it whole."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)  # O_CREAT's mode passes through the umask; a stale tmp keeps its own
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, path)


def make_run_credentials(
    folder: str | os.PathLike, *, days: float = 30.0, common_name: str = "apex-dask"
) -> RunCredentials:
    """Make a CA and one certificate + key signed by it in ``folder`` (0700; files 0600).

    Existing files there are replaced (a requeued job starts every process
    again). The CA's private key is never written: nothing else can be signed
    with it. The certificate is valid from five minutes ago (clocks of nodes
    differ) for ``days`` days, for TLS servers and clients alike.
    """
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    if not days > 0:
        raise ValueError(f"days={days!r} must be > 0")
    creds = RunCredentials.in_folder(folder)
    creds.folder.mkdir(parents=True, exist_ok=True)
    os.chmod(creds.folder, 0o700)
    now = datetime.datetime.now(datetime.timezone.utc)
    start, end = now - datetime.timedelta(minutes=5), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{common_name} run CA")])
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])

    def usage(ca: bool) -> x509.KeyUsage:
        return x509.KeyUsage(
            digital_signature=not ca, content_commitment=False, key_encipherment=False,
            data_encipherment=False, key_agreement=False, key_cert_sign=ca, crl_sign=ca,
            encipher_only=False, decipher_only=False,
        )  # fmt: skip

    ca_ski = x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key())
    ca_cert = (
        x509.CertificateBuilder().subject_name(ca_name).issuer_name(ca_name)
        .public_key(ca_key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(usage(ca=True), critical=True)
        .add_extension(ca_ski, critical=False)
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    cert = (
        x509.CertificateBuilder().subject_name(name).issuer_name(ca_name)
        .public_key(key.public_key()).serial_number(x509.random_serial_number())
        .not_valid_before(start).not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(usage(ca=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )  # fmt: skip
    pem = serialization.Encoding.PEM
    _write_private(
        creds.key_file,
        key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()),
    )
    _write_private(creds.cert_file, cert.public_bytes(pem))
    _write_private(creds.ca_file, ca_cert.public_bytes(pem))
    return creds


def main(argv: list[str] | None = None) -> int:
    """``python -m apex_dask.runtime.credentials DIR [--days N]``: make a run's credentials."""
    parser = argparse.ArgumentParser(
        prog="python -m apex_dask.runtime.credentials",
        description="Make a per-run CA and one certificate/key for every Dask process of a "
        "run, in DIR (mode 0700, files 0600): DIR/ca.pem, DIR/cert.pem, DIR/key.pem.",
    )
    parser.add_argument("folder", metavar="DIR", help="folder for the files (made if missing)")
    parser.add_argument("--days", type=float, default=30.0, help="validity (default 30)")
    args = parser.parse_args(argv)
    try:
        make_run_credentials(args.folder, days=args.days)
    except (OSError, ValueError) as exc:
        print(f"{parser.prog}: error: cannot make TLS credentials in {args.folder}: {exc}",
              file=sys.stderr)  # fmt: skip
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
