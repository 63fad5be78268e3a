"""The frame-stacked variant of ``benchmarks/replay.py``: memory, wire bytes and cycle rates.

Run through ``benchmarks/replay.py`` (``--skip-stacked`` leaves it out,
``--stacked-capacity`` sizes it). Workload: capacity 2^17, observations
uint8 (4, 84, 84) from an Atari-like stream (each frame redraws three 8x8
blocks of the previous one, so neighbouring frames are nearly equal, as on
Atari), episodes of 200-2000 steps (a third truncated), n-step 3 through the
real ``NStepAdder``, fragments of 50 env steps, as an env worker makes them.

Shards, all pre-filled with the same fragments:

- ``full``: ``ReplayShard(frame_stack=None)`` given full stacks (the storage
  before frame stacking: obs and next_obs whole);
- ``dedup``: ``ReplayShard(frame_stack=4)`` given the compact form an env
  worker sends (``frames`` + refs): the learner's shard in a run;
- ``dedup-stacks-in``: ``ReplayShard(frame_stack=4)`` given full stacks
  (encoded in ``add``);
- ``floor``: the bare gather, working in the ``full`` shard's arrays.

Wire bytes: one rollout message as the Dask comm sends it, i.e.
``distributed.protocol.dumps`` of the ``actor_execute`` message that
``shard.add(batch, priorities)`` on a shard actor makes (compression off, the
default), per transition, full stacks vs the compact form.
"""

from __future__ import annotations

import gc

import numpy as np
from replay import ADD_N, OPS, Floor, time_ops

from apex_dask.algo.replay.codec import encode_batch
from apex_dask.algo.replay.shard import ReplayShard
from apex_dask.algo.rollout.nstep import NStepAdder, stack_transitions

K, N_STEP, FRAME = 4, 3, (84, 84)
MINATAR_CHANNELS = {"breakout": 4, "asterix": 4, "space_invaders": 6, "freeway": 7, "seaquest": 10}
RLLIB_CAPACITY = 2_000_000


class AtariLikeEpisodes:
    """Fragments of n-step transitions over stacks of nearly-equal 84x84 frames."""

    def __init__(self, rng: np.random.Generator, lengths: tuple[int, int] = (200, 2000)) -> None:
        self.rng, self.lengths = rng, lengths
        self.adder = NStepAdder(N_STEP, 0.99)
        self._reset()

    def _reset(self) -> None:
        self.frame = self.rng.integers(0, 256, FRAME, dtype=np.uint8)
        self.window = [self.frame] * K  # reset padding, as FrameStackObservation
        self.obs = np.stack(self.window)
        self.left = int(self.rng.integers(*self.lengths))

    def fragment(self, steps: int = ADD_N) -> dict:
        out = []
        for _ in range(steps):
            frame = self.frame.copy()
            for _ in range(3):
                y, x = self.rng.integers(0, FRAME[0] - 8, 2)
                frame[y : y + 8, x : x + 8] = self.rng.integers(0, 256, (8, 8), dtype=np.uint8)
            self.frame = frame
            self.window = self.window[1:] + [frame]
            nxt = np.stack(self.window)
            self.left -= 1
            end = self.left <= 0
            cut = end and self.rng.random() < 1 / 3
            action, reward = int(self.rng.integers(18)), float(self.rng.random() < 0.05)
            out += self.adder.add(self.obs, action, reward, nxt, end and not cut, cut)
            if end:
                self._reset()
            else:
                self.obs = nxt
        return stack_transitions(out, (K, *FRAME), np.dtype(np.uint8))


class Shard:
    """A ReplayShard under the benchmark's interface (see ``replay.Ours``)."""

    def __init__(self, name: str, capacity: int, frame_stack, compact: bool) -> None:
        self.name, self.compact = name, compact
        self.shard = ReplayShard(capacity, alpha=0.6, eps=1e-6, seed=1, frame_stack=frame_stack)
        self._encoded: dict[int, dict] = {}

    def _input(self, batch: dict) -> dict:
        if not self.compact:
            return batch
        if id(batch) not in self._encoded:  # the timed batches are encoded once, untimed
            self._encoded[id(batch)] = encode_batch(batch, K)
        return self._encoded[id(batch)]

    def prefill(self, chunk: dict, prios: np.ndarray) -> None:
        self.shard.add(encode_batch(chunk, K) if self.compact else chunk, priorities=prios)

    def add(self, batch: dict) -> None:
        self.shard.add(self._input(batch))

    def sample(self) -> np.ndarray:
        self.last = self.shard.sample(512, 0.4)
        return self.last.indices

    def update(self, idx: np.ndarray, prios: np.ndarray) -> None:
        # a cycle's update names the sample's items (generations), as the learner's does
        last = getattr(self, "last", None)
        gen = last.generations if last is not None and idx is last.indices else None
        self.shard.update_priorities(idx, prios, gen)


def wire_bytes(batch: dict, priorities: np.ndarray) -> int:
    """Bytes of ``shard_actor.add(batch, priorities)`` as the Dask comm serializes it."""
    from distributed.protocol import dumps, to_serialize

    msg = {
        "op": "actor_execute",
        "actor": "ReplayShardActor-4f1c1e8b2a6d4e0c9b7a5f3e1d2c0b9a",
        "function": "add",
        "args": [to_serialize(batch), to_serialize(priorities)],
        "kwargs": {},
    }
    return sum(memoryview(f).nbytes for f in dumps(msg))


