"""The life of a coxswain process: one async context manager entered once in ``main``.

Entering connects to NATS (and Redis when the service needs it) with bounded retries, registers
the service with nats micro (``$SRV.PING.<name>`` answers health), subscribes the service's
request-reply endpoints and starts its background tasks. Leaving shuts down in this order:
stop taking work (unsubscribe) -> bounded wait for requests in flight -> cancel
what is left -> await it -> the service's own cleanup -> drain NATS -> close Redis.
Leaving twice is safe.

Each request runs in its own task (a NATS subscription callback runs one message at a time, so
a slow request would otherwise hold up every other one); every task is kept and awaited.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import gc
import json
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import nats
import nats.micro
import redis.asyncio as aioredis
import redis.asyncio.cluster as aiocluster
import redis.exceptions
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, SecretStr, ValidationError

from . import __version__, bus, keys, logs, redisfix, rpc, subjects
from .config import Settings
from .errors import CoxError, Invalid, Unavailable, describe, logged
from .models import Health
from .stalls import StallWatch

redisfix.install()  # before any client: redis-py must not swallow a cancellation (coxswain.redisfix)

M = TypeVar("M", bound=BaseModel)
Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)
Handler = Callable[[M], Awaitable[BaseModel | dict[str, Any]]]

CONNECT_ATTEMPTS = 40
CONNECT_WAIT_S = 0.5
REDIS_MAX_CONNECTIONS = 256
REDIS_POOL_WAIT_S = 10.0
RELEARN_S = 0.5
CANCEL_WAIT_S = 10.0


async def connect_nats(
    url: str, name: str, log: Any, *, user: str | None = None, password: str | None = None,
    inbox_prefix: str = "_INBOX",
) -> Client:
    """Connect with bounded retries (a log line each); afterwards nats-py reconnects forever.

    ``user``/``password`` win over a ``user:pass@`` in ``url``; the URL is logged redacted. A
    lost connection fails the requests in flight at once (:class:`bus.Link`). ``url`` may name
    every node of a cluster, comma-separated: the client connects to one of them and, when it is
    lost, reconnects to another (nats-py also learns nodes the server announces).
    """
    ln = bus.Link()

    async def on_error(exc: Exception) -> None:
        log.warning("nats.error", error=logged(exc))

    async def on_disconnect() -> None:
        ln.disconnected()
        log.warning("nats.disconnected")

    async def on_reconnect() -> None:
        log.info("nats.reconnected")

    shown = logs.redact_url(url)
    last: Exception | None = None
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        nc = Client()
        try:
            # reconnect_time_wait is seconds, a float to nats-py's sleep (its annotation says int)
            await nc.connect(
                nats_servers(url), name=name, connect_timeout=2, allow_reconnect=True, max_reconnect_attempts=-1,
                reconnect_time_wait=0.25,  # type: ignore[arg-type]
                error_cb=on_error, disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect, user=user, password=password, inbox_prefix=inbox_prefix,
            )
            bus.link(nc, ln)
            return nc
        except Exception as exc:  # noqa: BLE001 - any failure to connect is retried, then reported
            last = exc
            log.warning("nats.connect_failed", url=shown, attempt=attempt, error=logged(exc))
            # nats-py leaves the socket of a refused connection (Authorization Violation) open
            await close_quietly(nc)
            await asyncio.sleep(CONNECT_WAIT_S)
    raise Unavailable(f"could not connect to NATS at {shown}: {last!r}")


async def close_quietly(nc: Client) -> None:
    """Close a client whose connect failed: its transport may still be open."""
    with contextlib.suppress(Exception):
        await nc.close()


def nats_servers(url: str) -> list[str]:
    """The URLs of ``COX_NATS_URL``: one, or a cluster's nodes separated by commas."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise Invalid(f"no NATS URL in {url!r}")
    return servers


