"""The laws of a run's counters, checked by the driver at every result.

A run that survives a fault must also stay *right*: every flow balances, every
shard is read and written, weights only move forward, evaluation keeps
reporting. :class:`Invariants` checks these laws on each result dict (and the
few driver-side counts that go with it, :class:`Observed`):

=====================  ==============================================================
law                    holds when
=====================  ==============================================================
``rollouts``           per shard actor: rollouts it acknowledged (their call returned)
                       <= rollouts it stored (+ those in flight when it replaced a
                       lost one); together with ``flow/rollouts_lost`` for the calls
                       that failed, sent = stored + lost once nothing is in transit
``priority_updates``   per shard actor: updates the learner dispatched to it = applied
                       + stale + failed + in flight (a dropped update breaks it)
``sampling``           a shard holding enough items is sampled, and its
                       ``priority_updates_applied`` rises, within ``stall_s`` while
                       the learner trains
``versions``           no actor's weights version goes back (the learner's, an env
                       worker's, the evaluator's) except across a rebuilt learner;
                       an env worker that acts while the learner has newer weights
                       takes them within ``stall_s`` (and :data:`SYNC_STEPS` times
                       the steps it may act between syncs)
``training``           steps trained rise within ``stall_s`` while the learner has
                       batches queued
``evaluation``         a greedy evaluation reports within two intervals and twice its
                       own duration (+5 s); a fault starts the wait afresh
``bounds``             inqueue <= ``learner.inqueue_size``, outbox <= 1,024, priority
                       sends in flight <= 4,096, rollout calls per env worker <=
                       ``workers.rollouts_in_flight``
``audit``              with ``replay.audit_priorities``: no update reached an item
                       other than the one it was computed for
``relays``             per weights relay: requests = served + current + failed + in
                       flight; no blob taken twice for one version; its version
                       never goes back while it follows one learner
=====================  ==============================================================

Laws that wait (``sampling``, ``training``, ``evaluation``) give a fault, an
elastic move or the start of a session ``stall_s`` (``max(20 s, 3 x
report.min_iter_time_s)``) before they apply again: one missed interval around a
fault is allowed. The exact laws (``rollouts``, ``priority_updates``) hold
through faults: they compare counters of the same actor.

A law that fails gives one warning line the first time (``apex_dask.health``,
naming the law and its numbers) and counts ``health/invariant_violations/<law>``
(results in which it failed; total ``health/invariant_violations``). With
``report.strict_invariants`` the run ends instead (:class:`InvariantViolated`,
exit 3; the tests turn it on).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from apex_dask.config import ApexConfig
from apex_dask.runtime.errors import InvariantViolated

__all__ = ["INVARIANT_VIOLATIONS", "LAWS", "Invariants", "Observed"]

INVARIANT_VIOLATIONS = "health/invariant_violations"

LAWS: dict[str, str] = {
    "rollouts": "every rollout a shard acknowledged is stored there",
    "priority_updates": "priority updates sent = applied + stale + failed + in flight",
    "sampling": "every shard holding enough items is sampled and updated while the learner trains",
    "versions": "no weights version goes back, and acting env workers take newer weights",
    "training": "steps trained rise while the learner has batches queued",
    "evaluation": "greedy evaluation reports at its interval",
    "bounds": "every queue and outbox stays under its bound",
    "audit": "no priority update lands on another item",
    "relays": "each weights relay's requests = served + current + failed + in flight, "
    "and it takes each version from the learner once",
}

OUTBOX_BOUND = 1024
"""Priority updates waiting in the learner's outbox (the sender drains it every 4 ms)."""
SENDS_BOUND = 4096
"""Priority updates sent to other processes and not answered yet."""
SYNC_STEPS = 10
"""An env worker syncs after ``workers.max_weight_sync_delay`` steps, plus the rollouts
in flight then: past this many times that without a newer version, its syncs are stuck."""

log = logging.getLogger("apex_dask.health")


