"""plan_placement: where the learner, shards, env workers and evaluator go (pure, no cluster)."""

from __future__ import annotations

import pytest

from apex_dask.runtime.errors import ApexRuntimeError
from apex_dask.runtime.orchestration.placement import (
    WorkerInfo,
    plan_placement,
    workers_from_scheduler_info,
)


def w(name: str, port: int, host: str = "10.0.0.1", **resources: float) -> WorkerInfo:
    return WorkerInfo(address=f"tcp://{host}:{port}", name=name, host=host, resources=resources)


def names(ws: list[WorkerInfo]) -> list[str]:
    return [x.name for x in ws]


def test_learner_prefers_a_worker_advertising_a_gpu():
    workers = [w("0", 1), w("1", 2), w("gpu-node", 3, GPU=1)]
    p = plan_placement(workers, num_shards=2, num_env_workers=4)
    assert p.learner.name == "gpu-node"
    assert names(p.shards) == ["gpu-node", "gpu-node"]  # colocated by default
    assert names(p.env_workers) == ["0", "1", "0", "1"]  # round-robin, learner's worker excluded


def test_without_gpu_the_learner_takes_the_first_worker_in_numeric_name_order():
    workers = [w("10", 1), w("2", 2), w("9", 3)]
    p = plan_placement(workers, num_shards=1, num_env_workers=2)
    assert p.learner.name == "2"
    assert names(p.env_workers) == ["9", "10"]


def test_named_learner_worker_wins_over_a_gpu_and_matches_name_or_address():
    workers = [w("a", 1), w("b", 2, GPU=1)]
    assert (
        plan_placement(workers, num_shards=1, num_env_workers=1, learner_worker="a").learner.name
        == "a"
    )
    by_addr = plan_placement(
        workers, num_shards=1, num_env_workers=1, learner_worker="tcp://10.0.0.1:1"
    )
    assert by_addr.learner.name == "a"


def test_an_unknown_learner_worker_is_a_one_line_error():
    with pytest.raises(ApexRuntimeError, match="matches no worker") as err:
        plan_placement([w("a", 1)], num_shards=1, num_env_workers=1, learner_worker="gpu")
    assert "\n" not in str(err.value)


def test_no_workers_is_an_error():
    with pytest.raises(ApexRuntimeError, match="no workers"):
        plan_placement([], num_shards=1, num_env_workers=1)


def test_a_single_worker_holds_everything():
    p = plan_placement([w("only", 1)], num_shards=2, num_env_workers=3)
    assert {x.name for x in [p.learner, *p.shards, *p.env_workers, p.evaluator]} == {"only"}


def test_shards_spread_round_robin_after_the_learner_when_not_colocated():
    workers = [w("0", 1), w("1", 2), w("2", 3)]
    p = plan_placement(workers, num_shards=4, num_env_workers=2, replay_placement="spread")
    assert p.learner.name == "0"
    assert names(p.shards) == ["1", "2", "0", "1"]


def site() -> list[WorkerInfo]:
    """A learner host (GPU worker + two CPU workers) and two env hosts."""
    return [
        w("learner", 1, "198.18.0.3", GPU=1),
        w("lhost-0", 2, "198.18.0.3"),
        w("lhost-1", 3, "198.18.0.3"),
        w("env1", 4, "198.18.0.11"),
        w("env2", 5, "198.18.0.12"),
    ]


@pytest.mark.parametrize(
    ("placement", "shards", "env_workers"),
    [
        ("learner_process", ["learner"] * 3, ["env1", "env2", "lhost-0", "lhost-1"]),
        ("learner_host", ["lhost-0", "lhost-1", "lhost-0"], ["env1", "env2", "env1", "env2"]),
        ("spread", ["lhost-0", "lhost-1", "env1"], ["env1", "env2", "lhost-0", "lhost-1"]),
    ],
)
def test_replay_placement_puts_shards_and_keeps_env_workers_off_shard_processes(
    placement, shards, env_workers
):
    p = plan_placement(site(), num_shards=3, num_env_workers=4, replay_placement=placement)
    assert p.learner.name == "learner"
    assert names(p.shards) == shards
    assert names(p.env_workers) == env_workers
    if placement == "learner_host":  # own processes, the learner's host, not the learner's
        assert {s.host for s in p.shards} == {"198.18.0.3"}
        assert all(s.address != p.learner.address for s in p.shards)
        assert p.evaluator.host != "198.18.0.3"


