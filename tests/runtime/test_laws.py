"""Each law of the run's counters trips on a bug that breaks it, and holds without one.

The plan runs over the real actor objects in this process (as
``test_plan_in_process.py``) with ``report.strict_invariants`` on and the priority
audit on; a failpoint (``runtime/actors/failpoints.py``) injects one bug after the
second result. The run must end with :class:`InvariantViolated` naming the law the
bug breaks, its numbers in the line. The laws that wait for progress get a 3 s
window here (20 s by default). The same on a real cluster, for two of them:
``tests/e2e/test_chaos_matrix.py``.
"""

from __future__ import annotations

import asyncio
import queue

import pytest
from test_plan_in_process import small_config
from test_supervision import plan_for, results_until

from apex_dask.runtime.actors.failpoints import clear_failpoints
from apex_dask.runtime.errors import InvariantViolated
from apex_dask.runtime.orchestration import invariants
from apex_dask.runtime.orchestration.invariants import LAWS, Invariants, Observed
from apex_dask.runtime.orchestration.plan import ExecutionPlan

BUGS = [  # (failpoint, value, the law it breaks, words of the line)
    ("drop_rollout_every", 5, "rollouts", "acknowledged"),
    ("drop_priority_update_every", 10, "priority_updates", "missing"),
    ("skip_shard", 1, "sampling", "batches_sampled stayed"),
    ("weights_version_back", 1, "versions", "went back"),
    ("stall_weight_sync", 1, "versions", "while the learner had"),
    ("stall_learner", 1, "training", "steps trained stayed"),
    ("stall_evaluator", 1, "evaluation", "no evaluation for"),
    ("stall_priority_sender", 1, "bounds", "outbox holds"),
    ("wrong_items", 1, "audit", "held other data"),
]


@pytest.fixture(autouse=True)
def no_failpoints_left():
    clear_failpoints()
    yield
    clear_failpoints()


def strict_plan(results: queue.Queue) -> ExecutionPlan:
    overrides = {"report.strict_invariants": True, "replay.audit_priorities": True}
    plan = plan_for(None, results, **overrides)
    assert plan.report.invariants is not None and plan.report.invariants.strict
    plan.report.invariants.stall_s = 3.0
    return plan


def test_every_law_has_a_bug_here():
    # relays run only on a cluster: their law's bug is tests/runtime/test_weight_relays.py's
    assert {law for _, _, law, _ in BUGS} | {"relays"} == set(LAWS)


@pytest.mark.slow  # about 5 s each
@pytest.mark.parametrize(("failpoint", "value", "law", "words"), BUGS, ids=[b[0] for b in BUGS])
def test_a_law_trips_on_the_bug_that_breaks_it(monkeypatch, failpoint, value, law, words):
    monkeypatch.setattr(invariants, "OUTBOX_BOUND", 64)  # the stalled sender's outbox: soon
    results: queue.Queue = queue.Queue()
    plan = strict_plan(results)
    with pytest.raises(InvariantViolated) as err:
        asyncio.run(results_until(plan, results, lambda got: False, 120, [(failpoint, value)]))
    assert err.value.law == law, str(err.value)
    assert words in str(err.value) and "report.strict_invariants" in str(err.value)


@pytest.mark.slow
def test_without_a_bug_no_law_trips_over_many_results():
    results: queue.Queue = queue.Queue()
    plan = strict_plan(results)
    stall_s = plan.report.invariants.stall_s

    def long_enough(got: list[dict]) -> bool:  # the waiting laws applied for a while
        return len(got) >= 12 and got[-1]["time_s"] > 3 * stall_s

    got = asyncio.run(results_until(plan, results, long_enough, 120))
    assert all(r["health/invariant_violations"] == 0 for r in got)


def test_a_violation_without_strict_is_one_warning_and_a_count():
    cfg = small_config()
    warned: list[str] = []
    check = Invariants(cfg, warn=warned.append)
    assert not check.strict
    result = {"replay/0/priority_updates_applied": 5.0, "replay/0/priority_updates_stale": 1.0}
    obs = Observed(
        now=100.0,
        learner_key="L",
        ledger=[("S0", 9, 1, 0)],
        shard_keys=["S0"],
        env_keys={},
        rollouts=[],
        rollouts_in_flight={},
    )
    for _ in range(3):
        lines = check.check(result, obs)
    assert lines == [
        "priority_updates: shard 0: the learner sent 9, the shard applied 5 + "
        "stale 1, failed 1, in flight 0: 2 missing"
    ]
    assert len(warned) == 1 and "invariant violated: priority_updates" in warned[0]
    assert check.metrics()["health/invariant_violations/priority_updates"] == 3
    assert check.metrics()["health/invariant_violations"] == 3
    # another actor than the one the learner counted for: not compared
    obs.shard_keys = ["S0-rebuilt"]
    assert check.check(result, obs) == []