async def connect_redis(
    url: str, log: Any, *, user: str | None = None, password: str | None = None, cluster: bool = False
) -> Any:
    """A Redis client, checked with PING under bounded retries.

    ``user``/``password`` win over a ``user:pass@`` in ``url``; the URL is logged redacted.
    ``cluster``: ``url`` names one node of a Redis Cluster; the client (redis-py's asyncio
    ``RedisCluster``) learns the others from it and routes each command by its key's slot.
    """
    shown = logs.redact_url(url)
    auth: dict[str, str] = {}
    if password is not None:
        url = _without_userinfo(url)  # redis-py lets the URL's credentials win over arguments
        auth = {"password": password, **({"username": user} if user else {})}
    if cluster:
        return await _connect_cluster(url, shown, log, auth)
    # redis-py 8's default pool refuses the 101st concurrent command ("Too many connections")
    # instead of waiting for a free connection: a runner driving ~100 sessions at once answered
    # sends with 503 and missed lease renewals (turns ended "crashed"). Wait, bounded, instead.
    pool = redisfix.WaitingPool.from_url(
        url, max_connections=REDIS_MAX_CONNECTIONS, timeout=REDIS_POOL_WAIT_S, decode_responses=True,
        socket_connect_timeout=2, socket_timeout=5, health_check_interval=5, **auth,
    )
    client = aioredis.Redis.from_pool(pool)
    last: Exception | None = None
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            await client.ping()
            return client
        except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
            last = exc
            log.warning("redis.connect_failed", url=shown, attempt=attempt, error=logged(exc))
            await asyncio.sleep(CONNECT_WAIT_S)
    await client.aclose()
    raise Unavailable(f"could not connect to Redis at {shown}: {last!r}")


# What a cluster answers while a failover is under way (the slot has no master yet, or the client
# closed its connections to relearn the slot map under a command in flight): the same to coxswain
# as a Redis that did not answer, so every caller's handling of ConnectionError applies (a 503, a
# StoreDown, a lease left to lapse). The command may or may not have run, as for a broken connection.
_FAILING_OVER = (redis.exceptions.ClusterError, redis.exceptions.TryAgainError,
                 redis.exceptions.RedisClusterException)
# ... and redis-py's own, when it closes every connection on ClusterDownError while other tasks
# still write to them
_CLOSED_UNDER = ("'writelines'", "TCPTransport closed", "handler is closed")


def _failing_over(exc: BaseException) -> bool:
    if isinstance(exc, _FAILING_OVER):
        return True
    return isinstance(exc, (AttributeError, RuntimeError)) and any(m in str(exc) for m in _CLOSED_UNDER)


def _as_down(exc: BaseException) -> redis.exceptions.ConnectionError:
    return redis.exceptions.ConnectionError(f"redis cluster failing over: {exc!r}")


# Set while a command runs: redis-py calls ``aclose()`` on ClusterDownError, which would close the
# connections of every other command in flight (on healthy masters too); inside a command it only
# makes the client learn the slot map again (:meth:`RedisCluster.aclose`).
_IN_COMMAND: contextvars.ContextVar[bool] = contextvars.ContextVar("cox_redis_in_command", default=False)


class ClusterPipeline(aiocluster.ClusterPipeline):
    async def execute(self, raise_on_error: bool = True, allow_redirections: bool = True) -> list[Any]:
        mark = _IN_COMMAND.set(True)
        try:
            res = await super().execute(raise_on_error=raise_on_error, allow_redirections=allow_redirections)
        except Exception as exc:
            if _failing_over(exc):
                raise _as_down(exc) from exc
            raise
        finally:
            _IN_COMMAND.reset(mark)
        return [_as_down(r) if isinstance(r, BaseException) and _failing_over(r) else r for r in res]


class RedisCluster(aiocluster.RedisCluster):
    """redis-py's asyncio cluster client whose failover errors are :class:`ConnectionError` (above)."""

    async def execute_command(self, *args: Any, **kwargs: Any) -> Any:
        mark = _IN_COMMAND.set(True)
        try:
            return await super().execute_command(*args, **kwargs)
        except Exception as exc:
            if _failing_over(exc):
                raise _as_down(exc) from exc
            raise
        finally:
            _IN_COMMAND.reset(mark)

    _relearned: float | None = None

    async def initialize(self, additional_startup_nodes_info: Any = None, last_failed_node_name: Any = None) -> Any:
        """Learn the slot map, at most once per :data:`RELEARN_S`: every command that meets the
        dead master asks for it again, and each time re-reads the whole ``COMMAND`` table under one
        lock, which held every command of the process (healthy masters' lease renewals too) for
        seconds during a failover. In between, MOVED answers patch the map command by command."""
        now = time.monotonic()
        if (self._initialize and self._relearned is not None and now - self._relearned < RELEARN_S
                and self.nodes_manager.default_node is not None):
            self._initialize = False
            return self
        relearn = self._initialize
        await super().initialize(additional_startup_nodes_info, last_failed_node_name)
        if relearn:
            self._relearned = time.monotonic()
        return self

    async def aclose(self) -> None:
        if _IN_COMMAND.get():
            self._initialize = True  # relearn the slot map before the next command; keep connections
            return
        await super().aclose()

    def pipeline(self, transaction: Any | None = None, shard_hint: Any | None = None) -> Any:
        if shard_hint:
            raise redis.exceptions.RedisClusterException("shard_hint is deprecated in cluster mode")
        return ClusterPipeline(self, transaction)  # type: ignore[abstract]  # redis-py builds it so too


