"""``guarded``: what a turn's awaits on Stop and steer must keep, whatever runs them.

A model request, a hook or a run slot is awaited under :func:`cox_runner.turn.guarded`: Stop or
steer ends it at once (its cleanup runs) and the turn sees ``StopRequested``; a cancellation from
outside (the drive lost its lease, the runner shuts down) stays a cancellation; a deadline around it
stays a deadline; and nothing of a stop it converted is left on the task for a later await.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from cox_runner.errors import StopRequested
from cox_runner.turn import Turn, guarded


def _turn() -> Turn:
    return Turn(sid="s", turn_id="t", token="k", message_id="m", text="", via="send", workspace=Path("."),
                model="script")


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def stop_once_started(t: Turn, started: asyncio.Event, reason: str) -> asyncio.Future[None]:
    """Stop ``t`` (``reason``) from another task as soon as the guarded work has ``started``."""
    async def stopper() -> None:
        await started.wait()
        t.request_stop(reason)

    return asyncio.ensure_future(stopper())


def test_a_guarded_await_answers_what_it_awaited() -> None:
    async def main() -> Any:
        t = _turn()

        async def work() -> int:
            await asyncio.sleep(0)
            return 7

        return await guarded(t, work()), await guarded(t, asyncio.ensure_future(work()))

    assert run(main()) == (7, 7)


def test_a_stop_before_the_await_runs_nothing() -> None:
    ran: list[str] = []

    async def main() -> None:
        t = _turn()
        t.request_stop("steer")

        async def work() -> None:
            ran.append("work")

        with pytest.raises(StopRequested) as exc:
            await guarded(t, work())
        assert exc.value.reason == "steer"

    run(main())
    assert ran == []


@pytest.mark.parametrize("reason", ["stop", "steer", "shutdown"])
def test_a_stop_during_the_await_ends_it_with_its_cleanup_and_leaves_the_task_clean(reason: str) -> None:
    seen: list[str] = []

    async def main() -> None:
        t = _turn()
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            try:
                await asyncio.sleep(30)
            finally:
                seen.append("cleanup")

        s = stop_once_started(t, started, reason)
        with pytest.raises(StopRequested) as exc:
            await guarded(t, work())
        await s
        assert exc.value.reason == reason
        me = asyncio.current_task()
        assert me is not None and me.cancelling() == 0  # nothing of the stop left on the task
        # A later deadline on the same task is still a deadline, and a later await still runs.
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.01):
                await asyncio.sleep(1)
        await asyncio.sleep(0)
        seen.append("after")

    run(main())
    assert seen == ["cleanup", "after"]


def test_a_cancellation_from_outside_stays_a_cancellation() -> None:
    async def main() -> None:
        t = _turn()
        started = asyncio.Event()

        async def work() -> None:
            started.set()
            await asyncio.sleep(30)

        async def turn_task() -> None:
            await guarded(t, work())

        task = asyncio.ensure_future(turn_task())
        await started.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

        # Both at once (the lease lost as a Stop came): still the cancellation.
        t2 = _turn()
        started.clear()

        async def turn_task2() -> None:
            await guarded(t2, work())

        task = asyncio.ensure_future(turn_task2())
        await started.wait()
        t2.request_stop("stop")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    run(main())


def test_a_deadline_around_a_guarded_await_is_a_timeout_and_a_stop_inside_it_is_a_stop() -> None:
    async def main() -> None:
        t = _turn()
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.02):
                await guarded(t, asyncio.sleep(30))

        async def stop_soon() -> None:
            await asyncio.sleep(0.01)
            t.request_stop("stop")

        stopping = asyncio.ensure_future(stop_soon())
        with pytest.raises(StopRequested):
            async with asyncio.timeout(5):
                await guarded(t, asyncio.sleep(30))
        await stopping

    run(main())


def test_an_await_that_swallows_the_stop_still_ends_as_stopped() -> None:
    async def main() -> None:
        t = _turn()
        started = asyncio.Event()

        async def stubborn() -> str:
            started.set()
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                return "finished anyway"
            return "slept"

        s = stop_once_started(t, started, "stop")
        with pytest.raises(StopRequested):
            await guarded(t, stubborn())
        await s
        me = asyncio.current_task()
        assert me is not None and me.cancelling() == 0
        await asyncio.sleep(0)  # nothing pending on the task

    run(main())


def test_a_guard_inside_a_guard_ends_both_and_the_outer_sees_the_stop() -> None:
    async def main() -> None:
        t = _turn()
        started = asyncio.Event()
        cleaned: list[str] = []

        async def inner() -> None:
            started.set()
            try:
                await asyncio.sleep(30)
            finally:
                cleaned.append("inner")

        async def outer() -> None:
            await guarded(t, inner())

        s = stop_once_started(t, started, "steer")
        with pytest.raises(StopRequested):
            await guarded(t, outer())
        await s
        assert cleaned == ["inner"]
        me = asyncio.current_task()
        assert me is not None and me.cancelling() == 0

    run(main())


def test_guards_of_several_tasks_all_end_on_one_stop() -> None:
    async def main() -> None:
        t = _turn()
        outcomes: list[str] = []

        async def one() -> None:
            try:
                await guarded(t, asyncio.sleep(30))
            except StopRequested:
                outcomes.append("stopped")

        tasks = [asyncio.ensure_future(one()) for _ in range(3)]
        await asyncio.sleep(0.01)
        t.request_stop("stop")
        await asyncio.gather(*tasks)
        assert outcomes == ["stopped"] * 3

    run(main())


def test_an_await_that_turns_the_stop_into_another_error_still_ends_as_stopped_and_the_next_turn_stops_too() -> None:
    """A library under the await may catch the cancellation and raise its own error: the turn
    still stops, and nothing of that stop stays on the drive's task, where the next turn's stop
    would otherwise meet a cancellation it did not ask for and end the whole drive."""
    class Wrapped(Exception):
        pass

    async def main() -> None:
        for reason in ("steer", "stop"):
            t = _turn()
            started = asyncio.Event()

            async def converting(started: asyncio.Event = started) -> None:
                started.set()
                try:
                    await asyncio.sleep(30)
                except asyncio.CancelledError as exc:
                    raise Wrapped("the stream was torn down") from exc

            s = stop_once_started(t, started, reason)
            with pytest.raises(StopRequested):
                await guarded(t, converting())
            await s
            me = asyncio.current_task()
            assert me is not None and me.cancelling() == 0

    run(main())



def test_a_stop_while_a_provider_loads_ends_the_wait_and_a_later_load_finds_the_model() -> None:
    """A provider's first use builds it in a thread (its SDK imported: seconds on a loaded
    machine). The turn's loop awaits that under its guard, so a Stop ends the turn while the build
    is still running (it was awaited unguarded, and a Stop waited for the import: past the stop's
    bounded wait on CI's loaded lane); a later load still gets the model."""
    import threading

    from cox_runner.model.providers import Models
    from coxswain.config import ModelConfig

    release = threading.Event()
    built = threading.Event()

    class Slow(Models):
        def _build(self, name: str) -> Any:
            release.wait(10)
            built.set()
            return f"model {name}"

    async def main() -> None:
        t = _turn()
        models = Slow(ModelConfig())
        started = asyncio.Event()

        async def load() -> Any:
            started.set()
            return await models.load("script")

        s = stop_once_started(t, started, "stop")
        with pytest.raises(StopRequested):
            await guarded(t, load())
        await s
        assert not built.is_set(), "the stop waited for the build"
        release.set()
        assert await models.load("script") == "model script"

    run(main())