@dataclass
class Observed:
    """What one report saw besides its result dict: which actor each number came from."""

    now: float
    learner_key: Any
    ledger: list[tuple[Any, int, int, int]]  # the learner's priority_ledger
    shard_keys: list[Any]
    env_keys: dict[int, Any]  # per env worker index
    rollouts: list[tuple[Any, int, int]]  # RolloutLedger.snapshot(), before the shards' stats
    rollouts_in_flight: dict[int, int]  # rollout calls in flight, per env worker index
    evaluated: bool = False  # an evaluation finished (or timed out) this iteration
    eval_duration_s: float = 0.0
    disturbed: tuple[float, ...] = ()  # fault and elastic counters: a change is a fault
    env_versions: dict[int, float | None] = field(default_factory=dict)  # per env worker index
    env_steps: dict[int, float | None] = field(default_factory=dict)  # steps sampled, per index
    probe: bool = False  # no iteration ended: stats gathered for the laws only
    relays: dict[str, tuple[Any, dict[str, float]]] = field(default_factory=dict)  # by host


@dataclass
class _Progress:
    """When a counter of one actor last rose, and since when it has had to."""

    value: float = -math.inf
    rose_at: float = -math.inf
    due_since: float | None = None  # None: not required to rise now

    def see(self, value: float, now: float, due: bool) -> None:
        if value > self.value:
            self.rose_at = now
        self.value = value
        if not due:
            self.due_since = None
        elif self.due_since is None:
            self.due_since = now

    def stalled(self, now: float, since: float, stall_s: float) -> float | None:
        """Seconds without a rise while due (past ``stall_s``), counted from ``since`` at
        the earliest; None if not stalled."""
        if self.due_since is None:
            return None
        start = max(self.rose_at, self.due_since, since)
        return now - start if now - start > stall_s else None


@dataclass
class _Watch:
    versions: dict[Any, float] = field(default_factory=dict)
    shards: dict[tuple[Any, str], _Progress] = field(default_factory=dict)
    trained: _Progress = field(default_factory=_Progress)
    synced: dict[Any, _Progress] = field(default_factory=dict)  # per env worker actor
    steps_at_sync: dict[Any, float] = field(default_factory=dict)  # its steps when it rose


