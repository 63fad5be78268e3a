"""The actor classes offer what the contracts in ``runtime/actors/contracts.py`` name."""

from __future__ import annotations

import inspect

import pytest

from apex_dask.runtime.actors import EnvWorkerActor, LearnerActor, ReplayShardActor
from apex_dask.runtime.actors.contracts import (
    EnvWorkerHandle,
    LearnerHandle,
    RelayHandle,
    ShardHandle,
)
from apex_dask.runtime.actors.weight_relay import WeightRelayActor

PAIRS = [
    (ShardHandle, ReplayShardActor),
    (LearnerHandle, LearnerActor),
    (EnvWorkerHandle, EnvWorkerActor),
    (RelayHandle, WeightRelayActor),
]


def _methods(protocol: type) -> dict[str, inspect.Signature]:
    return {
        name: inspect.signature(fn)
        for name, fn in vars(protocol).items()
        if inspect.isfunction(fn) and not name.startswith("_")
    }


@pytest.mark.parametrize(("protocol", "cls"), PAIRS, ids=lambda x: x.__name__)
def test_actor_offers_every_method_of_its_contract_as_async(protocol, cls):
    wanted = _methods(protocol)
    assert wanted, f"{protocol.__name__} names no method"
    for name, sig in wanted.items():
        fn = getattr(cls, name, None)
        assert fn is not None, f"{cls.__name__} lacks {name}"
        assert inspect.iscoroutinefunction(fn), f"{cls.__name__}.{name} is not async"
        have = list(inspect.signature(fn).parameters)
        assert have == list(sig.parameters), f"{cls.__name__}.{name}{have} != contract {sig}"


def test_every_public_actor_method_is_in_a_contract():
    """A method the driver or a peer may call is written down (or private)."""
    for protocol, cls in PAIRS:
        public = {n for n, f in vars(cls).items() if inspect.iscoroutinefunction(f) and n[0] != "_"}
        assert public <= set(_methods(protocol)), (cls.__name__, public - set(_methods(protocol)))