def test_learner_host_without_peers_on_that_host_falls_back_to_the_learner_process():
    workers = [w("learner", 1, "h1", GPU=1), w("env", 2, "h2")]
    p = plan_placement(workers, num_shards=2, num_env_workers=2, replay_placement="learner_host")
    assert names(p.shards) == ["learner", "learner"]
    assert names(p.env_workers) == ["env", "env"]


def test_learner_host_on_one_host_still_gives_env_workers_a_worker():
    workers = [w("learner", 1, GPU=1), w("cpu", 2)]
    p = plan_placement(workers, num_shards=1, num_env_workers=2, replay_placement="learner_host")
    assert names(p.shards) == ["cpu"]
    assert names(p.env_workers) == ["cpu", "cpu"]


def test_an_unknown_replay_placement_is_a_one_line_error():
    with pytest.raises(ApexRuntimeError, match="learner_process, learner_host, spread"):
        plan_placement([w("a", 1)], num_shards=1, num_env_workers=1, replay_placement="near")


def test_evaluator_goes_to_the_least_loaded_env_worker_host():
    workers = [w("0", 1), w("1", 2), w("2", 3)]
    p = plan_placement(workers, num_shards=1, num_env_workers=3)  # env on 1, 2, 1
    assert p.evaluator.name == "2"


def test_placement_dict_and_scheduler_info_round_trip():
    info = {
        "workers": {
            "tcp://h:2": {"name": 1, "host": "h", "resources": {}},
            "tcp://h:1": {"name": 0, "host": "h", "resources": {"GPU": 1.0}},
        }
    }
    workers = workers_from_scheduler_info(info)
    assert [(x.name, x.address) for x in workers] == [("0", "tcp://h:1"), ("1", "tcp://h:2")]
    d = plan_placement(workers, num_shards=1, num_env_workers=1).as_dict()
    assert d["learner"] == {
        "address": "tcp://h:1",
        "name": "0",
        "host": "h",
        "resources": {"GPU": 1.0},
    }
    assert d["env_workers"][0]["name"] == "1" and d["evaluator"]["name"] == "1"


def test_config_key_and_the_old_colocate_key():
    from apex_dask.config import ApexConfig, ConfigError

    cfg = ApexConfig.preset("cartpole")
    assert cfg.replay.placement == "learner_process" and cfg.replay.colocate_with_learner
    assert cfg.override({"replay.placement": "learner_host"}).replay.placement == "learner_host"
    # an old config file's key still works: true -> learner_process, false -> spread
    assert cfg.override({"replay.colocate_with_learner": "false"}).replay.placement == "spread"
    old = ApexConfig.from_dict({"replay": {"colocate_with_learner": True}})
    assert old.replay.placement == "learner_process"
    with pytest.raises(ConfigError, match="replay.placement='near' is invalid") as err:
        cfg.override({"replay.placement": "near"})
    assert "\n" not in str(err.value)


def test_only_workers_keeps_the_named_ones_and_refuses_a_stranger():
    from apex_dask.runtime.orchestration.placement import only_workers

    workers = [WorkerInfo(f"tcp://h:{i}", str(i), "h") for i in range(4)]
    assert only_workers(workers, None) == workers
    assert [w.name for w in only_workers(workers, ["tcp://h:3", "1", "1"])] == ["3", "1"]
    with pytest.raises(ApexRuntimeError, match="'tcp://h:9' is not on the Dask cluster"):
        only_workers(workers, ["tcp://h:9"])
    with pytest.raises(ApexRuntimeError, match="empty"):
        only_workers(workers, [])