class Invariants:
    """Checks :data:`LAWS` on each result (see the module docstring).

    ``check(result, observed)`` returns the violations of this result (one line
    each), warns once per law, counts, and raises :class:`InvariantViolated` with
    ``strict``. ``metrics()`` gives ``health/invariant_violations`` and one count per
    law. ``new_session(now)`` (a start, or training again after a halt) starts every
    wait afresh.
    """

    def __init__(
        self,
        config: ApexConfig,
        *,
        strict: bool | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> None:
        self.cfg = config
        self.strict = config.report.strict_invariants if strict is None else bool(strict)
        self.stall_s = max(20.0, 3.0 * config.report.min_iter_time_s)
        self.warn = warn if warn is not None else log.warning
        self.counts: dict[str, int] = dict.fromkeys(LAWS, 0)
        self.first: dict[str, str] = {}
        per_shard = config.replay.learning_starts / max(1, config.replay.num_shards)
        self._enough = max(per_shard, config.learner.batch_size)  # items a shard samples from
        self._calm_since = -math.inf  # the newest fault, move or session start
        self._fault_at = -math.inf  # the newest fault, move or new learner
        self._disturbed: tuple[float, ...] | None = None
        self._learner_key: Any = None
        self._last_eval: float | None = None
        self._eval_s = 1.0  # the longest evaluation seen
        self._w = _Watch()

    def new_session(self, now: float) -> None:
        self._calm_since = now
        self._last_eval = None

    def metrics(self) -> dict[str, float]:
        out = {f"{INVARIANT_VIOLATIONS}/{law}": float(n) for law, n in self.counts.items()}
        out[INVARIANT_VIOLATIONS] = float(sum(self.counts.values()))
        return out

    # ---------------------------------------------------------------- the check
    def check(self, result: Mapping[str, float], obs: Observed) -> list[str]:
        self._follow(result, obs)
        found: list[tuple[str, str]] = []
        for law, test in (
            ("rollouts", self._rollouts),
            ("priority_updates", self._priority_updates),
            ("sampling", self._sampling),
            ("versions", self._versions),
            ("training", self._training),
            ("evaluation", self._evaluation),
            ("bounds", self._bounds),
            ("audit", self._audit),
            ("relays", self._relays),
        ):
            found += [(law, line) for line in test(result, obs)]
        for law in {law for law, _ in found}:
            self.counts[law] += 1
        for law, line in found:
            if law not in self.first:
                self.first[law] = line
                self.warn(f"invariant violated: {law} ({LAWS[law]}): {line}")
        if found and self.strict:
            law, line = found[0]
            raise InvariantViolated(
                law,
                f"invariant violated: {law} ({LAWS[law]}): {line}; stopping the run "
                "(report.strict_invariants)",
            )
        return [f"{law}: {line}" for law, line in found]

    def _follow(self, r: Mapping[str, float], obs: Observed) -> None:
        """A fault, a move or a new learner: the waits start afresh, versions may restart.
        Steps trained: when they last rose, and whether they must (batches queued)."""
        trained = r.get("learner/steps_trained")
        if trained is not None:
            queued = r.get("flow/batches_in_queue", 0.0) > 0
            self._w.trained.see(trained, obs.now, due=queued)
        if self._disturbed is not None and obs.disturbed != self._disturbed:
            self._calm_since = self._fault_at = obs.now
        self._disturbed = obs.disturbed
        if obs.learner_key != self._learner_key:
            if self._learner_key is not None:
                self._calm_since = self._fault_at = obs.now
            self._learner_key = obs.learner_key
            self._w.versions.clear()  # env workers take a rebuilt learner's weights, any version

    def _calm(self, obs: Observed) -> bool:
        """No fault, move or new learner within ``stall_s``."""
        return obs.now - self._fault_at > self.stall_s

    # ------------------------------------------------------------------- laws
    def _rollouts(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        out = []
        for k, (key, acked, uncertain) in enumerate(obs.rollouts):
            stored = r.get(f"replay/{k}/rollouts_stored")
            if stored is None or k >= len(obs.shard_keys) or obs.shard_keys[k] != key:
                continue  # no stats, or another actor than the one counted
            if acked > stored + uncertain:
                out.append(
                    f"shard {k} acknowledged {acked} rollouts but stored {stored:.0f} "
                    f"(+{uncertain} in flight at its rebuild)"
                )
        return out

    def _priority_updates(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        out = []
        for k, (key, sent, failed, in_flight) in enumerate(obs.ledger):
            applied = r.get(f"replay/{k}/priority_updates_applied")
            if applied is None or k >= len(obs.shard_keys) or obs.shard_keys[k] != key:
                continue
            stale = r.get(f"replay/{k}/priority_updates_stale", 0.0)
            if sent > applied + stale + failed + in_flight:
                out.append(
                    f"shard {k}: the learner sent {sent}, the shard applied {applied:.0f} + "
                    f"stale {stale:.0f}, failed {failed}, in flight {in_flight}: "
                    f"{sent - applied - stale - failed - in_flight:.0f} missing"
                )
        return out

    def _trained_through(self, t: float) -> bool:
        """Whether steps trained kept rising for ``stall_s`` after time ``t`` (a learner
        that stopped meanwhile is the training law's, not a shard's)."""
        return self._w.trained.rose_at - t > self.stall_s

    def _sampling(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        out = []
        for k, key in enumerate(obs.shard_keys):
            size = r.get(f"replay/{k}/size")
            if size is None:
                continue
            for name in ("batches_sampled", "priority_updates_applied"):
                value = r.get(f"replay/{k}/{name}", 0.0)
                p = self._w.shards.setdefault((key, name), _Progress())
                p.see(value, obs.now, due=size >= self._enough)
                stalled = p.stalled(obs.now, self._calm_since, self.stall_s)
                if stalled is not None and self._trained_through(obs.now - stalled):
                    out.append(
                        f"shard {k} holds {size:.0f} items but its {name} stayed at "
                        f"{value:.0f} for {stalled:.0f} s while the learner trained"
                    )
        return out

    def _versions(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        out = []
        seen = [("the learner", ("learner", obs.learner_key), r.get("learner/version"))]
        seen += [
            (f"env worker {i}", ("env", key), obs.env_versions.get(i))
            for i, key in sorted(obs.env_keys.items())
        ]
        if obs.evaluated:
            seen.append(("the evaluator", ("eval", None), r.get("eval/weights_version")))
        calm = self._calm(obs)
        for who, key, version in seen:
            if version is None or math.isnan(version):
                continue
            top = self._w.versions.get(key, -math.inf)
            if version < top and calm:
                out.append(f"{who}'s weights version went back from {top:.0f} to {version:.0f}")
            self._w.versions[key] = version if not calm else max(top, version)
        return out + self._syncs(r.get("learner/version"), obs)

    def _syncs(self, learner: float | None, obs: Observed) -> list[str]:
        """Env workers that act on while the learner has newer weights (a stuck sync)."""
        if learner is None or math.isnan(learner):
            return []
        w = self.cfg.workers
        per_sync = w.max_weight_sync_delay + (
            w.rollouts_in_flight
            * w.rollouts_per_call
            * w.rollout_fragment_length
            * w.envs_per_worker
        )
        out = []
        for i, key in sorted(obs.env_keys.items()):
            version, steps = obs.env_versions.get(i), obs.env_steps.get(i)
            if version is None or steps is None or math.isnan(version) or math.isnan(steps):
                continue
            p = self._w.synced.setdefault(key, _Progress())
            synced = version != p.value  # a sync took a version (a rebuilt learner's: lower)
            if synced:
                self._w.steps_at_sync[key] = steps
            acted = steps - self._w.steps_at_sync[key]
            p.see(version, obs.now, due=learner > version and acted > SYNC_STEPS * per_sync)
            if synced:
                p.rose_at = obs.now
            stalled = p.stalled(obs.now, self._calm_since, self.stall_s)
            if stalled is not None:
                out.append(
                    f"env worker {i} acted {acted:.0f} steps over {stalled:.0f} s with weights "
                    f"version {version:.0f} while the learner had {learner:.0f}"
                )
        return out

    def _training(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        stalled = self._w.trained.stalled(obs.now, self._calm_since, self.stall_s)
        if stalled is None:
            return []
        trained = self._w.trained.value
        return [f"steps trained stayed at {trained:.0f} for {stalled:.0f} s with batches queued"]

    def _evaluation(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        ev = self.cfg.eval
        if ev.episodes <= 0:
            return []
        if obs.evaluated:
            self._last_eval = obs.now
            self._eval_s = max(self._eval_s, obs.eval_duration_s)
            return []
        since = max(self._last_eval if self._last_eval is not None else -math.inf, self._calm_since)
        if since == -math.inf:  # the first check: the wait starts now
            self._last_eval = obs.now
            return []
        late = 2 * ev.interval_s + 2 * self._eval_s + 5.0
        if obs.now - since <= late:
            return []
        return [f"no evaluation for {obs.now - since:.0f} s (interval {ev.interval_s:g} s)"]

    def _bounds(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        out = []
        cap = self.cfg.learner.inqueue_size
        for name, value, bound in (
            ("inqueue", r.get("flow/batches_in_queue", 0.0), cap),
            ("outbox", r.get("learner/outbox_size", 0.0), OUTBOX_BOUND),
            (
                "priority sends in flight",
                r.get("learner/priority_sends_in_flight", 0.0),
                SENDS_BOUND,
            ),
        ):
            if value > bound:
                out.append(f"the learner's {name} holds {value:.0f} (bound {bound})")
        per = self.cfg.workers.rollouts_in_flight
        for i, n in sorted(obs.rollouts_in_flight.items()):
            if n > per:
                out.append(f"env worker {i} has {n} rollout calls in flight (bound {per})")
        return out

    def _audit(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        if not self.cfg.replay.audit_priorities:
            return []
        out = []
        for k in range(len(obs.shard_keys)):
            bad = r.get(f"replay/{k}/audit_mismatches", 0.0)
            if bad > 0:
                out.append(f"shard {k}: {bad:.0f} updated items held other data than sampled")
        return out

    def _relays(self, r: Mapping[str, float], obs: Observed) -> list[str]:
        out = []
        for host, (key, st) in sorted(obs.relays.items()):
            p = f"relay/{host}/"
            got = {n: st.get(p + n, 0.0) for n in ("requests", "served", "current", "failed")}
            in_flight = st.get(p + "in_flight", 0.0)
            answered = got["served"] + got["current"] + got["failed"]
            if got["requests"] != answered + in_flight:
                out.append(
                    f"the relay on {host} had {got['requests']:.0f} requests but served "
                    f"{got['served']:.0f} + current {got['current']:.0f} + failed "
                    f"{got['failed']:.0f} + in flight {in_flight:.0f}"
                )
            repeats = st.get(p + "repeat_blobs", 0.0)
            if repeats > 0:
                out.append(f"the relay on {host} took {repeats:.0f} versions it held again")
            version = st.get(p + "version")
            if version is not None and version >= 0:
                top = self._w.versions.get(("relay", key), -math.inf)
                if version < top and self._calm(obs):
                    out.append(f"the relay on {host}'s version went back from {top:.0f}")
                self._w.versions[("relay", key)] = max(top, version)
        return out
