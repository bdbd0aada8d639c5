"""The gateway process: the FastAPI app served by uvicorn, plus its NATS and Redis clients.

The service context (NATS, Redis, health over NATS) is entered once in ``main``; uvicorn runs
inside it as the process's foreground work and is told to exit on SIGTERM, after which the
context drains NATS and closes Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Iterator
from typing import Any

import uvicorn
from nats.aio.msg import Msg
from redis.asyncio.retry import Retry
from redis.backoff import ExponentialBackoff

from coxswain import eventlog, subjects
from coxswain.config import Settings
from coxswain.errors import logged
from coxswain.service import Service

from . import metrics
from .app import create_app
from .auth import Auth
from .deps import Deps, Services
from .notifier import Notifier, SecretMissing
from .reads import SessionReads
from .streams import HttpProtocol, Streams
from .tracer import Tracer


class _Server(uvicorn.Server):
    """uvicorn without its own signal handlers: the service owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class Gateway(Service):
    name = subjects.GATEWAY
    uses_redis = True

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.auth = Auth(settings.principals())

    async def start(self) -> None:
        # The gateway only reads Redis, so a read may be retried: a pooled connection that a Redis
        # restart closed fails once and is replaced; Redis down is a 503 after the last retry.
        self.redis.set_retry(Retry(ExponentialBackoff(cap=0.5, base=0.05), 3))
        self.js = self.nc.jetstream()
        hub = eventlog.Hub(self.nc)
        metrics.SUBSCRIPTIONS.set_function(lambda: hub.subscriptions)
        self._usage_sub = await self.nc.subscribe(subjects.USAGE_METRICS, queue=subjects.USAGE_METRICS_GROUP,
                                                  cb=self._on_usage)
        # Webhooks: each a durable consumer of the event log that every gateway replica shares.
        try:
            self.notifier = Notifier(self.settings.notify, self.js, self.log)
        except SecretMissing as exc:
            self.log.error("notify.secret_missing", error=str(exc))
            raise
        # What the routes use, and nothing else of the service (cox_gateway.deps)
        streams = Streams(hub, self.js, self.settings.gateway, self.log, lambda: self.stopping)
        self.app = create_app(Deps(settings=self.settings, auth=self.auth, services=Services(self.nc),
                                   reads=SessionReads(self.redis, self.js, self.settings), streams=streams,
                                   notifier=self.notifier))
        for hook in self.notifier.webhooks:
            self.spawn(hook.run(), f"notify:{hook.name}")
        # Traces: one durable consumer of the event log too, when [telemetry] otlp_endpoint is set.
        self.tracer = Tracer(self.settings, self.js, self.log) if self.settings.telemetry.otlp_endpoint else None
        if self.tracer is not None:
            self.log.info("traces.enabled")  # not the URL: it may hold a credential
            self.spawn(self.tracer.run(), "traces")

    async def _on_usage(self, msg: Msg) -> None:
        try:
            data = json.loads(msg.data)
            # a runner sends a list of sums (model, purpose); one sample alone is counted too
            for sample in data if isinstance(data, list) else [data]:
                if isinstance(sample, dict):
                    metrics.count_usage(sample)
        except ValueError as exc:
            self.log.warning("metrics.bad_usage_sample", error=logged(exc))

    async def health(self) -> dict[str, Any]:
        await self.redis.ping()
        out: dict[str, Any] = {"port": self.settings.port}
        tracer = getattr(self, "tracer", None)
        if tracer is not None:
            out["traces"] = await tracer.health()
        return out

    async def on_stop(self) -> None:
        notifier = getattr(self, "notifier", None)
        if notifier is not None:
            await notifier.close()

    async def serve(self, stop: asyncio.Event) -> None:
        config = uvicorn.Config(
            self.app, host=self.settings.host, port=self.settings.port, log_config=None, access_log=False,
            lifespan="off", timeout_graceful_shutdown=3, timeout_keep_alive=self.settings.gateway.keep_alive_s,
            http=HttpProtocol, proxy_headers=False, server_header=False,
        )
        server = _Server(config)
        task = asyncio.create_task(server.serve(), name="uvicorn")
        waiter = asyncio.create_task(stop.wait())
        await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        server.should_exit = True
        waiter.cancel()
        await task
        if not server.started:
            raise RuntimeError(f"the gateway could not listen on {self.settings.host}:{self.settings.port}")
        self.log.info("http.stopped")


def main() -> None:
    from coxswain.service import run

    run(Gateway, subjects.GATEWAY)
