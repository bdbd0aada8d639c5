"""Doorbells: telling the runner that holds a session to look at it again.

Admission on any runner changes Redis first, then rings the holder (``cox.ctl.<runner_id>``, core
NATS, best effort); the holder re-reads what changed. A lost doorbell only delays a signal by one
renewal period: the lease keeper learns the same flags from every renewal.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import redis.exceptions
from nats.aio.client import Client

from coxswain import keys, subjects
from coxswain.errors import CoxError

from .leases import Leases


class Doorbell:
    def __init__(self, nc: Client, runner_id: str, leases: Leases, redis: Any) -> None:
        self.nc = nc
        self.runner_id = runner_id
        self.leases = leases
        self.redis = redis

    async def ring(self, runner_id: Any, sid: str, kind: str) -> None:
        """Tell the runner holding ``sid`` to look again (it also learns on its next renewal)."""
        if not runner_id:
            return
        if runner_id == self.runner_id:
            await self.answer(sid, kind)
            return
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.control(str(runner_id)), json.dumps({"sid": sid, "kind": kind}).encode())

    async def answer(self, sid: str, kind: str) -> None:
        """A doorbell for a session this runner holds: re-read what changed."""
        d = self.leases.get(sid)
        if d is None or d.turn is None:
            return
        t = d.turn
        if kind in ("stop", "steer"):
            with contextlib.suppress(CoxError, OSError, redis.exceptions.RedisError):
                stop = await self.redis.hget(keys.session(sid), "stop")
                if stop:
                    t.request_stop(stop)
        elif kind == "lead":
            t.leads_waiting = True
            t.ring()
        elif kind == "observe":
            t.observed_waiting = True
            t.ring()
        else:
            t.ring()
