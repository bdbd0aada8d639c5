"""Webhook notifications, delivered at least once from the event log (``[[notify.webhooks]]``).

Each webhook has one durable JetStream pull consumer on the events stream (every session's
subject), shared by every gateway replica: a replica fetches what it has room for, acknowledges
at once the events the webhook did not subscribe to, and posts the others (:mod:`coxswain.notify`
says what a delivery carries). An event is acknowledged only when the receiver answered 2xx, or
terminated (``AckTerm``) when it is given up (``[notify] max_attempts`` or ``max_age_s``);
after any other attempt it is nak'd with the backoff as its delay, so JetStream redelivers it,
to whichever replica asks next, and a gateway that dies mid-delivery leaves it to be redelivered
after the consumer's ack wait. Turns never wait for any of this: they publish to the stream as
always, and the consumers read it behind them.

The secret is held by the :class:`Webhook` alone: it is not in a log line, a health answer or a
metric label, and neither is the URL (which may hold a token of its own); both are named by the
webhook's name.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import time
from typing import Any

import httpx
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api

from coxswain import __version__, eventlog, notify, subjects
from coxswain.config import NotifyConfig, WebhookConfig
from coxswain.errors import logged

from . import consumers, metrics

FETCH_WAIT_S = 2.0
"""How long one pull waits for events before asking again (and noticing a stop)."""
ACK_WAIT_EXTRA_S = 30.0
"""The consumer's ack wait is one attempt's time-out plus this: a message is redelivered only
when the gateway that took it is gone (or stuck), never while its attempt may still answer."""
MAX_ACK_PENDING = 20_000
INFO_TIMEOUT_S = 1.0


class SecretMissing(Exception):
    """A webhook's ``secret_env`` names a variable this gateway does not have (or it is empty)."""


