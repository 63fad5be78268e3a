"""Whether this machine can build hosts as Linux network namespaces (tests skip with the reason)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import uuid


def namespaces_unavailable(tools: tuple[str, ...] = ("ip",), what: str = "") -> str | None:
    """Why a network namespace cannot be made here (None: it can): Linux, root, ``tools``
    on PATH, and a probe namespace made and deleted. ``what`` names the site in the reason."""
    site = f"{what} " if what else ""
    if sys.platform != "linux":
        return f"{site}network namespaces are Linux only"
    if os.geteuid() != 0:
        return f"{site}network namespaces need root"
    missing = [t for t in tools if shutil.which(t) is None]
    if missing:
        return f"needs {', '.join(missing)} (iproute2 / util-linux)"
    probe = "apexprobe" + uuid.uuid4().hex[:6]
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"cannot create a network namespace here: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None