async def _connect_cluster(url: str, shown: str, log: Any, auth: dict[str, str]) -> Any:
    last: Exception | None = None
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        # The cluster client holds a pool per node; its ``max_connections`` is per node and it
        # raises instead of waiting when they are all taken, so it is generous.
        client = RedisCluster.from_url(
            url, decode_responses=True, max_connections=4 * REDIS_MAX_CONNECTIONS, socket_connect_timeout=2,
            socket_timeout=5, health_check_interval=5, **auth,
        )
        try:
            await client.initialize()
            await client.ping(target_nodes=aiocluster.RedisCluster.PRIMARIES)
            return client
        except (redis.exceptions.RedisError, OSError) as exc:
            last = exc
            log.warning("redis.connect_failed", url=shown, cluster=True, attempt=attempt, error=logged(exc))
            await client.aclose()
            await asyncio.sleep(CONNECT_WAIT_S)
    raise Unavailable(f"could not connect to the Redis Cluster at {shown}: {last!r}")


async def check_buckets(redis: Any, want: int, *, first: bool) -> int:
    """Use the bucket count the data was written with (``cox:meta``), which must be ``want``.

    ``first``: this process may record ``want`` when nothing is recorded yet (the runner; the
    other services only read Redis). Raises :class:`Invalid` on a mismatch: sessions would be
    looked up in the wrong buckets."""
    if first:
        await redis.hsetnx(keys.META, "buckets", str(want))
    have = await redis.hget(keys.META, "buckets")
    if have is not None and int(have) != want:
        raise Invalid(f"[redis] buckets = {want}, but the data in Redis was written with {have} buckets; "
                      f"buckets is fixed at first start: set it back to {have}")
    keys.use_buckets(want)
    return want


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url


