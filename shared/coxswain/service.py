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
import redis.exceptions
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.aio.subscription import Subscription
from pydantic import BaseModel, SecretStr, ValidationError

from . import __version__, bus, logs, rpc, subjects
from .config import Settings
from .errors import CoxError, Invalid, Unavailable
from .models import Health

M = TypeVar("M", bound=BaseModel)
Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)
Handler = Callable[[M], Awaitable[BaseModel | dict[str, Any]]]

CONNECT_ATTEMPTS = 40
CONNECT_WAIT_S = 0.5
REDIS_MAX_CONNECTIONS = 256
REDIS_POOL_WAIT_S = 10.0


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
        log.warning("nats.error", error=repr(exc))

    async def on_disconnect() -> None:
        ln.disconnected()
        log.warning("nats.disconnected")

    async def on_reconnect() -> None:
        log.info("nats.reconnected")

    shown = logs.redact_url(url)
    last: Exception | None = None
    for attempt in range(1, CONNECT_ATTEMPTS + 1):
        try:
            nc = await nats.connect(
                nats_servers(url), name=name, connect_timeout=2, allow_reconnect=True, max_reconnect_attempts=-1,
                reconnect_time_wait=0.25, error_cb=on_error, disconnected_cb=on_disconnect,
                reconnected_cb=on_reconnect, user=user, password=password, inbox_prefix=inbox_prefix,
            )
            bus.link(nc, ln)
            return nc
        except Exception as exc:  # noqa: BLE001 - any failure to connect is retried, then reported
            last = exc
            log.warning("nats.connect_failed", url=shown, attempt=attempt, error=repr(exc))
            await asyncio.sleep(CONNECT_WAIT_S)
    raise Unavailable(f"could not connect to NATS at {shown}: {last!r}")


def nats_servers(url: str) -> list[str]:
    """The URLs of ``COX_NATS_URL``: one, or a cluster's nodes separated by commas."""
    servers = [u.strip() for u in url.split(",") if u.strip()]
    if not servers:
        raise Invalid(f"no NATS URL in {url!r}")
    return servers


async def connect_redis(
    url: str, log: Any, *, user: str | None = None, password: str | None = None
) -> aioredis.Redis:
    """A Redis client, checked with PING under bounded retries.

    ``user``/``password`` win over a ``user:pass@`` in ``url``; the URL is logged redacted.
    """
    shown = logs.redact_url(url)
    auth: dict[str, str] = {}
    if password is not None:
        url = _without_userinfo(url)  # redis-py lets the URL's credentials win over arguments
        auth = {"password": password, **({"username": user} if user else {})}
    # redis-py 8's default pool refuses the 101st concurrent command ("Too many connections")
    # instead of waiting for a free connection: a runner driving ~100 sessions at once answered
    # sends with 503 and missed lease renewals (turns ended "crashed"). Wait, bounded, instead.
    pool = aioredis.BlockingConnectionPool.from_url(
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
            log.warning("redis.connect_failed", url=shown, attempt=attempt, error=repr(exc))
            await asyncio.sleep(CONNECT_WAIT_S)
    await client.aclose()
    raise Unavailable(f"could not connect to Redis at {shown}: {last!r}")


def _without_userinfo(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    return scheme + sep + rest.rpartition("@")[2] if sep else url


class Service:
    """Base of every service process. Subclasses set ``name`` and override the hooks."""

    name: ClassVar[str] = "service"
    uses_redis: ClassVar[bool] = False
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
        self._tasks: set[asyncio.Task[Any]] = set()
        self._requests: set[asyncio.Task[Any]] = set()
        self._inflight = asyncio.Semaphore(self.max_inflight)
        self._stopping = False
        self._stopped = False
        self.started_at = time.time()
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
                    s.redis_url, self.log, user=s.redis_user, password=_secret(s.redis_password)
                )
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
            await asyncio.gather(*pending, return_exceptions=True)
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
                self.log.error("task.failed", task=name, error=repr(exc), exc_info=exc)
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
                reply = bus.ok(result)
            except CoxError as exc:
                reply = bus.err(exc)
            except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError) as exc:
                self.log.warning("rpc.redis_down", op=op, error=repr(exc))
                reply = bus.err(Unavailable(f"redis is unavailable: {exc}"))
            except asyncio.CancelledError:
                with contextlib.suppress(Exception):
                    await msg.respond(bus.err(Unavailable("service is stopping")))
                raise
            except Exception as exc:
                self.log.error("rpc.failed", op=op, error=repr(exc), exc_info=exc)
                reply = bus.err(CoxError(f"internal error in {self.name}.{op}: {exc!r}"))
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
