"""The stall watch reports a step that holds the event loop, says for how long and where, and
stays quiet while the loop only awaits."""

from __future__ import annotations

import asyncio
import time
from typing import Any


class Log:
    def __init__(self) -> None:
        self.seen: list[tuple[str, dict[str, Any]]] = []

    def warning(self, event: str, **kw: Any) -> None:
        self.seen.append((event, kw))


def a_blocking_parse() -> None:
    time.sleep(0.8)  # what a synchronous call on the loop does to every other task


async def run(work: Any) -> Log:
    from coxswain.stalls import StallWatch

    log = Log()
    watch = StallWatch(250, log)  # far above what a loaded 2-core machine delays a wakeup
    watch.start()
    await asyncio.sleep(0.05)
    await work()
    await asyncio.sleep(0.6)  # the loop beats again: the stall is reported whole
    await watch.stop()
    return log


def test_a_blocking_call_is_reported_with_its_length_and_its_place() -> None:
    async def work() -> None:
        a_blocking_parse()

    log = asyncio.run(run(work))
    assert [e for e, _ in log.seen] == ["loop.stalled"]
    kw = log.seen[0][1]
    assert 500 <= kw["ms"] <= 3000, kw["ms"]
    assert kw["threshold_ms"] == 250
    assert any("a_blocking_parse" in frame for frame in kw["where"]), kw["where"]


def test_awaiting_is_never_a_stall() -> None:
    async def work() -> None:
        for _ in range(30):
            await asyncio.sleep(0.01)

    assert asyncio.run(run(work)).seen == []


def test_a_blocking_sleep_is_named_blocked_and_not_cpu() -> None:
    async def work() -> None:
        a_blocking_parse()

    kw = asyncio.run(run(work)).seen[0][1]
    assert kw["blocked_ms"] >= 250, kw  # asleep in the kernel through most of it
    assert kw["cpu_ms"] < 200, kw


def test_a_busy_loop_is_named_by_its_cpu() -> None:
    def spin() -> None:
        end = time.thread_time() + 0.6  # 600 ms of this thread's own CPU, however loaded the machine
        while time.thread_time() < end:
            pass

    async def work() -> None:
        spin()

    kw = asyncio.run(run(work)).seen[0][1]
    assert kw["cpu_ms"] >= 500, kw
    assert kw["blocked_ms"] < 250, kw
    assert any("spin" in frame for frame in kw["where"]), kw["where"]
