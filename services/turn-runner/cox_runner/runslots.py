"""This runner's side of the stack's run slots: ``[runs] max_active`` run turns at once.

The slots are a semaphore in Redis (``cox_run_slots``, keys :data:`coxswain.keys.RUN_SLOTS`):
each held slot is a member ``runner|sid|token`` leased like a session (it lapses unless renewed
within ``[runner] lease_ms``), so a runner that dies frees its slots by itself, and the lease's
token fences it (a takeover's turn waits for a slot of its own). A run turn asks for a slot before
its first model request and frees it when it ends; over the bound it waits, in order, and never
fails. An interactive turn never asks: it starts in the call that admits it.

One call per runner carries everything: the slots it holds (renewed), those it frees and the run
turns of it that wait (the first ``max_active`` of them asked for, first come first served). It is
made every renewal period while slots are held, and every :data:`WAIT_POLL_S` while a run turn
waits (or at once on a change).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import Any

from coxswain.config import Settings
from coxswain.errors import logged

from .redis.store import Store, as_list

WAIT_POLL_S = 0.2
"""How often a runner with waiting run turns asks again for a slot."""


class RunSlots:
    def __init__(self, store: Store, settings: Settings, runner: str, log: Any) -> None:
        self.store = store
        self.settings = settings
        self.runner = runner
        self.log = log
        self._held: dict[str, str] = {}
        """sid -> member: the slots this runner holds."""
        self._waiting: dict[str, tuple[str, asyncio.Future[None]]] = {}
        """sid -> (member, granted): the run turns of this runner waiting for a slot, in order."""
        self._freed: list[str] = []
        self._wake = asyncio.Event()

    def member(self, sid: str, token: str) -> str:
        return f"{self.runner}|{sid}|{token}"

    @property
    def held(self) -> int:
        return len(self._held)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def acquire(self, sid: str, token: str) -> None:
        """Wait until this session's run turn holds a slot (cancellable: Stop, shutdown)."""
        if sid in self._held:
            return
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiting[sid] = (self.member(sid, token), fut)
        self._wake.set()
        try:
            await fut
        except BaseException:
            self._waiting.pop(sid, None)
            if fut.done() and not fut.cancelled():
                self.release(sid)
            raise

    def release(self, sid: str) -> None:
        """The run turn ended: its slot goes back at the next call (made at once)."""
        m = self._held.pop(sid, None)
        if m is not None:
            self._freed.append(m)
            self._wake.set()

    async def run(self) -> None:
        """The loop: one call a renewal period while slots are held, faster while turns wait."""
        renew_s = self.settings.runner.renew_every_ms / 1000
        loop = asyncio.get_running_loop()
        last = 0.0
        while True:
            now = loop.time()
            if self._waiting or self._freed or (self._held and now - last >= renew_s):
                try:
                    await self._call()
                    last = now
                except asyncio.CancelledError:
                    raise
                except Exception as exc:  # noqa: BLE001 - Redis down: the slots lapse, the turns wait
                    self.log.warning("run_slots.failed", error=logged(exc), held=len(self._held),
                                     waiting=len(self._waiting))
                    await self.store.drop_idle()
            self._wake.clear()
            timeout = WAIT_POLL_S if self._waiting else renew_s
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), timeout)

    async def _call(self) -> None:
        freed, self._freed = self._freed, []
        # Only the first max_active waiting turns can be granted by one call (in order: a grant
        # stops at the first that is not), so only they are asked for; a sweep that queues a
        # thousand run turns here would otherwise send them all, a ZSCORE each in Redis, at every
        # slot freed. A turn granted by a call whose reply was lost is among them: every turn
        # before it was granted in that call too, or earlier.
        waiting = list(itertools.islice(self._waiting.items(), self.settings.runs.max_active))
        entries = [*(f"-{m}" for m in freed), *(f"+{m}" for m in self._held.values()),
                   *(f"?{m}" for _, (m, _) in waiting)]
        try:
            res = await self.store.fns.run_slots(runner=self.runner, max_active=self.settings.runs.max_active,
                                                 lease_ms=self.settings.runner.lease_ms, entries=entries)
        except BaseException:
            self._freed = freed + self._freed  # freed again with the next call
            raise
        granted = set(as_list(res.get("granted")))
        for sid, (m, fut) in waiting:
            if m not in granted:
                continue
            if self._waiting.get(sid, (None,))[0] == m and not fut.done():
                del self._waiting[sid]
                self._held[sid] = m
                fut.set_result(None)
            else:  # it stopped waiting meanwhile: give the slot back
                self._freed.append(m)
                self._wake.set()
        if granted:
            self.log.info("run_slots.granted", granted=len(granted), active=res.get("active"),
                          waiting=len(self._waiting))