class Service:
    """Base of every service process. Subclasses set ``name`` and override the hooks."""

    name: ClassVar[str] = "service"
    uses_redis: ClassVar[bool] = False
    records_meta: ClassVar[bool] = False
    """Records the bucket count at first start (the runner: the one service that writes Redis)."""
    max_inflight: ClassVar[int] = 512
    drain_grace_s: ClassVar[float] = 10.0

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.instance = settings.instance or self.name
        self.log = logs.get(instance=self.instance)
        self._nc: Client | None = None
        self._redis: aioredis.Redis | None = None
        self._micro: Any = None
        self._subs: list[Subscription] = []
        self._served: set[str] = set()
        self.home_id: str | None = None
        """This replica's id on subjects of its own: set, it also answers each of its
        :attr:`~coxswain.rpc.Op.home` operations at :meth:`~coxswain.rpc.Op.subject_at` (the
        runner: its runner id, which the session's lease names)."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._requests: set[asyncio.Task[Any]] = set()
        self._inflight = asyncio.Semaphore(self.max_inflight)
        self._stopping = False
        self._stopped = False
        self.started_at = time.time()
        self.stall_watch: StallWatch | None = None
        self.fatal: asyncio.Future[BaseException] = asyncio.get_running_loop().create_future()
        """Set when a background task dies unexpectedly: ``main`` exits so ``cox up`` restarts it."""

    # ------------------------------------------------------------ connections
    @property
    def nc(self) -> Client:
        assert self._nc is not None, "service not entered"
        return self._nc

    @property
    def redis(self) -> Any:
        """The Redis client (``decode_responses=True``: str in, str out).

        Typed ``Any`` because redis-py's stubs describe every reply as ``bytes | str``.
        """
        assert self._redis is not None, "service does not use Redis or is not entered"
        return self._redis

    # ------------------------------------------------------------ lifecycle
    async def __aenter__(self) -> Service:
        try:
            s = self.settings
            self._nc = await connect_nats(
                s.nats_url, self.instance, self.log, user=s.nats_user, password=_secret(s.nats_password),
                inbox_prefix=subjects.inbox(self.name),
            )
            if self.uses_redis:
                self._redis = await connect_redis(
                    s.redis_url, self.log, user=s.redis_user, password=_secret(s.redis_password),
                    cluster=s.redis.cluster,
                )
                await check_buckets(self._redis, s.redis.buckets, first=self.records_meta)
            self._micro = await nats.micro.add_service(
                self._nc, name=self.name, version=__version__, description=f"coxswain {self.name}",
                metadata={"instance": self.instance},
            )
            await self.start()
            # The objects of start-up (pydantic-ai and its providers alone are ~270,000) live as
            # long as the process: moved out of the collector's reach, a full collection no
            # longer stops the event loop for 60-150 ms in the middle of a turn.
            gc.collect()
            gc.freeze()
            # Health last: a service that answers health answers every endpoint it has.
            await self.add_endpoint("health", None, self._health)
            self._check_served()
            await self._nc.flush()
        except BaseException:
            await self.stop()
            raise
        self.log.info("service.started", frozen_objects=gc.get_freeze_count())
        if self.settings.loop_stall_ms:  # from here on: the start itself may take its time
            self.stall_watch = StallWatch(self.settings.loop_stall_ms, self.log)
            self.stall_watch.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    async def start(self) -> None:
        """Register endpoints and start background tasks."""

    async def on_stop(self) -> None:
        """Release what the service holds, after requests and tasks are done."""

    async def health(self) -> dict[str, Any]:
        """Extra health detail; raise to report unhealthy."""
        return {}

    async def stop(self) -> None:
        if self._stopped:
            return
        self._stopped = True
        self._stopping = True
        self.log.info("service.stopping", inflight=len(self._requests), tasks=len(self._tasks))
        for sub in self._subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self._subs.clear()
        if self._micro is not None:
            with contextlib.suppress(Exception):
                await self._micro.stop()
        if self._requests:
            await asyncio.wait(set(self._requests), timeout=self.drain_grace_s)
        await self.before_cancel()
        pending = self._requests | self._tasks
        for task in pending:
            task.cancel()
        if pending:
            _, stuck = await asyncio.wait(pending, timeout=CANCEL_WAIT_S)
            if stuck:
                # a task that does not end when cancelled must not keep the process alive
                self.log.error("service.tasks_stuck", tasks=sorted(t.get_name() for t in stuck),
                               where=[repr(t.get_stack(limit=3)) for t in stuck][:3])
        with contextlib.suppress(Exception):
            await self.on_stop()
        if self._nc is not None and not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._nc.drain(), timeout=5)
            with contextlib.suppress(Exception):
                await self._nc.close()
        if self._redis is not None:
            with contextlib.suppress(Exception):
                await self._redis.aclose()
        if self.stall_watch is not None:
            await self.stall_watch.stop()
        self.log.info("service.stopped")

    async def before_cancel(self) -> None:
        """Called after requests drained, before background tasks are cancelled."""

    async def serve(self, stop: asyncio.Event) -> None:
        """The process's foreground work until ``stop`` is set (the gateway runs HTTP here)."""
        await stop.wait()

    @property
    def stopping(self) -> bool:
        return self._stopping

    # ------------------------------------------------------------ tasks
    def spawn(self, coro: Coroutine[Any, Any, Any], name: str, *, critical: bool = False) -> asyncio.Task[Any]:
        """Start a background task that is kept, cancelled and awaited on stop.

        A ``critical`` task that ends with an exception makes the whole process exit (``fatal``)
        so the supervisor restarts it instead of leaving a half-working service.
        """
        task = asyncio.create_task(coro, name=name)
        self._tasks.add(task)

        def done(t: asyncio.Task[Any]) -> None:
            self._tasks.discard(t)
            if t.cancelled():
                return
            exc = t.exception()
            if exc is not None:
                self.log.error("task.failed", task=name, error=logged(exc), exc_info=exc)
                if critical and not self.fatal.done() and not self._stopping:
                    self.fatal.set_result(exc)

        task.add_done_callback(done)
        return task

    # ------------------------------------------------------------ endpoints
    async def endpoint(self, op: rpc.Op[Req, Rep], handler: Callable[[Req], Awaitable[Rep]]) -> None:
        """Answer ``op`` (an operation of :mod:`coxswain.rpc` this service serves) with ``handler``."""
        if op.service != self.name:
            raise ValueError(f"{self.name} cannot serve {op.subject}")
        await self.add_endpoint(op.name, op.request, handler)
        if op.home and self.home_id is not None:
            await self.add_endpoint(op.name, op.request, handler, subject=op.subject_at(self.home_id), queue="")

    def _check_served(self) -> None:
        """A service of the table serves exactly its operations there (:mod:`coxswain.rpc`)."""
        if self.name not in subjects.SERVICES:
            return
        want = {op.name for op in rpc.served_by(self.name)}
        if self._served != want:
            raise RuntimeError(f"{self.name} serves {sorted(self._served)}, but coxswain.rpc lists {sorted(want)}: "
                               f"missing {sorted(want - self._served)}, not in the table {sorted(self._served - want)}")

    async def add_endpoint(
        self,
        op: str,
        model: type[M] | None,
        handler: Callable[..., Awaitable[Any]],
        *,
        subject: str | None = None,
        queue: str | None = None,
    ) -> None:
        """Answer ``cox.rpc.<name>.<op>``: parse ``model``, call ``handler``, reply the envelope."""
        subj = subject or subjects.rpc(self.name, op)
        if subject is None:
            self._served.add(op)
        group = subjects.queue_group(self.name) if queue is None else queue

        async def on_msg(msg: Msg) -> None:
            if self._stopping:
                return
            task = asyncio.create_task(self._serve(op, msg, model, handler), name=f"rpc:{op}")
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

        sub = await self.nc.subscribe(subj, queue=group or "", cb=on_msg)
        self._subs.append(sub)

    async def _serve(
        self, op: str, msg: Msg, model: type[M] | None, handler: Callable[..., Awaitable[Any]]
    ) -> None:
        async with self._inflight:
            try:
                if model is None:
                    result = await handler()
                else:
                    try:
                        request = model.model_validate_json(msg.data)
                    except ValidationError as exc:
                        raise Invalid(_short(exc)) from exc
                    result = await handler(request)
                reply = bus.ok(result, bus.HOME.get())
            except CoxError as exc:
                reply = bus.err(exc)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self.log.warning("rpc.redis_down", op=op, error=logged(exc))
                reply = bus.err(Unavailable(f"redis is unavailable: {exc}"))
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await msg.respond(bus.err(Unavailable("service is stopping")))
                raise
            except Exception as exc:
                self.log.error("rpc.failed", op=op, error=logged(exc), exc_info=exc)
                reply = bus.err(CoxError(f"internal error in {self.name}.{op}: {describe(exc)}"))
            if msg.reply:
                with contextlib.suppress(Exception):
                    await msg.respond(reply)

    async def _health(self) -> Health:
        detail = await self.health()
        detail.update(instance=self.instance, uptime_s=round(time.time() - self.started_at, 1))
        return Health(service=self.name, ok=True, detail=detail)


