"""Failpoints: named faults switched on in one process, to show that a run notices them.

Off unless set; a check costs one test of an empty dict. Tests and
``benchmarks/soak.py`` switch them on in the process that runs the code, a Dask
worker's included::

    set_failpoint("task:learner.priority_sender")           # that task's next turn raises
    client.run(set_failpoint, "drop_priority_update_every", 10, workers=[learner_address])
    clear_failpoints()

``APEX_FAILPOINTS="name=value,name"`` in a process's environment sets them when this
module is imported (worker processes a nanny starts inherit it).

The names (``docs/architecture.md``, "Background work"):

- ``task:<name>``: the supervised task or thread ``<name>`` raises :class:`InjectedFault`
  at its next turn (once);
- ``drop_priority_update_every`` N: the learner's priority sender drops every Nth update
  without counting it (the priority-update law must trip);
- ``drop_rollout_every`` N: a replay shard acknowledges every Nth rollout without
  storing it (the rollout law);
- ``weights_version_back`` N: an env worker reports weights version N after each sync
  (an old version; the versions law);
- ``stall_weight_sync`` 1: an env worker's weights syncs never finish while it goes on
  acting (the versions law: an acting worker takes newer weights);
- ``skip_shard`` k: the learner's prefetcher stops sampling shard k (the sampling law);
- ``stall_learner`` 1: the learner thread stops training while it lives (steps trained);
- ``stall_evaluator`` 1: evaluations never finish (the evaluation cadence);
- ``stall_priority_sender`` 1: the sender stops draining its outbox (the bounds);
- ``relay_fails`` 1: a weights relay fails every request (env workers must pull
  from the learner, no sync failing);
- ``relay_uncounted`` 1: a weights relay answers requests without counting them
  (the relays law);
- ``wrong_items`` 1: a shard hands out each sampled item with its neighbour's data
  (the audit, with ``replay.audit_priorities``).
"""

from __future__ import annotations

import os

__all__ = [
    "ACTIVE",
    "InjectedFault",
    "clear_failpoints",
    "failpoint",
    "set_failpoint",
    "take_failpoint",
]

ACTIVE: dict[str, float] = {}
"""The failpoints set in this process, by name."""


class InjectedFault(RuntimeError):
    """The exception a ``task:<name>`` failpoint raises."""


def set_failpoint(name: str, value: float = 1.0) -> None:
    """Switch failpoint ``name`` on in this process (with ``value``)."""
    ACTIVE[str(name)] = float(value)


def clear_failpoints() -> None:
    """Switch every failpoint of this process off."""
    ACTIVE.clear()


def failpoint(name: str) -> float | None:
    """The value of failpoint ``name`` (None: off)."""
    return ACTIVE.get(name) if ACTIVE else None


def take_failpoint(name: str) -> bool:
    """True once if failpoint ``name`` is on (it is switched off)."""
    return bool(ACTIVE) and ACTIVE.pop(name, None) is not None


def _from_environment(text: str) -> None:
    for item in filter(None, (part.strip() for part in text.split(","))):
        name, _, value = item.partition("=")
        set_failpoint(name.strip(), float(value) if value.strip() else 1.0)


_from_environment(os.environ.get("APEX_FAILPOINTS", ""))
