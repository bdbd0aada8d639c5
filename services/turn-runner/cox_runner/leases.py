"""The leases this runner holds: one :class:`Drive` per session, owned by :class:`Leases`.

A drive is this runner holding a session's lease (its fencing token) and running its turns one
after another, or a person's operation (restore, undo, ``!command``) on an idle session. The
drive keeps a local deadline (the time it sent its last successful renewal plus most of the
lease): when it passes without a renewal the drive cancels itself, before anyone can claim the
session. :class:`Leases` is the one place drives are added and removed.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from coxswain.errors import Fenced

from .errors import LeaseLost
from .turn import TAKEN_KEPT, Turn

if TYPE_CHECKING:
    from . import transcript
    from .redis.fns import Fns

DEADLINE_SHARE = 0.9
"""A drive stops itself this far into a lease it could not renew, before anyone can claim it."""


@dataclass
class Drive:
    sid: str
    token: str
    first: dict[str, Any] | None = None
    """The message to run first: {message_id, text, mode, turn_id}."""
    crashed: dict[str, Any] | None = None
    """A claimed session's dead turn: {turn_id, open: [call_id, name, ...], old_runner}."""
    turn: Turn | None = None
    history: transcript.Builder | None = None
    """The transcript as the last turn left it, for the next turn of this drive."""
    files: transcript.AttachmentFiles | None = None
    """Where the last turn's transcript took attachments from (kept with it when the drive ends)."""
    task: asyncio.Task[None] | None = None
    acquired: float = field(default_factory=time.monotonic)
    """When the lease was (at the latest) set or last renewed, on this process's monotonic clock."""
    deadline: float = 0.0
    shutting_down: bool = False
    stop_rung: bool = False
    """A Stop or steer doorbell came while no turn of this drive ran (its next turn reads the flag)."""
    observe_rung: bool = False
    """An observation's doorbell came since this drive's last turn began: the next turn's first
    result reads the list, whatever the call that starts it said (:func:`cox_runner.drive.observed_at_start`)."""
    leads_taken: deque[str] = field(default_factory=lambda: deque(maxlen=TAKEN_KEPT))
    """The Leads this drive's turns took (:attr:`cox_runner.turn.Turn.leads_taken`)."""
    self_fence: bool = True
    mcp: Any = None
    """The session's MCP servers while this drive holds it (:mod:`cox_runner.workspace.mcp_servers`)."""
    _timer: asyncio.TimerHandle | None = None
    _on_expire: Any = None

    def arm(self, lease_ms: int, sent: float, on_expire: Any = None) -> None:
        """The lease was set by a call sent at ``sent``: stop by ``sent`` + most of the lease."""
        if on_expire is not None:
            self._on_expire = on_expire
        self.deadline = sent + lease_ms / 1000 * DEADLINE_SHARE
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if not self.self_fence:
            return
        loop = asyncio.get_running_loop()
        # time.monotonic and the loop clock are the same clock in CPython's default loops;
        # translate anyway so a custom loop clock cannot skew the deadline.
        when = loop.time() + (self.deadline - time.monotonic())
        self._timer = loop.call_at(when, self._expire)

    def disarm(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None

    def _expire(self) -> None:
        # Only the current timer fires (arm cancels the one before), so this is the deadline:
        # no comparison with time.monotonic(), which uvloop's cached clock may trail by a few ms.
        self._timer = None
        if self._on_expire is not None:
            self._on_expire(self)
        cancel(self)


def cancel(d: Drive) -> None:
    if d.task is not None and not d.task.done():
        d.task.cancel()


class Leases:
    """The drives of this runner, by session. Replacing a session's drive cancels the old one."""

    def __init__(self, log: Any) -> None:
        self.log = log
        self._by_sid: dict[str, Drive] = {}
        self.turns_started = 0
        """Turns this runner has started (for health and metrics)."""

    def get(self, sid: str) -> Drive | None:
        return self._by_sid.get(sid)

    def hold(self, d: Drive) -> None:
        """``d`` now holds its session here; a drive that held it before is fenced off and stopped
        (this runner took the session again, e.g. after its old drive stalled past the lease)."""
        old = self._by_sid.get(d.sid)
        if old is not None and old is not d:
            self.log.warning("drive.replaced", sid=d.sid, old_token=old.token, token=d.token)
            cancel(old)
        self._by_sid[d.sid] = d

    def release(self, d: Drive) -> None:
        """``d`` no longer holds its session (a newer drive of the same session stays)."""
        if self._by_sid.get(d.sid) is d:
            del self._by_sid[d.sid]

    def active(self) -> list[Drive]:
        """The drives whose task still runs (or that have none: a person's operation)."""
        return [d for d in self._by_sid.values() if d.task is None or not d.task.done()]

    async def ensure(self, fns: Fns, sid: str, token: str, call_id: str = "", intent: str = "") -> None:
        """Raise :class:`LeaseLost` unless this runner still holds ``sid`` under ``token``.

        For a side effect Redis cannot fence (writing a file): checked just before it, against the
        local deadline and against Redis (``fns.fence``). With ``intent`` (a staged write), Redis
        records it under the same check, so that whoever takes the session over settles it
        (:func:`cox_runner.drive._settle_writes`).
        """
        d = self.get(sid)
        if d is None or d.token != token or (d.self_fence and time.monotonic() >= d.deadline):
            raise LeaseLost("the lease is past its deadline or no longer held")
        try:
            await fns.fence(sid=sid, token=token, call_id=call_id, intent=intent)
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc

    def __iter__(self) -> Iterator[Drive]:
        return iter(list(self._by_sid.values()))

    def __len__(self) -> int:
        return len(self._by_sid)
