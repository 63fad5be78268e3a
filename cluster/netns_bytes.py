"""Bytes per host of a ``cluster/netns.sh`` site, read from its interfaces' counters.

Each host of the site is a network namespace whose interfaces (``eth0``,
``ib0``) are veth pairs; the bridge-side end of each pair counts every byte
the host received (its ``tx_bytes``) and sent (its ``rx_bytes``), headers
included. Run from the machine's root namespace, where those links live::

    site = Site("/tmp/run")                       # the netns.sh workdir (hosts.json)
    before = site.counters()
    ...                                           # the window to measure
    moved = site.since(before)                    # {host: {iface: {"rx": n, "tx": n}}}
    print(format_table(moved))

    # the window between two result dicts of a run writing DIR/results.jsonl:
    moved, first, last = window_between_iterations(site, "DIR/results.jsonl", 2, 5)

    python cluster/netns_bytes.py WORKDIR [--watch S]   # counters now (or every S seconds)
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

__all__ = ["Site", "format_table", "total", "window_between_iterations"]

Counters = dict[str, dict[str, tuple[int, int]]]


class Site:
    """The hosts of one netns.sh site, from ``WORKDIR/hosts.json``."""

    def __init__(self, workdir: str | Path) -> None:
        self.workdir = Path(workdir)
        self.hosts: dict[str, dict[str, Any]] = json.loads(
            (self.workdir / "hosts.json").read_text()
        )

    def address(self, host: str, iface: str = "eth0") -> str:
        return str(self.hosts[host][iface])

    def host_of(self, address: str) -> str | None:
        """The host whose eth0 or ib0 address is ``address`` (a bare IP)."""
        for name, h in self.hosts.items():
            if address in (h["eth0"], h["ib0"]):
                return name
        return None

    def counters(self) -> Counters:
        """``{host: {iface: (received, sent)}}`` now (bridge-side tx is the host's rx)."""
        out: Counters = {}
        for name, h in self.hosts.items():
            out[name] = {}
            for iface, link in h["links"].items():
                stats = Path("/sys/class/net") / link / "statistics"
                out[name][iface] = (
                    int((stats / "tx_bytes").read_text()),
                    int((stats / "rx_bytes").read_text()),
                )
        return out

    def since(self, before: Counters) -> dict[str, dict[str, dict[str, int]]]:
        """Bytes each host received (``rx``) and sent (``tx``) per interface since ``before``."""
        now = self.counters()
        return {
            host: {
                iface: {"rx": rx - before[host][iface][0], "tx": tx - before[host][iface][1]}
                for iface, (rx, tx) in nets.items()
            }
            for host, nets in now.items()
        }


def total(moved: dict[str, dict[str, int]]) -> int:
    """Bytes a host received plus sent, over all its interfaces."""
    return sum(v["rx"] + v["tx"] for v in moved.values())


def format_table(moved: dict[str, dict[str, dict[str, int]]]) -> str:
    """A Markdown table: host, interface, received, sent (MB)."""
    lines = ["| host | interface | received MB | sent MB |", "| --- | --- | ---: | ---: |"]
    for host, nets in moved.items():
        for iface, v in nets.items():
            lines.append(f"| {host} | {iface} | {v['rx'] / 1e6:.3f} | {v['tx'] / 1e6:.3f} |")
    return "\n".join(lines)


def _read_results(path: Path) -> list[dict[str, Any]]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        try:
            out.append(json.loads(line))
        except ValueError:  # a line being written
            break
    return out


def window_between_iterations(
    site: Site,
    results_path: str | Path,
    first: int,
    last: int,
    *,
    timeout_s: float = 600.0,
    alive: Callable[[], bool] = lambda: True,
) -> tuple[dict[str, dict[str, dict[str, int]]], dict[str, Any], dict[str, Any]]:
    """Bytes per host between the result dicts ``first`` and ``last`` of a running job.

    Polls ``results_path`` (one JSON result per line, as ``apex-dask-submit
    --out`` writes) every 20 ms; counters are read as soon as each iteration
    appears. Both iterations are steady-state training when ``first >= 1`` and
    the run stops after ``last`` (start-up, the final halt and any weights
    download fall outside). Returns (bytes, result ``first``, result ``last``).
    Raises ``TimeoutError`` after ``timeout_s`` or when ``alive()`` turns false.
    """
    path = Path(results_path)
    deadline = time.monotonic() + timeout_s
    marks: dict[int, tuple[Counters, dict[str, Any]]] = {}
    for wanted in (first, last):
        while True:
            results = _read_results(path)
            if len(results) >= wanted:
                marks[wanted] = (site.counters(), results[wanted - 1])
                break
            if time.monotonic() > deadline or not alive():
                raise TimeoutError(
                    f"iteration {wanted} did not appear in {path} "
                    f"({len(results)} so far, {'timed out' if alive() else 'the run ended'})"
                )
            time.sleep(0.02)
    (c0, r0), (c1, r1) = marks[first], marks[last]
    moved = {
        host: {
            iface: {"rx": rx - c0[host][iface][0], "tx": tx - c0[host][iface][1]}
            for iface, (rx, tx) in nets.items()
        }
        for host, nets in c1.items()
    }
    return moved, r0, r1


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("workdir", help="the netns.sh workdir (holds hosts.json)")
    p.add_argument("--watch", type=float, metavar="S", help="print bytes moved every S seconds")
    args = p.parse_args()
    site = Site(args.workdir)
    before = site.counters()
    if not args.watch:
        zero = {h: {i: (0, 0) for i in nets} for h, nets in before.items()}
        print(format_table(site.since(zero)))
        return
    while True:
        time.sleep(args.watch)
        print(format_table(site.since(before)), flush=True)
        before = site.counters()


if __name__ == "__main__":
    main()
