"""The runner's handle on Redis: the function library, its calls, takeover and sweeper passes.

Every state change is one ``FCALL`` into ``redis_lib.lua``. A call that recorded events may hand
back a batch of the session's outbox together with its publish lock; the store's
:class:`~cox_runner.redis.outbox.Outbox` then publishes it (outbox.py).

Calls are never retried by the Redis client (the runner turns its retries off): a transition
whose connection broke may or may not have run, and running it blindly twice would record it
twice. This module retries instead, safely: every call of a function the library registers
through ``once`` carries a transition id (``tx``), made once per call and sent again by each of
its retries, and Redis answers a tx it has already run with the first attempt's reply, without
running it again (docs/design.md, "Idempotent transitions"). A call whose connection broke
(``ConnectionError``/``TimeoutError``) is retried a few times with a short backoff, within
``retry_s`` (one retry at least); only when every attempt failed does a call of the turn's holder raise
:class:`StoreDown` (the turn writes nothing more and the lease lapses) and an admission call
fail (503; ``client_id`` makes a send idempotent for the person's own retry).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import Callable
from importlib import resources
from typing import Any

import redis.asyncio.cluster as aiocluster
import redis.exceptions
from nats.js import JetStreamContext

from coxswain import errors, keys
from coxswain.errors import logged
from coxswain.ids import id_time, new_id
from coxswain.redismux import Mux

from ..errors import StoreDown
from .faults import DropReplies
from .fns import Fns
from .outbox import CONTINUED, Outbox
from .replicas import Replicas

LIBRARY = resources.files("cox_runner.redis").joinpath("redis_lib.lua").read_text()


# Functions only the holder of a turn's lease calls (with its token).
HOLDER_FNS = frozenset({"cox_emit", "cox_renew", "cox_auto_title", "cox_close_leads",
                        "cox_turn_end", "cox_fence"})
# Functions registered through ``once`` in the library: their last argument is the transition id.
TX_FNS = frozenset({"cox_create", "cox_patch", "cox_send", "cox_lead", "cox_stop", "cox_answer", "cox_emit",
                    "cox_auto_title", "cox_close_leads", "cox_turn_end", "cox_op_begin",
                    "cox_queue_remove", "cox_queue_order", "cox_archive_take", "cox_fork", "cox_run",
                    "cox_budget_resume", "cox_spend"})
LOAD_WAIT_S = 30.0
"""How long a starting runner waits for Redis to take the library (transient errors only)."""
SWEEP_SHARE = 4
"""In a cluster, the sweeper's passes (one a second) look at every bucket within this many."""
RETRY_ATTEMPTS = 5
"""Attempts of one call whose connection broke (the first included), within ``retry_s``."""
RETRY_FIRST_S = 0.02
RETRY_MAX_S = 0.5
"""The backoff before retry n is uniform in [0.5, 1] x min(RETRY_MAX_S, RETRY_FIRST_S * 2**(n-1))."""
_BROKEN = (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError)


# Transitions a person is told succeeded (the API's 202/201 answers) and the turn's end: with
# ``[redis] wait_replicas`` they are not acknowledged before that many replicas hold them.
WAITED_FNS = frozenset({"cox_create", "cox_patch", "cox_send", "cox_lead", "cox_stop", "cox_answer",
                        "cox_queue_remove", "cox_queue_order", "cox_op_begin", "cox_turn_end", "cox_budget_resume",
                        # an archived session loaded back: on a replica before its archive entry is deleted
                        "cox_archive_load"})


def _list(value: Any) -> list[Any]:
    """cjson writes an empty Lua table as ``{}``; lists always come back as lists."""
    return value if isinstance(value, list) else []


REQUEST_TX_FRESH_S = keys.TX_KEEP_MS / 1000 - 15
"""A request's transition id (the gateway's, :attr:`coxswain.models.HomeCmd.tx`) older than this
is not run: its kept reply may be gone (``keys.TX_KEEP_MS``), so a runner that reads it that late
(frozen, its socket's backlog read at the thaw) could make a change another runner made already.
The gateway gave up on it long before (30 s); 15 s are left for the hosts' clocks to differ."""


