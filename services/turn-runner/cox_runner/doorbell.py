"""Doorbells: telling the runner that holds a session to look at it again.

Admission on any runner changes Redis first, then rings the holder (``cox.ctl.<runner_id>``, core
NATS, best effort); the holder re-reads what changed. A lost doorbell only delays a signal by one
renewal period: the lease keeper learns the same flags from every renewal.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Awaitable, Callable
from typing import Any

import redis.exceptions
from nats.aio.client import Client
from nats.errors import NoRespondersError

from coxswain import keys, subjects
from coxswain.errors import CoxError

from .leases import Leases

ASK_TIMEOUT_S = 5.0


class Doorbell:
    def __init__(self, nc: Client, runner_id: str, leases: Leases, redis: Any) -> None:
        self.nc = nc
        self.runner_id = runner_id
        self.leases = leases
        self.redis = redis
        self.on_drive: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        """``drive``: a turn admitted elsewhere starts here, where the session's programs run."""
        self.on_programs: Callable[[str, dict[str, Any]], Awaitable[None]] | None = None
        """``programs``: stop the session's programs here (Stop with ``programs``, a person's stop)."""

    async def ring(self, runner_id: Any, sid: str, kind: str, data: dict[str, Any] | None = None) -> None:
        """Tell the runner holding ``sid`` to look again (it also learns on its next renewal)."""
        if not runner_id:
            return
        if runner_id == self.runner_id:
            await self.answer(sid, kind, data)
            return
        with contextlib.suppress(Exception):
            body = {"sid": sid, "kind": kind, **({"data": data} if data is not None else {})}
            await self.nc.publish(subjects.control(str(runner_id)), json.dumps(body).encode())

    async def ask(self, runner_id: str, sid: str, kind: str, data: dict[str, Any]) -> bool:
        """Ring ``runner_id`` and wait for it to take the doorbell; False only when no such
        runner listens (NATS has no responder: it is gone). A reply that is late counts as
        taken (the runner may have acted on it): never False then."""
        if runner_id == self.runner_id:
            await self.answer(sid, kind, data)
            return True
        body = json.dumps({"sid": sid, "kind": kind, "data": data}).encode()
        try:
            await self.nc.request(subjects.control(runner_id), body, timeout=ASK_TIMEOUT_S)
        except NoRespondersError:
            return False
        except Exception:  # noqa: BLE001 - slow or a broken bus: it may have been taken
            return True
        return True

    async def answer(self, sid: str, kind: str, data: dict[str, Any] | None = None) -> None:
        """A doorbell for a session this runner holds: re-read what changed."""
        if kind == "drive" and self.on_drive is not None:
            await self.on_drive(sid, data or {})
            return
        if kind == "programs" and self.on_programs is not None:
            await self.on_programs(sid, data or {})
            return
        d = self.leases.get(sid)
        if d is None:
            return
        if kind == "observe":
            # Kept for the next turn too: between two turns the drive's turn is the one that
            # ended (or none), and the call that starts the next may have said none waited.
            d.observe_rung = True
            if d.turn is not None:
                d.turn.observed_waiting = True
                d.turn.ring()
            return
        if d.turn is None:
            if kind in ("stop", "steer"):
                d.stop_rung = True  # between turns: the next turn of this drive reads the flag
            return
        t = d.turn
        if kind in ("stop", "steer"):
            with contextlib.suppress(CoxError, OSError, redis.exceptions.RedisError):
                stop = await self.redis.hget(keys.session(sid), "stop")
                if stop:
                    t.request_stop(stop)
        elif kind == "lead":
            t.lead_rang(str((data or {}).get("lead_id") or ""))
        else:
            t.ring()
