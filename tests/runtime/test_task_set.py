"""TaskSet: the driver's calls in flight, each handled when done, with a timeout each."""

from __future__ import annotations

import asyncio

import pytest

from apex_dask.runtime.actors.calls import call_with_timeout
from apex_dask.runtime.orchestration.tasks import TaskSet, task_error


class Peer:
    """An actor's async methods, awaited in this process."""

    async def answer(self, value: int, after_s: float = 0.0) -> int:
        await asyncio.sleep(after_s)
        return value


def test_each_handler_gets_its_own_call_and_a_slow_call_times_out():
    seen: dict[str, object] = {}

    def record(name):
        return lambda task: seen.__setitem__(name, task_error(task) or task.result())

    async def scenario():
        tasks = TaskSet(timeout_s=0.2)
        peer = Peer()
        tasks.spawn(lambda: peer.answer(1), on_done=record("fast"))
        tasks.spawn(lambda: peer.answer(2, after_s=30), on_done=record("slow"))
        tasks.spawn(lambda: peer.answer(3, after_s=0.4), record("own timeout"), timeout=5.0)
        tasks.spawn(lambda: peer.gone(), on_done=record("lost handle"))  # raises in the task
        assert len(tasks) == 4
        while len(tasks):
            await tasks.step(1.0)

    asyncio.run(scenario())
    assert seen["fast"] == 1 and seen["own timeout"] == 3
    assert isinstance(seen["slow"], TimeoutError)
    assert isinstance(seen["lost handle"], AttributeError)


def test_an_async_handler_is_awaited_and_one_that_raises_stops_the_caller():
    log: list[str] = []

    async def handled(task):
        await asyncio.sleep(0)
        log.append(f"handled {task.result()}")

    def failing(task):
        raise RuntimeError("handler failed")

    async def scenario():
        tasks = TaskSet(timeout_s=5.0)
        tasks.spawn(lambda: Peer().answer(7), on_done=handled)
        await tasks.step(1.0)
        tasks.spawn(lambda: Peer().answer(8), on_done=failing)
        with pytest.raises(RuntimeError, match="handler failed"):
            await tasks.step(1.0)

    asyncio.run(scenario())
    assert log == ["handled 7"]


def test_drain_handles_what_finishes_in_time_and_cancels_the_rest():
    done: list[int] = []

    async def scenario():
        tasks = TaskSet(timeout_s=60.0)
        peer = Peer()
        tasks.spawn(lambda: peer.answer(1, after_s=0.05), lambda t: done.append(t.result()))
        tasks.spawn(lambda: peer.answer(2, after_s=60), lambda t: done.append(t.result()))
        await tasks.drain(timeout_s=0.5)
        return len(tasks)

    assert asyncio.run(scenario()) == 0
    assert done == [1]  # the cancelled call's handler never ran


def test_call_with_timeout_returns_the_answer_or_raises_timeout_error():
    async def scenario():
        got = await call_with_timeout(Peer().answer(5), timeout_s=1.0)
        with pytest.raises(TimeoutError):
            await call_with_timeout(Peer().answer(6, after_s=30), timeout_s=0.05)
        return got

    assert asyncio.run(scenario()) == 5
