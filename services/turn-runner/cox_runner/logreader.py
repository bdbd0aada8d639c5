"""Reading a session's whole log: the outbox flushed, then JetStream read up to the last event."""

from __future__ import annotations

import asyncio
from typing import Any

import redis.exceptions
from nats.js import JetStreamContext

from coxswain import eventlog, keys

from .errors import StopRequested
from .leases import Leases
from .redis.store import Store

LOG_LIMIT = 10_000_000


class LogReader:
    def __init__(self, redis: Any, store: Store, js: JetStreamContext, leases: Leases, log: Any) -> None:
        self.redis = redis
        self.store = store
        self.js = js
        self.leases = leases
        self.log = log

    async def read(self, sid: str, through: int | None = None) -> list[dict[str, Any]]:
        """The session's whole log, at least up to the last event recorded when called (or up to
        seq ``through``, when the caller knows it: no read of the session's seq then).

        Events are recorded in Redis first and published after, so the outbox is flushed and the
        log read until it holds that seq: a turn never starts from a partial transcript. While
        NATS is down this waits (retrying) rather than run on what it has; Stop still ends it.
        """
        target = through if through is not None else int(await self.redis.hget(keys.session(sid), "seq") or 0)
        out: list[dict[str, Any]] = []
        pause = 0.05
        while True:
            d = self.leases.get(sid)
            if d is not None and d.turn is not None and d.turn.stopping:
                raise StopRequested(d.turn.stop_reason or "stop")
            try:
                await self.store.outbox.flush(sid, timeout=2.0)
                out.extend(await eventlog.backlog(self.js, sid, out[-1]["seq"] if out else 0, target,
                                                  limit=LOG_LIMIT, timeout=2.0))
                if (out[-1]["seq"] if out else 0) >= target:
                    return out
                self.log.warning("log.behind", sid=sid, have=out[-1]["seq"] if out else 0, want=target)
            except (asyncio.CancelledError, StopRequested):
                raise
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError):
                raise
            except Exception as exc:  # noqa: BLE001 - NATS down or restarting: wait for it
                self.log.warning("log.unreadable", sid=sid, error=repr(exc))
            await asyncio.sleep(pause)
            pause = min(1.0, pause * 2)
