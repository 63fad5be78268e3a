"""A second, unprivileged local user, made for a test, who tries to get into a run's cluster.

::

    with second_user() as other:                  # useradd now, userdel afterwards
        got = other.outsider(address, creds_dir)  # outsider.py as that user: {attempt: line}
        assert_kept_out(got)

The user runs this test's own interpreter and environment. Where a folder on the way
to them is closed to other users (e.g. a Python under ``/root``), the user runs in a
private mount namespace in which only what it needs there is visible: nothing on the
machine changes for anyone else, and the user still cannot read the run's folder
(pytest's temporary folders are mode 0700) or its credentials.
"""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import shlex
import shutil
import stat
import subprocess
import sys
import sysconfig
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTSIDER = Path(__file__).with_name("outsider.py")
TOOLS = ("useradd", "userdel", "unshare", "setpriv", "mount")


def unavailable() -> str | None:
    """Why a second user cannot be made here (None: it can)."""
    if sys.platform != "linux":
        return "a second local user is made with Linux tools"
    if os.geteuid() != 0:
        return "making a second local user needs root"
    missing = [t for t in TOOLS if shutil.which(t) is None]
    return f"needs {', '.join(missing)} (passwd / util-linux)" if missing else None


def _searchable(path: Path, uid: int, gid: int) -> bool:
    st = path.stat()
    if st.st_uid == uid:
        return bool(st.st_mode & stat.S_IXUSR)
    if st.st_gid == gid:
        return bool(st.st_mode & stat.S_IXGRP)
    return bool(st.st_mode & stat.S_IXOTH)


def closed_folders(paths: list[Path], uid: int, gid: int) -> dict[Path, set[str]]:
    """Folders on the way to ``paths`` that the user cannot enter, each with the names
    inside it that lead on to ``paths``."""
    closed: dict[Path, set[str]] = {}
    for path in paths:
        parts = path.resolve().parts
        for i in range(1, len(parts)):
            folder = Path(*parts[:i])
            if not _searchable(folder, uid, gid):
                closed.setdefault(folder, set()).add(parts[i])
    return closed


class SecondUser:
    """A user with its own group and no home, and a folder of its own for its files."""

    def __init__(self, name: str) -> None:
        self.name = name
        entry = pwd.getpwnam(name)
        self.uid, self.gid = entry.pw_uid, entry.pw_gid
        self.home = Path(tempfile.mkdtemp(prefix=f"{name}-"))
        os.chown(self.home, self.uid, self.gid)
        self._stash = Path(tempfile.mkdtemp(prefix="apex-stash-"))  # root only (0700)

    def needed(self) -> list[Path]:
        """What the user reads to run this environment's Python with apex_dask."""
        # the package itself: ROOT's own folder may be closed (a checkout under mktemp -d)
        paths = {Path(sys.executable), Path(sys.base_prefix), Path(sys.prefix), ROOT, OUTSIDER}
        paths.add(ROOT / "apex_dask")
        paths |= {Path(sysconfig.get_paths()[k]) for k in ("stdlib", "platstdlib", "purelib")}
        return sorted(paths)

    def command(self, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        """``argv`` run as this user (in a mount namespace of its own if folders on the way
        to the interpreter are closed to it)."""
        environ = {"HOME": str(self.home), "PATH": "/usr/local/bin:/usr/bin:/bin"}
        environ |= env or {}
        run = ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--clear-groups",
               "env", "-i", *(f"{k}={v}" for k, v in environ.items()), *argv]  # fmt: skip
        closed = closed_folders(self.needed(), self.uid, self.gid)
        if not closed:
            return run
        lines = ["set -e", f"mount -t tmpfs -o mode=0700 apexstash {shlex.quote(str(self._stash))}"]
        for i, (folder, names) in enumerate(sorted(closed.items())):
            keep = self._stash / str(i)
            lines += [f"mkdir {shlex.quote(str(keep))}",
                      f"mount --bind {shlex.quote(str(folder))} {shlex.quote(str(keep))}",
                      f"mount -t tmpfs -o mode=0755 apexopen {shlex.quote(str(folder))}"]  # fmt: skip
            for name in sorted(names):
                src, dst = keep / name, folder / name
                make = "mkdir" if (folder / name).is_dir() else "touch"
                lines += [f"{make} {shlex.quote(str(dst))}",
                          f"mount --bind {shlex.quote(str(src))} {shlex.quote(str(dst))}"]  # fmt: skip
        lines.append('exec "$@"')
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", "\n".join(lines),
                "sh", *run]  # fmt: skip

    def run(self, argv: list[str], timeout: float = 120, **kw) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.command(argv), capture_output=True, text=True, timeout=timeout, **kw
        )

    def outsider(
        self, address: str, creds: Path | None = None, where: list[str] | None = None
    ) -> dict[str, dict]:
        """``outsider.py`` against ``address`` as this user: its lines by attempt.
        ``where`` prefixes the command (e.g. ``ip netns exec NS``)."""
        argv = [sys.executable, str(OUTSIDER), address, str(self.home)]
        argv += [str(creds)] if creds is not None else []
        proc = subprocess.run([*(where or []), *self.command(argv)], capture_output=True,
                              text=True, timeout=180)  # fmt: skip
        lines = [json.loads(x) for x in proc.stdout.splitlines() if x.startswith("{")]
        got = {line["attempt"]: line for line in lines}
        assert "plain_tcp" in got, (proc.returncode, proc.stdout[-2000:], proc.stderr[-3000:])
        return got

    def remove(self) -> None:
        shutil.rmtree(self.home, ignore_errors=True)
        shutil.rmtree(self._stash, ignore_errors=True)
        subprocess.run(["userdel", self.name], capture_output=True, timeout=30)