def _secret(value: SecretStr | None) -> str | None:
    return None if value is None else value.get_secret_value()


def _short(exc: ValidationError) -> str:
    parts = []
    for e in exc.errors()[:5]:
        loc = ".".join(str(x) for x in e.get("loc", ())) or "body"
        parts.append(f"{loc}: {e.get('msg')}")
    return "; ".join(parts)


def install_uvloop() -> None:
    with contextlib.suppress(ImportError):
        import uvloop

        uvloop.install()


def run(factory: Callable[[Settings], Service], name: str) -> None:
    """``main`` of a service: read settings, log, run until SIGTERM/SIGINT or a fatal error."""
    from .config import load

    settings = load()
    logs.setup(settings.instance or name, settings.log_level)
    install_uvloop()
    code = asyncio.run(_run(factory, settings))
    raise SystemExit(code)


async def _run(factory: Callable[[Settings], Service], settings: Settings) -> int:
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    log = logs.get()
    try:
        async with factory(settings) as svc:
            serving = asyncio.create_task(svc.serve(stop), name="serve")
            pending: list[asyncio.Future[Any]] = [serving, svc.fatal]
            await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            stop.set()
            await asyncio.gather(serving, return_exceptions=True)
            if svc.fatal.done():
                log.error("service.fatal", error=repr(svc.fatal.result()))
                return 1
            if serving.exception() is not None:
                log.error("service.serve_failed", error=repr(serving.exception()))
                return 1
    except Unavailable as exc:
        log.error("service.unavailable", error=str(exc))
        return 2
    return 0


def dumps(obj: Any) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
