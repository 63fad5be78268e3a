"""The learner's pipelined batch path on CPU: staging buffers, results read one update
later, the device-side skip of a non-finite step, and the device options.

The same classes on a CUDA device (pinned buffers, a copy stream, events) are
tested at the end, where torch sees one.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from agent_parts import configs
from gymnasium import spaces

from apex_dask.algo.agents.base import NonFiniteLossError
from apex_dask.algo.agents.device_batches import BatchStager, ResultPipe, check_device_options
from apex_dask.algo.agents.dqn.learner import Learner

OBS = spaces.Box(0, 255, (4, 12, 12), np.uint8)
ACT = spaces.Discrete(3)
needs_cuda = pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device (torch sees none)"
)


def frames_batch(rng: np.random.Generator, n: int = 8) -> tuple[dict[str, np.ndarray], np.ndarray]:
    def frames() -> np.ndarray:
        return rng.integers(0, 256, (n, *OBS.shape), dtype=np.uint8)

    data = {
        "obs": frames(),
        "next_obs": frames(),
        "action": rng.integers(0, ACT.n, n),
        "reward": rng.normal(size=n).astype(np.float32),
        "discount": np.full(n, 0.9, np.float32),
    }
    return data, rng.uniform(0.5, 1.0, n).astype(np.float32)


def learner(**kw) -> Learner:
    return Learner(OBS, ACT, *configs("dqn", hiddens=(16,), **kw))


def weights_of(lr: Learner) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy().copy() for k, v in lr.online.state_dict().items()}


def test_stager_reuses_its_host_buffers_and_keeps_uint8_frames_uint8():
    stager = BatchStager("cpu", slots=2)
    rng = np.random.default_rng(0)
    batches = [frames_batch(rng) for _ in range(5)]
    staged = [stager.stage(d, w) for d, w in batches]
    assert stager.allocations == 2 * 6  # two slots of six keys, then reused
    slot0 = {k: v.data_ptr() for k, v in stager.host_slot(0).items()}
    stager.stage(*batches[0])
    stager.stage(*batches[1])
    assert {k: v.data_ptr() for k, v in stager.host_slot(0).items()} == slot0
    (data, w), last = batches[-1], staged[-1].tensors
    assert last["obs"].dtype == torch.uint8 and last["next_obs"].dtype == torch.uint8
    assert last["action"].dtype == torch.int64 and last["reward"].dtype == torch.float32
    np.testing.assert_array_equal(last["obs"].numpy(), data["obs"])
    np.testing.assert_array_equal(last["weights"].numpy(), w)
    # the staged tensors are copies: refilling the slot leaves an earlier batch intact
    np.testing.assert_array_equal(staged[0].tensors["obs"].numpy(), batches[0][0]["obs"])
    stager.stage(*frames_batch(rng, n=4))  # another batch size: new buffers
    assert stager.allocations == 2 * 6 + 6


def test_result_pipe_hands_back_each_update_once_in_order():
    pipe = ResultPipe("cpu")
    for i in range(3):
        scalars = torch.tensor([0.5 + i, 1.0, 2.0, 1.0])
        pipe.push(f"batch{i}", i + 1, scalars, torch.full((4,), float(i)))
    assert len(pipe) == 3 and pipe.check() is None
    done = [pipe.pop() for _ in range(3)]
    assert [d.tag for d in done] == ["batch0", "batch1", "batch2"]
    assert [d.loss for d in done] == [0.5, 1.5, 2.5] and all(d.finite for d in done)
    np.testing.assert_array_equal(done[2].td_abs, np.full(4, 2.0, np.float32))
    assert pipe.device_stats() == {}  # no CUDA events on CPU: no device metrics


def test_pipelined_updates_match_plain_updates_and_come_back_one_update_later():
    rng = np.random.default_rng(1)
    batches = [frames_batch(rng) for _ in range(4)]
    plain, piped = learner(pipeline=False), learner(pipeline=True)
    expected = [plain.update(d, w) for d, w in batches]
    got = []
    for i, (d, w) in enumerate(batches):
        done = piped.submit(d, w, tag=i)
        assert [r.tag for r in done] == ([] if i == 0 else [i - 1])  # read one update later
        got += done
    got += piped.drain()
    assert [r.tag for r in got] == [0, 1, 2, 3] and piped.drain() == []
    for (td, m), r in zip(expected, got, strict=True):
        np.testing.assert_allclose(r.td_abs, td, rtol=1e-5, atol=1e-6)
        assert r.loss == pytest.approx(m["loss"], rel=1e-5)
    assert piped.version == plain.version == 4
    a, b = plain.get_weights()[1], piped.get_weights()[1]
    assert all(np.allclose(a[k], b[k], atol=1e-6) for k in a)
    td, m = piped.update(*batches[0])  # the blocking call still works on this path
    assert td.shape == (8,) and set(m) == {"loss", "mean_q", "grad_norm"}


def test_a_non_finite_update_is_skipped_on_the_device_and_blocks_publishing_and_saving():
    rng = np.random.default_rng(2)
    lr = learner(pipeline=True)
    lr.update(*frames_batch(rng))
    before = weights_of(lr)
    data, w = frames_batch(rng)
    data["reward"][3] = np.nan
    assert lr.submit(data, w, tag="bad") == []  # queued; nothing read yet
    assert all(np.array_equal(before[k], v) for k, v in weights_of(lr).items())
    for read in (lr.get_weights, lr.state_dict):  # published / saved weights: checked first
        with pytest.raises(NonFiniteLossError, match="update 2"):
            read()
    with pytest.raises(NonFiniteLossError, match="non-finite loss nan"):
        lr.submit(*frames_batch(rng), tag="next")  # the learner thread sees it here
    assert all(np.isfinite(v).all() for v in weights_of(lr).values())


def test_a_plain_checkpoint_loads_into_a_pipelined_learner_and_back():
    rng = np.random.default_rng(3)
    plain = learner(pipeline=False)
    plain.update(*frames_batch(rng))
    piped = learner(pipeline=True)
    piped.load_state_dict(plain.state_dict())
    assert all(g["fused"] for g in piped.optimizer.param_groups)
    steps = [st["step"] for st in piped.optimizer.state.values()]
    assert steps and all(t.dtype == torch.float32 for t in steps)  # as fused Adam keeps them
    piped.update(*frames_batch(rng))
    again = learner(pipeline=False)
    again.load_state_dict(piped.state_dict())
    assert again.version == 2 and not any(g["fused"] for g in again.optimizer.param_groups)
    again.update(*frames_batch(rng))


@pytest.mark.parametrize("pipeline", [False, True])
def test_bf16_autocast_and_channels_last_train_on_cpu(pipeline):
    rng = np.random.default_rng(4)
    data, w = frames_batch(rng)
    lr = learner(pipeline=pipeline, amp="bf16", memory_format="channels_last")
    conv = lr.online.conv[0].weight
    assert conv.is_contiguous(memory_format=torch.channels_last)
    td, m = lr.update(data, w)
    assert td.dtype == np.float32 and np.isfinite(td).all() and np.isfinite(m["loss"])
    reference, _ = learner().update(data, w)
    np.testing.assert_allclose(td, reference, rtol=0.1, atol=0.05)  # bf16: ~3 digits


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"amp": "fp16", "compile": False, "memory_format": "contiguous"}, "dqn.amp"),
        ({"amp": "off", "compile": False, "memory_format": "nhwc"}, "dqn.memory_format"),
    ],
)
def test_device_options_are_checked_with_a_one_line_message(options, message):
    with pytest.raises(ValueError, match=message) as err:
        check_device_options("cpu", **options, section="dqn")
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match=message):
        learner(**options)


@pytest.mark.gpu
@needs_cuda
def test_cuda_stager_pins_its_buffers_and_the_pipeline_matches_the_cpu_learner():
    rng = np.random.default_rng(5)
    batches = [frames_batch(rng) for _ in range(3)]
    stager = BatchStager("cuda")
    staged = stager.stage(*batches[0])
    assert all(t.is_pinned() for t in stager.host_slot(0).values())
    staged.wait()
    assert staged.tensors["obs"].dtype == torch.uint8 and staged.tensors["obs"].is_cuda
    cpu, gpu = learner(), learner(device="cuda")
    assert gpu.pipeline
    expected = [cpu.update(d, w)[0] for d, w in batches]
    got = [r.td_abs for d, w in batches for r in gpu.submit(d, w)] + [r.td_abs for r in gpu.drain()]
    for e, g in zip(expected, got, strict=True):
        np.testing.assert_allclose(g, e, rtol=1e-3, atol=1e-4)
    stats = gpu.device_stats()
    assert {"learner/device_mem_bytes", "learner/device_mem_peak_bytes"} <= set(stats)


@pytest.mark.gpu
@needs_cuda
def test_cuda_non_finite_update_is_skipped_and_blocks_publishing():
    rng = np.random.default_rng(6)
    lr = learner(device="cuda")
    lr.update(*frames_batch(rng))
    before = weights_of(lr)
    data, w = frames_batch(rng)
    data["reward"][0] = np.inf
    lr.submit(data, w)
    with pytest.raises(NonFiniteLossError):
        lr.get_weights()
    assert all(np.array_equal(before[k], v) for k, v in weights_of(lr).items())