class Store:
    """Calls into the Redis function library; one per runner process."""

    def __init__(self, redis: Any, js: JetStreamContext, owner: str, log: Any, *, wait_replicas: int = 0,
                 wait_ms: int = 1000, retry_s: float = 1.0, faults: DropReplies | None = None) -> None:
        self.redis = redis
        self.wait_replicas = wait_replicas
        self.wait_ms = wait_ms
        self.cluster = isinstance(redis, aiocluster.RedisCluster)
        self.mux = None if self.cluster else Mux.of(redis)
        """The connection every ``FCALL`` of this process goes out on (coxswain/redismux.py): one,
        pipelined, where redis-py takes a pooled connection per command. None in a cluster or over
        TLS (redis-py's client then carries them)."""
        self._cursors = {"claim": random.randrange(1 << 16), "sweep": random.randrange(1 << 16)}
        """Where this runner's next takeover (:meth:`claim`) and, in a cluster, sweeper
        (:meth:`sweep`) pass starts, when it is not the stack's (:meth:`_next`)."""
        self.js = js
        self.owner = owner
        self.log = log
        self.retry_s = retry_s
        """How long after its first attempt a call whose connection broke may still be retried."""
        self.faults = faults or DropReplies()
        self.fns = Fns(self)
        """One typed method per library function: what the rest of the runner calls."""
        self.replicas = Replicas(redis, wait_replicas, wait_ms)
        self.outbox = Outbox(redis, js, self.fns, owner, log, self.replicas)
        """Publishing the outbox batches calls hand back (and ``flush``, to read a log in full)."""

    async def load(self) -> None:
        """Load the library; in a cluster on every master (a replica gets it by replication, so a
        promoted one has it; a master added later gets it on the first "Function not found")."""
        # A server that is slow or failing over at our start (a Redis Cluster node mid-failover, a
        # loaded machine) is waited for, bounded, rather than ending the runner at its first try.
        deadline = time.monotonic() + LOAD_WAIT_S
        pause = 0.2
        while True:
            try:
                await self.redis.function_load(LIBRARY, replace=True)  # the cluster client sends it to every master
                return
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError,
                    redis.exceptions.ClusterDownError, redis.exceptions.TryAgainError) as e:
                if time.monotonic() + pause > deadline:
                    raise
                if self.log is not None:
                    self.log.warning("redis.load_retry", error=type(e).__name__, retry_in_s=pause)
                await asyncio.sleep(pause)
                pause = min(pause * 2, 2.0)

    async def drop_idle(self) -> None:
        """Redis failed a call: drop the idle pooled connections, so that once it is back (a
        restart) no call goes out on a socket the old server closed (a retry would fail on it
        for nothing). Before each retry here, and by the runner after a failure of its own.
        The multiplexed connection is not dropped: a connection that broke fails its calls and is
        replaced by the next call; one that still answers carries other sessions' calls."""
        with contextlib.suppress(Exception):
            await self.redis.connection_pool.disconnect(inuse_connections=False)

    async def aclose(self) -> None:
        if self.mux is not None:
            await self.mux.aclose()

    async def fcall_raw(self, fn: str, ks: list[str], argv: list[str]) -> Any:
        """One ``FCALL``, on the multiplexed connection where there is one."""
        if self.mux is not None:
            return await self.mux.call("FCALL", fn, len(ks), *ks, *argv)
        return await self.redis.fcall(fn, len(ks), *ks, *argv)

    def node_of(self, key: str) -> str:
        """The name of the Redis master serving ``key`` ('' without a cluster)."""
        return str(self.redis.get_node_from_key(key).name) if self.cluster else ""

    async def _fcall(self, fn: str, ks: list[str], argv: list[str]) -> tuple[Any, bool]:
        """Run ``fn``; with ``wait_replicas``, also wait for the replicas. Returns (reply, held):
        ``held`` is False when fewer replicas than asked answered in time."""
        if not (self.wait_replicas and fn in WAITED_FNS and ks):
            return await self.fcall_raw(fn, ks, argv), True
        async with self.redis.pipeline(transaction=False) as pipe:
            pipe.fcall(fn, len(ks), *ks, *argv)
            self.replicas.queue_wait(pipe, ks[0])
            res, acked = await pipe.execute(raise_on_error=False)
        if isinstance(res, Exception):
            raise res
        if isinstance(acked, Exception):
            # The call was redirected (MOVED: a failover moved its slot) and ran on the new master,
            # while WAIT went to the old one, now a replica: not confirmed.
            self.log.warning("redis.wait_failed", fn=fn, error=repr(acked))
            return res, False
        return res, int(acked) >= self.wait_replicas

    async def call(self, fn: str, sid: str | None, args: list[Any], extra_keys: list[str] | None = None,
                   publish: bool = True, tx: str = "") -> dict[str, Any]:
        """Run ``fn``; raise the error it answered; publish any outbox batch it handed over.

        ``tx``: the transition id of the request this call makes the change of, when the request
        has one of its own (:attr:`coxswain.models.HomeCmd.tx`: the gateway may have sent it to
        another runner too); a call whose transition another runner's call made already answers
        that reply marked ``replay`` (redis_lib.lua, "A transition id may name its caller").

        Called by :class:`cox_runner.redis.fns.Fns`, which names and types each function's arguments."""
        ks = ([keys.session(sid)] if sid is not None else []) + (extra_keys or [])
        argv = [a if isinstance(a, str) else ("" if a is None else str(a)) for a in args]
        if fn in TX_FNS:
            if tx and (born := id_time(tx)) is not None and (age := time.time() - born) > REQUEST_TX_FRESH_S:
                # its reply is kept only so long: run now, it could be made a second time
                raise errors.Unavailable(f"the request is {age:.0f}s old, older than its caller waits: not run")
            # one per logical call: every retry below sends the same one (and names the same caller)
            tx = f"{tx}.{new_id('c')}" if tx else new_id("x")
            argv.append(tx)
        elif tx:
            raise ValueError(f"{fn} takes no transition id")
        first = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                res, held = await self._attempt(fn, ks, argv)
                break
            except _BROKEN as exc:
                waited = time.monotonic() - first
                # One retry at least, even after a slow failure (a timeout): it is what a lost
                # reply needs; a drive's own deadline still stops it within the lease.
                if attempt >= RETRY_ATTEMPTS or (attempt > 1 and waited >= self.retry_s):
                    self.log.warning("redis.call_failed", fn=fn, sid=sid, tx=tx or None, attempts=attempt,
                                     error=logged(exc))
                    if fn in HOLDER_FNS and not (fn == "cox_emit" and argv[1] == ""):
                        raise StoreDown(f"redis did not answer {fn}: {exc!r}") from exc
                    raise
                pause = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** (attempt - 1)) * (0.5 + random.random() / 2)
                self.log.warning("redis.call_retry", fn=fn, sid=sid, tx=tx or None, attempt=attempt,
                                 error=logged(exc))
                await self.drop_idle()
                await asyncio.sleep(min(pause, max(0.0, self.retry_s - waited)))
        head = json.loads(res[0])
        if isinstance(head, dict) and head.pop("tx_replay", False):
            head["replay"] = True  # another runner's call made this change: its reply, not to act on
            self.log.info("redis.tx_replayed", fn=fn, sid=sid, tx=tx)
        batch = list(res[1:])
        if batch and sid is not None:
            if publish:
                if batch[0] == CONTINUED:
                    self.outbox.go_on(sid, batch[1:])
                else:
                    self.outbox.start(sid, batch)
        if not held:
            # It ran on the master, but no replica confirmed it in time: a failover could lose it,
            # so it is not acknowledged. The person's retry is idempotent (client_id).
            self.log.warning("redis.not_replicated", fn=fn, sid=sid, wait_ms=self.wait_ms)
            detail = f"{fn} was not confirmed by {self.wait_replicas} Redis replica(s) within {self.wait_ms} ms"
            if fn in HOLDER_FNS:
                raise StoreDown(detail)
            raise errors.Unavailable(detail + ": retry")
        if isinstance(head, dict) and "error" in head:
            raise errors.from_wire({"error": head["error"], "detail": head.get("detail", ""),
                                    "status": _status(head["error"])})
        return head if isinstance(head, dict) else {"value": head}

    async def _attempt(self, fn: str, ks: list[str], argv: list[str]) -> tuple[Any, bool]:
        """One attempt (the library loaded again if Redis lost it, e.g. a fresh server); (reply, held)."""
        try:
            res, held = await self._fcall(fn, ks, argv)
        except redis.exceptions.ResponseError as exc:
            if "Function not found" not in str(exc) and "NOSCRIPT" not in str(exc):
                raise
            await self.load()
            res, held = await self._fcall(fn, ks, argv)
        if self.faults and self.faults.drop(fn):
            raise redis.exceptions.ConnectionError(f"fault injection: the reply of {fn} was dropped after it ran")
        return res, held


    async def _scan(self, queue: Callable[[Any, list[int]], None], wait: bool = False,
                    buckets: list[int] | None = None) -> list[Any]:
        """Look at ``buckets`` (default: all) and return the replies that are not errors: in a
        cluster one call per bucket (a call stays in one slot), pipelined (one round trip per
        master); on one server one call for them all. No bucket belongs to a runner: each
        runner alone looks at every bucket, so none is left to one that died.

        ``wait`` (with ``wait_replicas``): the pass wrote something that must be replicated
        before it is acted on; when a replica does not confirm it in time, nothing is returned."""
        todo = list(range(keys.buckets())) if buckets is None else buckets
        groups = [[b] for b in todo] if self.cluster else [todo]
        n = len(groups)
        waits = 0
        async with self.redis.pipeline(transaction=False) as pipe:
            for g in groups:
                queue(pipe, g)
            if wait and self.wait_replicas:
                masters = {self.redis.get_node_from_key(keys.leases(b)).name: b for b in todo} if self.cluster \
                    else {"": 0}
                for b in masters.values():
                    self.replicas.queue_wait(pipe, keys.leases(b))
                waits = len(masters)
            res = await pipe.execute(raise_on_error=False)
        if waits:
            res, acks = res[:n], res[n:]
            if any(isinstance(a, Exception) or int(a) < self.wait_replicas for a in acks):
                self.log.warning("redis.not_replicated", fn="scan", wait_ms=self.wait_ms)
                return []
        failed = [r for r in res if isinstance(r, Exception)]
        if failed:
            if any("Function not found" in str(e) or "NOSCRIPT" in str(e) for e in failed):
                await self.load()
            self.log.warning("redis.scan_failed", buckets=len(failed), error=repr(failed[0]))
        return [r for r in res if not isinstance(r, Exception)]

    async def claim(self, runner: str, lease_ms: int, limit: int, share: int = 1,
                    every_ms: int = 0) -> list[dict[str, Any]]:
        """Claim the sessions whose lease expired (``cox_claim``) in the next ``1/share`` of the
        buckets: ``share`` passes look at every bucket once (a runner's passes rotate from a
        random start, so runners look at different buckets at a time).

        ``every_ms``: the pass is the stack's of that period (:meth:`_takes`): made only by the
        first runner to ask in it, and in a cluster its share follows the stack's last pass (one
        counter), so every bucket is still looked at within ``share`` periods. 0: always made."""
        if not await self._takes("claim", every_ms):
            return []
        n = keys.buckets()
        # On one server a pass is one call whatever it covers: every bucket, every pass.
        count = -(-n // max(1, share)) if self.cluster else n
        start = await self._next(count, every_ms, "claim")
        todo = [(start + i) % n for i in range(min(count, n))]
        replies = await self._scan(lambda pipe, g: self.fns.claim(pipe, buckets=g, runner=runner,
                                                                   lease_ms=lease_ms, limit=limit),
                                   wait=True, buckets=todo)
        out: list[dict[str, Any]] = []
        for raw in replies:
            claimed = json.loads(raw[0] if isinstance(raw, list) else raw)
            out += [c for c in _list(claimed) if isinstance(c, dict)]
        if every_ms > 0 and len(out) >= limit:
            await self._give_back("claim")  # more may wait: the next runner to tick goes on at once
        return out

    async def _takes(self, what: str, every_ms: int) -> bool:
        """Whether this runner makes the stack's ``what`` pass of the current period: the first to
        ask in a period does (``SET NX PX``), the others skip theirs. A pass over every bucket costs
        Redis ~0.5 ms: one per runner a period made Redis's idle CPU grow with the runners (13 ms/s
        at four). Every runner still asks, and none owns a bucket: a runner that took a period and
        died delays the next pass by that period alone. ``every_ms`` 0: no period, always."""
        if every_ms <= 0:
            return True
        key = keys.stack_pass(what)
        if self.mux is not None:
            return await self.mux.call("SET", key, self.owner, "NX", "PX", every_ms) is not None
        return bool(await self.redis.set(key, self.owner, nx=True, px=every_ms))

    async def _give_back(self, what: str) -> None:
        """End this period's ``what`` pass early (it found more than it takes at once). Should the
        period have lapsed meanwhile and another runner taken the next, this ends that one's
        early too: one pass more, nothing lost."""
        await self.redis.delete(keys.stack_pass(what))

    async def _next(self, count: int, every_ms: int, what: str) -> int:
        """Where a pass over ``count`` buckets starts: after this runner's last pass, or with
        ``every_ms`` in a cluster after the stack's (one counter for every runner's passes)."""
        if every_ms > 0 and self.cluster:
            return int(await self.redis.incrby(keys.stack_pass(what + ":cursor"), count)) - count
        start = self._cursors[what]
        self._cursors[what] = (start + count) % keys.buckets()
        return start

    async def sweep(self, min_age_ms: int = 1000, limit: int = 50, every_ms: int = 0) -> int:
        """Publish outboxes nobody is publishing (their drainer died or NATS was down). In a
        cluster a pass looks at the next :data:`SWEEP_SHARE` th of the buckets (one call each), so
        every bucket within that many passes; on one server at all of them in one call.
        ``every_ms``: the stack's pass of that period, as :meth:`claim`'s."""
        if not await self._takes("sweep", every_ms):
            return 0
        n = keys.buckets()
        todo = None
        if self.cluster:
            count = -(-n // SWEEP_SHARE)
            start = await self._next(count, every_ms, "sweep")
            todo = [(start + i) % n for i in range(min(count, n))]
        replies = await self._scan(lambda pipe, g: self.fns.dirty(pipe, buckets=g, min_age_ms=min_age_ms,
                                                                   limit=limit), buckets=todo)
        sids = [sid for r in replies for sid in r]
        if every_ms > 0 and len(sids) >= limit:
            await self._give_back("sweep")
        claimed = 0
        for sid in sids:
            try:
                batch = await self.fns.pub_claim(sid=sid, owner=self.owner)
            except redis.exceptions.ResponseError:
                await self.load()
                continue
            if batch:
                claimed += 1
                await self.outbox.publish(sid, batch)
        return claimed

_STATUS = {"not_found": 404, "busy": 409, "not_accepting": 409, "no_turn": 409, "lead_closed": 409,
           "resolved": 409, "fenced": 409, "conflict": 409, "too_many_pending": 429, "invalid": 422,
           "lost": 409, "not_queued": 409, "not_idle": 409, "workspace_nested": 409,
           "run_active": 409, "open_calls": 409, "budget_reached": 409}


def _status(code: str) -> int:
    return _STATUS.get(code, 500)


def as_list(value: Any) -> list[Any]:
    return _list(value)
