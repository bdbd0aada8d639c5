"""The turn-runner process: admission endpoints, the drives it holds, and three loops.

- lease keeper: renews every lease this runner holds (one pipeline per period); a refused
  renewal or a missed deadline cancels that drive, so a paused runner stops itself.
- claimer: takes over sessions whose lease expired (their runner died) and ends the dead turn
  ``crashed`` before going on with the queue in order.
- sweeper: publishes outboxes whose publisher died.

SIGHUP reloads ``[limits]`` from the config (the file and the environment, as at start) and
resumes the sessions a daily budget paused whose budget is now raised (docs/api.md, "Budgets").

Shutdown (SIGTERM): stop taking requests, ask running turns to end (``canceled``), hand the
sessions with waiting messages to another runner, wait (bounded), then cancel what is left.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from typing import Any

import redis.exceptions
from nats.aio.msg import Msg
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

from coxswain import config, eventlog, rpc, subjects
from coxswain.config import Settings
from coxswain.errors import logged
from coxswain.ids import new_id
from coxswain.service import Service

from . import drive as drives_mod
from . import programs as programs_mod
from .admission import Admission, resume_all
from .clients import Clients
from .deps import Deps
from .doorbell import Doorbell
from .forks import Forks
from .health import Health
from .leases import Drive, Leases
from .logreader import LogReader
from .model.providers import Models
from .programs import Programs
from .queue_ops import QueueOps
from .redis.archive import Archiver
from .redis.faults import DropReplies
from .redis.store import Store
from .runs import Runs
from .runslots import RunSlots
from .workspace import limits
from .workspace.mcp_servers import load_sdk
from .workspace.sandbox import Sandbox

SHUTDOWN_GRACE_S = 8.0
STORE_RETRY_MAX_S = 10.0
SWEEP_EVERY_MS = 1000
"""The stack's outbox sweeper pass: one a second, by whichever runner comes first (Store.sweep)."""


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
        self.home_id = self.runner_id  # the subjects of its own its sessions' requests come to (rpc.Op.home)
        self.log = self.log.bind(runner=self.runner_id)
        self.leases = Leases(self.log)
        self.models = Models(settings.model)
        self.sandbox = Sandbox(settings.sandbox, settings.store_dir)

    async def start(self) -> None:
        # Never let the client resend a call whose connection broke: a transition may have run.
        # The store retries it itself, with the call's transition id (see store.py).
        self.redis.set_retry(Retry(NoBackoff(), 0))
        self.js = self.nc.jetstream()
        await eventlog.ensure_stream(self.js, self.settings.nats.stream_replicas)
        self.store = Store(self.redis, self.js, self.owner, self.log, wait_replicas=self.settings.redis.wait_replicas,
                           wait_ms=self.settings.redis.wait_ms, retry_s=store_retry_s(self.settings),
                           faults=DropReplies.from_env(os.environ, self.log))
        await self.store.load()
        await self._check_durability()
        await self._check_sandbox()
        if self.settings.mcp.enabled():
            await load_sdk()  # before serving: its import would hold the loop (and the leases)
        self.clients = Clients(self.nc, self.settings)
        self.doorbell = Doorbell(self.nc, self.runner_id, self.leases, self.redis)
        self.deps = Deps(
            settings=self.settings, log=self.log, redis=self.redis, store=self.store, clients=self.clients,
            models=self.models, sandbox=self.sandbox, owner=self.owner, leases=self.leases,
            events=LogReader(self.redis, self.store, self.js, self.leases, self.log,
                             kept=self.settings.runner.transcripts_kept), doorbell=self.doorbell,
            health=Health(self.nc, self.settings), process=self,
            run_slots=RunSlots(self.store, self.settings, self.runner_id, self.log),
        )
        self.programs = Programs(self.deps)
        self.deps.programs = self.programs
        self.doorbell.on_drive = self._drive_here
        self.doorbell.on_programs = self._stop_programs
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
        await self.endpoint(rpc.RUNNER_ATTACH, on(a.attachments.attach))
        await self.endpoint(rpc.RUNNER_LEAD, on(a.lead))
        await self.endpoint(rpc.RUNNER_STOP, on(a.stop))
        await self.endpoint(rpc.RUNNER_ANSWER, on(a.answer))
        await self.endpoint(rpc.RUNNER_OBSERVE, on(a.observe))
        await self.endpoint(rpc.RUNNER_PROGRAM_STOP, on(a.program_stop))
        await self.endpoint(rpc.RUNNER_RESTORE, on(a.restore))
        await self.endpoint(rpc.RUNNER_UNDO, on(a.undo))
        await self.endpoint(rpc.RUNNER_COMPACT, on(a.compact))
        await self.endpoint(rpc.RUNNER_QUEUE_REMOVE, on(q.remove))
        await self.endpoint(rpc.RUNNER_QUEUE_ORDER, on(q.order))
        await self.endpoint(rpc.RUNNER_WORKSPACES, q.workspaces)
        forks = Forks(a)
        await self.endpoint(rpc.RUNNER_FORK, on(forks.fork))
        await self.endpoint(rpc.RUNNER_REWIND, on(forks.rewind))
        runs = Runs(a, self.archiver.reload)
        await self.endpoint(rpc.RUNNER_RUN, runs.create)
        await self.endpoint(rpc.RUNNER_CHECK, on(runs.check))
        self._ctl = await self.nc.subscribe(subjects.control(self.runner_id), cb=self._on_control)
        rc = self.settings.runner
        self.spawn(self._every(rc.renew_every_ms / 1000, self._renew), "lease-keeper", critical=True)
        self.spawn(self._every(rc.claim_interval_ms / 1000, self._claim), "claimer", critical=True)
        self.spawn(self._every(SWEEP_EVERY_MS / 1000, self._sweep), "outbox-sweeper", critical=True)
        self.spawn(self.deps.run_slots.run(), "run-slots", critical=True)
        self.spawn(self._every(1.0, limits.of(self.sandbox).reap), "orphan-reaper", critical=True)
        self.spawn(self._every(self.settings.attachments.collect_every_s, a.attachments.collect),
                   "attachment-collector", critical=True)
        self.spawn(self._every(programs_mod.TICK_S, self.programs.books.tick), "programs", critical=True)
        if self.settings.sessions.idle_days > 0:
            self.spawn(self._every(self.settings.sessions.archive_every_s, self._archive), "archiver", critical=True)
        asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, lambda: self.spawn(self.reload(), "reload"))

    async def reload(self) -> None:
        """SIGHUP: read ``[limits]`` again (turns that start from now on use it; a running turn
        keeps the limits it started with) and resume the paused sessions whose daily budget is
        now above what they spent (docs/api.md, "Budgets"). A config that does not load changes
        nothing (logged)."""
        try:
            fresh = await asyncio.to_thread(config.load)
        except Exception as exc:  # noqa: BLE001 - a bad file keeps the running settings
            self.log.error("config.reload_failed", error=logged(exc))
            return
        self.settings.limits = fresh.limits
        self.log.info("config.reloaded", session_spend=fresh.limits.session_spend,
                      principal_spend=fresh.limits.principal_spend)
        resumed = await resume_all(self.deps, "reload")
        self.log.info("budget.reload_resumed", sessions=resumed)

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
                "transcripts": {"kept": self.deps.events.kept, "folded": self.deps.events.folded,
                                "first": self.deps.events.first},
                "run_slots": {"held": self.deps.run_slots.held, "waiting": self.deps.run_slots.waiting},
                "sandbox": {**self.sandbox.status().as_dict(),
                            "limits": limits.of(self.sandbox).status().as_dict(self.settings.sandbox)}}

    # ------------------------------------------------------------------ doorbells
    async def _on_control(self, msg: Msg) -> None:
        try:
            data = json.loads(msg.data)
            extra = data.get("data")
            await self.doorbell.answer(str(data["sid"]), str(data.get("kind", "")),
                                       extra if isinstance(extra, dict) else None)
            if msg.reply:  # Doorbell.ask waits for it
                await msg.respond(b"ok")
        except Exception as exc:  # noqa: BLE001 - a bad doorbell is logged, never fatal
            self.log.warning("control.bad_message", error=logged(exc))

    async def _drive_here(self, sid: str, data: dict[str, Any]) -> None:
        """A send admitted by another runner to a session whose programs run here: run its turn."""
        first = data.get("first")
        token = data.get("token")
        if not isinstance(first, dict) or not token:
            return
        d = self.leases.get(sid)
        if d is not None and d.token == str(token):
            return
        drives_mod.start_drive(self.deps, Drive(sid=sid, token=str(token), first=first))

    async def _stop_programs(self, sid: str, data: dict[str, Any]) -> None:
        pid = data.get("program_id")
        by = str(data.get("by") or "stop")
        if by not in ("stop", "person"):
            by = "stop"
        if pid:
            p = self.programs.find(sid, str(pid))
            if p is not None:
                await self.programs.stop(p, by)
            return
        await self.programs.stop_session(sid, by)

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
                self.log.warning("loop.error", loop=fn.__name__, error=logged(exc))
                if isinstance(exc, (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)):
                    await self.store.drop_idle()
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
        claims = await self.store.claim(runner=self.runner_id, lease_ms=rc.lease_ms, limit=20, share=share,
                                        every_ms=rc.claim_interval_ms)
        for c in claims:
            sid = str(c["sid"])
            self.log.warning("lease.claimed", sid=sid, turn_id=c.get("turn_id"), old_runner=c.get("old_runner"),
                             token=c.get("token"))
            drives_mod.start_drive(self.deps, Drive(sid=sid, token=str(c["token"]), crashed=c, acquired=sent))

    async def _sweep(self) -> None:
        await self.store.sweep(every_ms=SWEEP_EVERY_MS)

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
        with contextlib.suppress(Exception):  # the programs stop with their runner
            await asyncio.wait_for(self.programs.stop_all("runner"), SHUTDOWN_GRACE_S)
        await self.store.outbox.close()
        await self.clients.flush_usage()  # while the bus is still up

    async def on_stop(self) -> None:
        await self.store.aclose()


def main() -> None:
    from coxswain.service import run

    run(Runner, subjects.RUNNER)
