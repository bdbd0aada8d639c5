"""The event loop held too long by one step: found, timed and located.

Every service runs one asyncio loop; a blocking call on it (a synchronous read, a CPU-heavy
parse, an import on first use, a full garbage collection) stops every session that process
serves, and on a runner can outlast a lease renewal. :class:`StallWatch` is a heartbeat the loop
beats every ``threshold / 4`` and a thread that looks at it as often: when the beat is older
than the threshold the thread takes the loop thread's stack at that moment (where it is stuck),
and once the loop beats again logs ``loop.stalled`` with how long it was held (``ms``) and that
stack (``where``, innermost last). ``loop_stall_ms`` (``COX_LOOP_STALL_MS``, default 1000; 0:
off) sets the threshold; the tests run a stack at 50 ms and fail on any report.

A starved process (more runnable processes than cores) is late too, without blocking. Each
report says which it was: ``cpu_ms`` is the CPU the loop's thread spent through the stall (a
parse, a loop, a collection: ours) and ``blocked_ms`` how long it was seen asleep in the kernel
(a synchronous read, sleep or lock: ours too); a stall with neither was the machine's (the thread
was runnable, waiting for a core). The tests fail only on the first two.
"""

from __future__ import annotations

import asyncio
import contextlib
import sys
import threading
import time
import traceback
from typing import Any


class StallWatch:
    def __init__(self, threshold_ms: int, log: Any) -> None:
        self.threshold_s = threshold_ms / 1000
        self.tick_s = min(0.25, max(0.005, self.threshold_s / 4))
        self.log = log
        self.beat_at = time.monotonic()
        self.beat_cpu = time.thread_time()
        self.stalls = 0
        self.worst_ms = 0.0
        self._loop_thread = threading.get_ident()
        self._loop_tid = threading.get_native_id()
        self._stop = threading.Event()
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """From the loop's own thread."""
        self._loop_thread = threading.get_ident()
        self._loop_tid = threading.get_native_id()
        self.beat_at, self.beat_cpu = time.monotonic(), time.thread_time()
        self._task = asyncio.get_running_loop().create_task(self._beat(), name="stall-watch")
        self._thread = threading.Thread(target=self._watch, name="stall-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, 1.0)

    async def _beat(self) -> None:
        while True:
            # The CPU first: a reader that sees the new beat_at sees its cpu too.
            self.beat_cpu = time.thread_time()
            self.beat_at = time.monotonic()
            await asyncio.sleep(self.tick_s)

    def _where(self) -> list[str]:
        frame = sys._current_frames().get(self._loop_thread)
        if frame is None:
            return []
        return [f"{f.filename}:{f.lineno} {f.name}" for f in traceback.extract_stack(frame)][-12:]

    def _asleep(self) -> bool:
        """Whether the loop's thread sleeps in the kernel now (S, D): a blocking call, not starvation."""
        try:
            with open(f"/proc/self/task/{self._loop_tid}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            return False
        return stat[stat.rfind(b")") + 2:][:1] in (b"S", b"D")

    def _watch(self) -> None:
        held_since: float | None = None
        held_cpu = 0.0
        asleep = 0
        where: list[str] = []
        while not self._stop.wait(self.tick_s):
            beat, cpu = self.beat_at, self.beat_cpu
            late = time.monotonic() - beat - self.tick_s  # the beat is due every tick
            if held_since is None:
                if late > self.threshold_s:
                    held_since, held_cpu, where = beat, cpu, self._where()
                    asleep = int(self._asleep())
                continue
            if beat <= held_since:
                asleep += self._asleep()
                continue
            # The loop ran again: report the whole stall.
            ms = (beat - held_since - self.tick_s) * 1000
            self.stalls += 1
            self.worst_ms = max(self.worst_ms, ms)
            self.log.warning("loop.stalled", ms=round(ms), threshold_ms=round(self.threshold_s * 1000),
                             cpu_ms=round((cpu - held_cpu) * 1000), blocked_ms=round(asleep * self.tick_s * 1000),
                             where=where)
            held_since, where, asleep = None, [], 0