def wire(rng: np.random.Generator, fragments: int = 40) -> dict:
    env = AtariLikeEpisodes(rng)
    full = compact = frames = n = 0
    for _ in range(fragments):
        batch = env.fragment()
        prios = rng.random(len(batch["action"])).astype(np.float32)
        enc = encode_batch(batch, K)
        full += wire_bytes(batch, prios)
        compact += wire_bytes(enc, prios)
        frames += len(enc["frames"])
        n += len(batch["action"])
    return {
        "transitions": n,
        "bytes_per_transition_full": full / n,
        "bytes_per_transition_compact": compact / n,
        "frames_per_transition_compact": frames / n,
        "frame_bytes": int(np.prod(FRAME)),
    }


def memory_table(per_item: dict) -> dict:
    """Bytes per item of capacity for MinAtar-shaped shards (allocated, not filled)."""
    out = {}
    for game, c in MINATAR_CHANNELS.items():
        row = {}
        for name, k in (("full", None), ("dedup_k1", 1)):
            shard = ReplayShard(1 << 14, frame_stack=k)
            obs = np.zeros((50, *(() if k is None else (1,)), 10, 10, c), bool)
            batch = {"obs": obs, "action": np.zeros(50, np.int64), "next_obs": obs}
            for key, dtype in (("reward", np.float32), ("done", bool), ("discount", np.float32)):
                batch[key] = np.zeros(50, dtype)
            shard.add(batch)
            row[name] = shard.stats()["bytes"] / shard.capacity
        out[f"minatar/{game} (10,10,{c}) bool"] = row
    out["atari (4,84,84) uint8"] = per_item
    out["rllib_2M_GB"] = {k: v * RLLIB_CAPACITY / 1e9 for k, v in per_item.items()}
    return out


def run_stacked(args, rng: np.random.Generator) -> dict:
    capacity = args.stacked_capacity
    impls = [
        Shard("full", capacity, None, compact=False),
        Shard("dedup", capacity, K, compact=True),
        Shard("dedup-stacks-in", capacity, K, compact=False),
    ]
    env = AtariLikeEpisodes(rng)
    added = 0
    while added < capacity:
        batch = env.fragment()
        prios = np.abs(rng.standard_normal(len(batch["action"]))) + 1e-3
        for impl in impls:
            impl.prefill(batch, prios)
        added += len(prios)
    batches = []
    while len(batches) < 16:  # the floor adds exactly ADD_N rows
        batch = env.fragment()
        if len(batch["action"]) == ADD_N:
            batches.append(batch)
    per_item = {i.name: i.shard.stats()["bytes"] / capacity for i in impls[:2]}
    held = {i.name: len(i.shard) for i in impls}
    borrow = {k: impls[0].shard.items.arrays[k] for k in ("obs", "next_obs")}
    floor = Floor(capacity, batches[0], rng, borrow)
    base = {"add": 300, "sample": 10, "update": 20, "cycle": 3}
    reps = {op: max(3, int(r * (0.3 if args.quick else 1))) for op, r in base.items()}
    rounds = 5 if args.quick else 15
    rates = time_ops([*impls, floor], batches, reps, rounds, capacity, rng)
    out = {
        "capacity": capacity,
        "obs": f"uint8{[K, *FRAME]}",
        "reps": reps,
        "rounds": rounds,
        "items_held": held,
        "ops_per_s": {n: {op: m for op, (m, _) in ops.items()} for n, ops in rates.items()},
        "best_ops_per_s": {n: {op: b for op, (_, b) in ops.items()} for n, ops in rates.items()},
    }
    r = out["ops_per_s"]
    out["rate_over_full"] = {
        name: {op: r[name][op] / r["full"][op] for op in OPS}
        for name in ("dedup", "dedup-stacks-in", "floor")
    }
    del impls, floor, borrow
    gc.collect()
    out["memory_bytes_per_item"] = memory_table(per_item)
    out["wire"] = wire(rng)
    return out


def print_stacked(res: dict) -> None:
    r = res["ops_per_s"]
    cols = ("full", "dedup", "dedup-stacks-in", "floor")
    print(f"\nstacked: capacity {res['capacity']}, obs {res['obs']}, held {res['items_held']}")
    print(f"{'op':8s}" + "".join(f"{c + ' ops/s':>22s}" for c in cols) + f"{'dedup/full':>12s}")
    for op in OPS:
        row = f"{op:8s}" + "".join(f"{r[c][op]:22,.1f}" for c in cols)
        print(row + f"{res['rate_over_full']['dedup'][op]:12.2f}")
    print("bytes per item of capacity:")
    for name, row in res["memory_bytes_per_item"].items():
        print(f"  {name:36s} " + ", ".join(f"{k} {v:,.1f}" for k, v in row.items()))
    w = res["wire"]
    print(
        f"wire per transition: full stacks {w['bytes_per_transition_full']:,.0f} B, compact "
        f"{w['bytes_per_transition_compact']:,.0f} B "
        f"({w['frames_per_transition_compact']:.3f} frames of {w['frame_bytes']} B)"
    )
