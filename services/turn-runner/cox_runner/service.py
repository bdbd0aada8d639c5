"""The turn-runner process: admission endpoints, the drives it holds, and three loops.

- lease keeper: renews every lease this runner holds (one pipeline per period); a refused
  renewal or a missed deadline cancels that drive, so a paused runner stops itself.
- claimer: takes over sessions whose lease expired (their runner died) and ends the dead turn
  ``crashed`` before going on with the queue in order.
- sweeper: publishes outboxes whose publisher died.

Shutdown (SIGTERM): stop taking requests, ask running turns to end (``canceled``), hand the
sessions with waiting messages to another runner, wait (bounded), then cancel what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from typing import Any

import redis.exceptions
from nats.aio.msg import Msg
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from coxswain import eventlog, keys, rpc, subjects
from coxswain.config import Settings
from coxswain.errors import CoxError
from coxswain.ids import new_id
from coxswain.service import Service

from . import drive as drives_mod
from .admission import Admission
from .clients import Clients
from .deps import Deps
from .errors import StopRequested
from .forks import Forks
from .leases import Drive, Leases
from .model.providers import Models
from .queue_ops import QueueOps
from .redis.archive import Archiver
from .redis.faults import DropReplies
from .redis.store import Store
from .workspace import limits
from .workspace.sandbox import Sandbox

SHUTDOWN_GRACE_S = 8.0
INFRA_CHECK_S = 0.2
"""How long one look at the services' health serves every drive that asks."""
LOG_LIMIT = 10_000_000
STORE_RETRY_MAX_S = 10.0


def store_retry_s(settings: Settings) -> float:
    """How long a Redis call whose connection broke is retried: half the lease (a turn's holder
    then still has time to go on before its own deadline), at most ``STORE_RETRY_MAX_S``, well
    inside the time Redis keeps a transition's reply (``keys.TX_KEEP_MS``)."""
    return min(settings.runner.lease_ms / 2000, STORE_RETRY_MAX_S)


