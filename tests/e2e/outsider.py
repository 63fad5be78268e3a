"""What a client that is not the run's owner gets from a Dask scheduler: run as a script.

    python outsider.py ADDRESS WORKDIR [CREDENTIALS_DIR]

Prints one JSON line per attempt, ``{"attempt", "outcome": "CONNECTED" | "REFUSED",
"uid": <what client.run(os.getuid) answered, when connected>, "reason"}``:

- ``plain_tcp``: ``Client("tcp://host:port")``, as anyone would try first;
- ``own_ca``: a Dask client with a CA and certificate of its own (made in WORKDIR);
- ``own_cert_no_verify``: TLS at the comm level presenting its own certificate and
  not checking the scheduler's (an attacker does not care who answers);
- ``no_cert_no_verify``: the same without any certificate;
- ``run_credentials`` (only with CREDENTIALS_DIR): a Dask client with the files there.

With CREDENTIALS_DIR it also says whether the run's key could be read (``read_key``).
"""

from __future__ import annotations

import asyncio
import json
import os
import ssl
import sys
from pathlib import Path


def say(attempt: str, outcome: str, reason: str = "", uid: object = None) -> None:
    line = {"attempt": attempt, "outcome": outcome, "uid": uid, "reason": reason[:400]}
    print(json.dumps(line), flush=True)


def describe(exc: BaseException) -> str:
    parts = [f"{type(exc).__name__}: {exc}"]
    while exc.__cause__ is not None or exc.__context__ is not None:
        exc = exc.__cause__ or exc.__context__
        parts.append(f"{type(exc).__name__}: {exc}")
    return " <- ".join(parts)


def client_attempt(attempt: str, address: str, security: object = None) -> None:
    from distributed import Client

    try:
        with Client(address, timeout=10, security=security) as client:
            ran = client.run(os.getuid)
            say(attempt, "CONNECTED", uid=sorted(set(ran.values())))
    except BaseException as exc:  # noqa: BLE001 - every way of being refused is reported
        say(attempt, "REFUSED", describe(exc))


async def comm_attempt(attempt: str, address: str, cert: Path | None, key: Path | None) -> None:
    from distributed.comm import connect

    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE
    if cert is not None:
        ctx.load_cert_chain(str(cert), str(key))
    try:
        comm = await connect(address, timeout=10, ssl_context=ctx, require_encryption=True)
        try:
            await comm.write({"op": "identity", "reply": True})
            reply = await asyncio.wait_for(comm.read(), 10)
        finally:
            comm.abort()
        say(attempt, "CONNECTED", f"answered {str(reply)[:80]}")
    except BaseException as exc:  # noqa: BLE001
        say(attempt, "REFUSED", describe(exc))


def main() -> None:
    address, workdir = sys.argv[1], Path(sys.argv[2])
    run_tls = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    host_port = address.split("://", 1)[-1]
    client_attempt("plain_tcp", f"tcp://{host_port}")
    from apex_dask.runtime.credentials import make_run_credentials

    own = make_run_credentials(workdir / "own-tls")
    client_attempt("own_ca", f"tls://{host_port}", own.security())
    tls = f"tls://{host_port}"
    asyncio.run(comm_attempt("own_cert_no_verify", tls, own.cert_file, own.key_file))
    asyncio.run(comm_attempt("no_cert_no_verify", tls, None, None))
    if run_tls is not None:
        try:
            (run_tls / "key.pem").read_bytes()
            say("read_key", "CONNECTED", "read the run's key")
        except OSError as exc:
            say("read_key", "REFUSED", describe(exc))
        from apex_dask.runtime.credentials import RunCredentials

        client_attempt("run_credentials", tls, RunCredentials.in_folder(run_tls).security())


if __name__ == "__main__":
    main()