class Webhook(consumers.Consuming):
    """One ``[[notify.webhooks]]`` entry's delivery loop (:meth:`run`, a task of the gateway)."""

    def __init__(self, cfg: WebhookConfig, secret: bytes, policy: NotifyConfig, js: JetStreamContext,
                 http: httpx.AsyncClient, log: Any, started: datetime.datetime) -> None:
        self.name = cfg.label
        self.events = frozenset(cfg.events)
        self.consumer = notify.consumer_name(self.name)
        self._url = cfg.url
        self._secret = secret
        self._policy = policy
        self._js = js
        self._http = http
        self._log = log.bind(webhook=self.name)
        self._started = started
        self.state = "starting"
        self.error = None
        self._inflight: set[asyncio.Task[None]] = set()

    def __repr__(self) -> str:  # never the URL or the secret
        return f"Webhook({self.name!r}, events={sorted(self.events)})"

    # ------------------------------------------------------------ the loop
    async def run(self) -> None:
        """Set up the consumer and deliver until cancelled; a failure is logged, then set up again."""
        try:
            await self._keep_consuming("notify", self.consumer)
        finally:
            # Deliveries cut short are not acknowledged: JetStream hands them out again.
            for task in self._inflight:
                task.cancel()
            if self._inflight:
                await asyncio.gather(*self._inflight, return_exceptions=True)

    def _config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            name=self.consumer, durable_name=self.consumer, description=f"coxswain webhook {self.name}",
            filter_subject=subjects.EVENTS_WILDCARD, ack_policy=api.AckPolicy.EXPLICIT,
            # A new webhook starts with the events recorded since this gateway started (not the
            # whole log); an existing consumer keeps its place whatever is configured here.
            deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=self._started,
            ack_wait=self._policy.timeout_s + ACK_WAIT_EXTRA_S, max_deliver=-1, max_ack_pending=MAX_ACK_PENDING,
        )

    async def _subscribe(self) -> Any:
        return await consumers.bind(self._js, self._config(), self._log, "notify")

    async def _consume(self, sub: Any) -> None:
        room = self._policy.concurrency
        while True:
            free = room - len(self._inflight)
            if free <= 0:
                await asyncio.wait(set(self._inflight), return_when=asyncio.FIRST_COMPLETED)
                continue
            try:
                msgs = await sub.fetch(batch=free, timeout=FETCH_WAIT_S)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                await self._take(msg)

    async def _take(self, msg: Msg) -> None:
        # A message of the stream holds one or more events, never two a webhook can ask for:
        # that one is the only one to look at, and the message's stream seq names it (the
        # delivery id).
        body = eventlog.webhook_event(msg.data)
        try:
            ev = json.loads(body)
            type_ = str(ev.get("type", "")) if isinstance(ev, dict) else ""
        except ValueError:
            type_ = ""
        if type_ not in self.events:
            await msg.ack()
            return
        task = asyncio.create_task(self._deliver(msg, body, ev, type_), name=f"notify:{self.name}")
        self._inflight.add(task)
        task.add_done_callback(self._inflight.discard)

    # ------------------------------------------------------------ one attempt
    async def _deliver(self, msg: Msg, body: bytes, ev: dict[str, Any], type_: str) -> None:
        meta = msg.metadata
        attempt = int(meta.num_delivered or 1)
        delivery = notify.delivery_id(int(meta.sequence.stream), self.name)
        outcome, detail = await self._post(body, type_, delivery)
        metrics.WEBHOOK_ATTEMPTS.labels(self.name, type_, outcome).inc()
        where = {"type": type_, "sid": ev.get("sid"), "seq": ev.get("seq"), "delivery": delivery,
                 "attempt": attempt}
        try:
            if outcome == "ok":
                await msg.ack()
                metrics.WEBHOOK_DELIVERED.labels(self.name, type_).inc()
                self._log.debug("notify.delivered", **where)
                return
            delay = notify.backoff_s(attempt, self._policy.backoff_s, self._policy.backoff_max_s)
            recorded = float(ev.get("ts") or 0) / 1000 or meta.timestamp.timestamp()
            age = time.time() - recorded
            if attempt >= self._policy.max_attempts or age + delay > self._policy.max_age_s:
                await msg.term()
                metrics.WEBHOOK_FAILED.labels(self.name, type_).inc()
                self._log.warning("notify.gave_up", last=detail, age_s=round(age, 1), **where)
                return
            await msg.nak(delay=delay)
            self._log.info("notify.retry", last=detail, delay_s=delay, **where)
        except nats.errors.Error as exc:
            # The answer did not reach JetStream (NATS away): it redelivers after the ack wait.
            self._log.warning("notify.ack_lost", error=logged(exc), **where)
        except Exception as exc:  # noqa: BLE001 - a bug here must not go unseen, nor end the loop
            self._log.error("notify.delivery_failed", error=logged(exc), exc_info=exc, **where)

    async def _post(self, body: bytes, type_: str, delivery: str) -> tuple[str, str]:
        """One attempt: ``ok``, ``refused`` (answered, not 2xx) or ``error`` (no answer), and a
        detail for the log (a status or an exception's class: an httpx message may quote the URL)."""
        ts = str(int(time.time()))
        headers = {
            "Content-Type": "application/json",
            "User-Agent": f"coxswain/{__version__}",
            notify.DELIVERY_HEADER: delivery,
            notify.EVENT_HEADER: type_,
            notify.TIMESTAMP_HEADER: ts,
            notify.SIGNATURE_HEADER: notify.sign(self._secret, ts, body),
        }
        start = time.perf_counter()
        try:
            async with asyncio.timeout(self._policy.timeout_s):
                # Streamed and closed unread: the receiver's answer body is not needed.
                async with self._http.stream("POST", self._url, content=body, headers=headers) as r:
                    status = r.status_code
        except (httpx.HTTPError, TimeoutError, OSError) as exc:
            return "error", type(exc).__name__
        finally:
            metrics.WEBHOOK_SECONDS.labels(self.name).observe(time.perf_counter() - start)
        return ("ok" if 200 <= status < 300 else "refused"), f"HTTP {status}"

    # ------------------------------------------------------------ health
    async def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "events": sorted(self.events), "state": self.state,
                               "in_flight": len(self._inflight)}
        if self.error:
            out["error"] = self.error
        with contextlib.suppress(Exception):
            info = await self._js.consumer_info(subjects.EVENTS_STREAM, self.consumer, timeout=INFO_TIMEOUT_S)
            out.update(pending=info.num_pending, ack_pending=info.num_ack_pending, redelivered=info.num_redelivered)
        return out


def secret_of(cfg: WebhookConfig) -> bytes:
    """The webhook's signing secret; :class:`SecretMissing` (the gateway does not start) if none."""
    secret = cfg.key()
    if not secret:
        where = f"the variable {cfg.secret_env}" if cfg.secret_env else "secret"
        raise SecretMissing(f"[[notify.webhooks]] {cfg.label}: no signing secret ({where} is unset or empty)")
    return secret.encode()


class Notifier:
    """Every configured webhook of this gateway, with one HTTP client between them."""

    def __init__(self, policy: NotifyConfig, js: JetStreamContext, log: Any) -> None:
        secrets = [secret_of(w) for w in policy.webhooks]
        # No redirects followed (a 3xx is an answer that is not 2xx) and no proxy from the
        # environment: a delivery goes to the configured URL or nowhere.
        self.http = httpx.AsyncClient(follow_redirects=False, trust_env=False,
                                      timeout=httpx.Timeout(policy.timeout_s),
                                      limits=httpx.Limits(max_connections=max(10, policy.concurrency * 4)))
        started = datetime.datetime.now(datetime.UTC)
        self.webhooks = [Webhook(w, key, policy, js, self.http, log, started)
                         for w, key in zip(policy.webhooks, secrets, strict=True)]

    async def health(self) -> dict[str, Any]:
        return {"webhooks": list(await asyncio.gather(*(w.health() for w in self.webhooks)))}

    async def close(self) -> None:
        await self.http.aclose()