class Runner(Service):
    name = subjects.RUNNER
    uses_redis = True
    records_meta = True

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.runner_id = new_id("r")
        self.owner = self.runner_id
        self.log = self.log.bind(runner=self.runner_id)
        self.leases = Leases(self.log)
        self.models = Models(settings.model)
        self.sandbox = Sandbox(settings.sandbox, settings.store_dir)
        self._infra_suspect = False
        self._infra_checked: tuple[float, str | None] | None = None
        self._needed = (subjects.GUARD, subjects.VERSIONS) + (
            (subjects.JUDGE,) if settings.approval.commands == "judge" else ())

    async def start(self) -> None:
        # Never let the client resend a call whose connection broke: a transition may have run.
        # The store retries it itself, with the call's transition id (see store.py).
        self.redis.set_retry(Retry(NoBackoff(), 0))
        self.js = self.nc.jetstream()
        await eventlog.ensure_stream(self.js, self.settings.nats.stream_replicas)
        self.store = Store(self.redis, self.js, self.owner, self.log, wait_replicas=self.settings.redis.wait_replicas,
                           wait_ms=self.settings.redis.wait_ms, retry_s=store_retry_s(self.settings),
                           on_down=self.redis_failed, faults=DropReplies.from_env(os.environ, self.log))
        await self.store.load()
        await self._check_durability()
        await self._check_sandbox()
        self.clients = Clients(self.nc, self.settings)
        self.deps = Deps(
            settings=self.settings, log=self.log, redis=self.redis, store=self.store, clients=self.clients,
            models=self.models, sandbox=self.sandbox, owner=self.owner, leases=self.leases,
            read_events=self.read_events, ensure_lease=self.ensure_lease, redis_failed=self.redis_failed,
            stopping=lambda: self.stopping, ring=self.ring, start_drive=self.start_drive, finish_op=self.finish_op,
            infra_failed=self.infra_failed, services_missing=self.services_missing, usage_seen=self.usage_seen,
        )
        self.admission = Admission(self.deps)
        self.archiver = Archiver(self.settings, self.store, self.js, self.log, self.owner)
        await self.archiver.start()
        a = self.admission
        q = QueueOps(self.deps)
        # A session's request that finds no session loads it back from the archive, and runs again.
        on = self.archiver.reloading
        await self.endpoint(rpc.RUNNER_CREATE, a.create)
        await self.endpoint(rpc.RUNNER_PATCH, on(a.patch))
        await self.endpoint(rpc.RUNNER_SEND, on(a.send))
        await self.endpoint(rpc.RUNNER_LEAD, on(a.lead))
        await self.endpoint(rpc.RUNNER_STOP, on(a.stop))
        await self.endpoint(rpc.RUNNER_ANSWER, on(a.answer))
        await self.endpoint(rpc.RUNNER_OBSERVE, on(a.observe))
        await self.endpoint(rpc.RUNNER_RESTORE, on(a.restore))
        await self.endpoint(rpc.RUNNER_UNDO, on(a.undo))
        await self.endpoint(rpc.RUNNER_COMPACT, on(a.compact))
        await self.endpoint(rpc.RUNNER_QUEUE_REMOVE, on(q.remove))
        await self.endpoint(rpc.RUNNER_QUEUE_ORDER, on(q.order))
        await self.endpoint(rpc.RUNNER_WORKSPACES, q.workspaces)
        forks = Forks(a)
        await self.endpoint(rpc.RUNNER_FORK, on(forks.fork))
        await self.endpoint(rpc.RUNNER_REWIND, on(forks.rewind))
        self._ctl = await self.nc.subscribe(subjects.control(self.runner_id), cb=self._on_control)
        rc = self.settings.runner
        self.spawn(self._every(rc.renew_every_ms / 1000, self._renew), "lease-keeper", critical=True)
        self.spawn(self._every(rc.claim_interval_ms / 1000, self._claim), "claimer", critical=True)
        self.spawn(self._every(1.0, self._sweep), "outbox-sweeper", critical=True)
        self.spawn(self._every(1.0, limits.of(self.sandbox).reap), "orphan-reaper", critical=True)
        if self.settings.sessions.idle_days > 0:
            self.spawn(self._every(self.settings.sessions.archive_every_s, self._archive), "archiver", critical=True)

    async def _check_durability(self) -> None:
        """The queue is only as durable as Redis: say so when it does not fsync every write."""
        try:
            cfg = await self.redis.config_get("append*")
        except redis.exceptions.ResponseError:  # CONFIG renamed or refused (a managed Redis)
            return
        if cfg.get("appendonly") != "yes" or cfg.get("appendfsync") != "always":
            self.log.warning("redis.not_durable", appendonly=cfg.get("appendonly"), appendfsync=cfg.get("appendfsync"),
                             detail="a message answered 202 may be lost if Redis dies; run it with "
                                    "--appendonly yes --appendfsync always")

    async def _check_sandbox(self) -> None:
        """Probe the command sandbox once at start and say loudly when commands are not confined."""
        status = await self.sandbox.probe()
        if status.mode == "none":
            self.log.warning("sandbox.off", detail="[sandbox] mode = \"none\": commands run WITHOUT a sandbox, "
                                                   "as this process's user, with its file and network access")
        elif not status.available:
            self.log.error("sandbox.unavailable", reason=status.reason,
                           detail="every command is refused until the sandbox can start")
        else:
            self.log.info("sandbox.ready", mode=status.mode, network=self.settings.sandbox.network)
        lim = await asyncio.to_thread(limits.of(self.sandbox).probe)
        (self.log.info if lim.cgroups != "off" else self.log.warning)(
            "sandbox.limits", **lim.as_dict(self.settings.sandbox),
            **({"detail": "cgroups are off: only rlimits bound a command (no pids or memory bound)"}
               if lim.cgroups == "off" else {}))

    async def health(self) -> dict[str, Any]:
        await self.redis.ping()
        return {"runner": self.runner_id, "drives": len(self.leases), "turns_started": self.leases.turns_started,
                "sandbox": {**self.sandbox.status().as_dict(),
                            "limits": limits.of(self.sandbox).status().as_dict(self.settings.sandbox)}}

    # ------------------------------------------------------------------ drives
    def start_drive(self, d: Drive) -> None:
        self.leases.hold(d)
        d.task = self.spawn(drives_mod.run_drive(self.deps, d), f"drive:{d.sid}")

    async def finish_op(self, d: Drive) -> None:
        """End a person's write: release the session, or run what was queued meanwhile."""
        nxt = await drives_mod.turn_end_call(self.deps, d, "", "", may_hold=False)
        if nxt is not None:
            self.start_drive(Drive(sid=d.sid, token=d.token, first=nxt))

    async def redis_failed(self) -> None:
        """Redis failed a call: drop the idle pooled connections, so that once it is back (a
        restart) no call goes out on a socket the old server closed (a retry would fail on it
        for nothing, see store.py)."""
        with contextlib.suppress(Exception):
            await self.redis.connection_pool.disconnect(inuse_connections=False)

    async def ensure_lease(self, sid: str, token: str, call_id: str = "", intent: str = "") -> None:
        """Raise LeaseLost unless this runner still holds ``sid``; record a staged write's intent."""
        await drives_mod.ensure_lease(self.deps, sid, token, call_id, intent)

    async def usage_seen(self, sample: dict[str, Any]) -> None:
        """One model request's usage, for the gateways' ``/metrics`` (core NATS, best effort)."""
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.USAGE_METRICS, json.dumps(sample).encode())

    # ------------------------------------------------------------------ the services a turn needs
    def infra_failed(self) -> None:
        """A turn met a service or the bus unavailable: look before starting the next turn."""
        self._infra_suspect = True

    async def services_missing(self) -> str | None:
        """What a turn needs that does not answer now (the bus, guard, versions, the judge when
        commands go to it), or None. Cheap while nothing has failed: only the bus's state is
        looked at; after a failure each service's health is asked (shared for a moment by every
        drive asking at once)."""
        if not self.nc.is_connected:
            self._infra_suspect = True
            return "the message bus"
        if not self._infra_suspect:
            return None
        now = time.monotonic()
        if self._infra_checked is not None and now - self._infra_checked[0] < INFRA_CHECK_S:
            return self._infra_checked[1]
        missing: str | None = None
        for svc in self._needed:
            try:
                await rpc.call(self.nc, rpc.HEALTH[svc], rpc.NoRequest())
            except CoxError:
                missing = svc
                break
        self._infra_checked = (time.monotonic(), missing)
        if missing is None:
            self._infra_suspect = False
        return missing

    async def read_events(self, sid: str) -> list[dict[str, Any]]:
        """The session's whole log, at least up to the last event recorded when called.

        Events are recorded in Redis first and published after, so the outbox is flushed and the
        log read until it holds that seq: a turn never starts from a partial transcript. While
        NATS is down this waits (retrying) rather than run on what it has; Stop still ends it.
        """
        target = int(await self.redis.hget(keys.session(sid), "seq") or 0)
        out: list[dict[str, Any]] = []
        pause = 0.05
        while True:
            d = self.leases.get(sid)
            if d is not None and d.turn is not None and d.turn.stopping:
                raise StopRequested(d.turn.stop_reason or "stop")
            try:
                await self.store.flush(sid, timeout=2.0)
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

    # ------------------------------------------------------------------ doorbells
    async def ring(self, runner_id: Any, sid: str, kind: str) -> None:
        """Tell the runner holding ``sid`` to look again (it also learns on its next renewal)."""
        if not runner_id:
            return
        if runner_id == self.runner_id:
            await drives_mod.ring_local(self.deps, sid, kind)
            return
        with contextlib.suppress(Exception):
            await self.nc.publish(subjects.control(str(runner_id)), json.dumps({"sid": sid, "kind": kind}).encode())

    async def _on_control(self, msg: Msg) -> None:
        try:
            data = json.loads(msg.data)
            await drives_mod.ring_local(self.deps, str(data["sid"]), str(data.get("kind", "")))
        except Exception as exc:  # noqa: BLE001 - a bad doorbell is logged, never fatal
            self.log.warning("control.bad_message", error=repr(exc))

    # ------------------------------------------------------------------ loops
    async def _every(self, period: float, fn: Any) -> None:
        # Not only cancellation ends it: redis-py's cluster pipeline can swallow a cancellation
        # that arrives while it waits for a node (the loop then ran on, and stop waited for it).
        while not self.stopping:
            try:
                await fn()
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - Redis/NATS hiccups must not kill the loop
                self.log.warning("loop.error", loop=fn.__name__, error=repr(exc))
                if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
                    await self.redis_failed()
            await asyncio.sleep(period)

    async def _renew(self) -> None:
        await drives_mod.renew_all(self.deps)

    async def _claim(self) -> None:
        if self.stopping:
            return
        sent = time.monotonic()
        rc = self.settings.runner
        # Every bucket is looked at within a quarter of a lease: a pass takes its share, not all.
        share = max(1, rc.lease_ms // 4 // rc.claim_interval_ms)
        claims = await self.store.claim(runner=self.runner_id, lease_ms=rc.lease_ms, limit=20, share=share)
        for c in claims:
            sid = str(c["sid"])
            self.log.warning("lease.claimed", sid=sid, turn_id=c.get("turn_id"), old_runner=c.get("old_runner"),
                             token=c.get("token"))
            self.start_drive(Drive(sid=sid, token=str(c["token"]), crashed=c, acquired=sent))

    async def _sweep(self) -> None:
        await self.store.sweep()

    async def _archive(self) -> None:
        if not self.stopping:
            await self.archiver.run_pass()

    # ------------------------------------------------------------------ shutdown
    async def before_cancel(self) -> None:
        with contextlib.suppress(Exception):
            await self._ctl.unsubscribe()
        for d in self.leases:
            d.shutting_down = True
            if d.turn is not None:
                d.turn.request_stop("shutdown")
        tasks = [d.task for d in self.leases if d.task is not None]
        if tasks:
            await asyncio.wait(tasks, timeout=SHUTDOWN_GRACE_S)
        await self.store.close()


def main() -> None:
    from coxswain.service import run

    run(Runner, subjects.RUNNER)