@contextlib.contextmanager
def second_user() -> Iterator[SecondUser]:
    """A new local user (``useradd``), removed afterwards."""
    name = "apx" + uuid.uuid4().hex[:10]
    add = ["useradd", "--no-create-home", "--user-group", "--shell", "/usr/sbin/nologin", name]
    deadline = time.monotonic() + 60
    while (made := subprocess.run(add, capture_output=True, text=True, timeout=30)).returncode:
        # another test may hold /etc/passwd's lock for a moment
        assert time.monotonic() < deadline, f"useradd failed: {made.stderr.strip()}"
        time.sleep(0.5)
    user = None
    try:
        user = SecondUser(name)
        yield user
    finally:
        if user is not None:
            user.remove()
        else:
            subprocess.run(["userdel", name], capture_output=True, timeout=30)


def assert_kept_out(got: dict[str, dict], scheduler_log: str | None = None) -> None:
    """Every way in failed at TLS, for the reasons TLS gives, and nothing ran. The client
    side sees the scheduler end the session (an alert, or just EOF, depending on timing);
    ``scheduler_log`` (what the scheduler logged meanwhile) says why it ended it."""
    for attempt in ("plain_tcp", "own_ca", "own_cert_no_verify", "no_cert_no_verify"):
        assert got[attempt]["outcome"] == "REFUSED", (attempt, got)
        assert got[attempt]["uid"] is None, got
    plain = got["plain_tcp"]["reason"]
    assert "Connection reset" in plain or "closed" in plain, plain  # it speaks TLS only
    assert "CERTIFICATE_VERIFY_FAILED" in got["own_ca"]["reason"], got["own_ca"]
    for attempt in ("own_cert_no_verify", "no_cert_no_verify"):  # the scheduler hung up
        assert "SSL" in got[attempt]["reason"], got[attempt]
    if scheduler_log is not None:
        assert "WRONG_VERSION_NUMBER" in scheduler_log, scheduler_log[-3000:]  # plain TCP
        # a certificate of another CA, and none at all
        assert "certificate verify failed" in scheduler_log, scheduler_log[-3000:]
        assert "PEER_DID_NOT_RETURN_A_CERTIFICATE" in scheduler_log, scheduler_log[-3000:]
    if "read_key" in got:  # the run's credentials are not readable by the user
        assert got["read_key"]["outcome"] == "REFUSED", got
        assert "Permission denied" in got["read_key"]["reason"], got["read_key"]
        assert got["run_credentials"]["outcome"] == "REFUSED", got
