"""Prometheus metrics of the gateway (``GET /metrics``)."""

from __future__ import annotations

import time

from fastapi import Response
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from starlette.types import ASGIApp, Message, Receive, Scope, Send

REGISTRY = CollectorRegistry()
REQUESTS = Counter("cox_http_requests_total", "HTTP requests", ["method", "route", "status"], registry=REGISTRY)
LATENCY = Histogram("cox_http_request_seconds", "HTTP request latency", ["route"], registry=REGISTRY,
                    buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1, 5))
STREAMS = Gauge("cox_event_streams", "open event streams (SSE)", registry=REGISTRY)
STREAMS_DROPPED = Counter("cox_event_streams_dropped", "event streams dropped for a slow client (SSE)", ["reason"],
                          registry=REGISTRY)
STREAMS_REFUSED = Counter("cox_event_streams_refused", "event streams refused: max_streams_per_principal",
                          registry=REGISTRY)
MODEL_REQUESTS = Counter("cox_model_requests", "model requests, by model and purpose (turn, title, compaction)",
                         ["model", "purpose"], registry=REGISTRY)
MODEL_TOKENS = Counter("cox_model_tokens", "model tokens, by model, purpose and kind (input, output, cache_read, "
                       "cache_write)", ["model", "purpose", "kind"], registry=REGISTRY)
MODEL_COST = Counter("cox_model_cost_usd", "model cost in USD (0 where prices are unknown)", ["model", "purpose"],
                     registry=REGISTRY)
SUBSCRIPTIONS = Gauge("cox_event_subscriptions", "sessions with a live NATS subscription in this gateway",
                      registry=REGISTRY)

WEBHOOK_ATTEMPTS = Counter("cox_webhook_attempts", "webhook delivery attempts, by webhook, event type and outcome "
                           "(ok, refused: a non-2xx answer, error: no answer)", ["webhook", "event", "outcome"],
                           registry=REGISTRY)
WEBHOOK_DELIVERED = Counter("cox_webhook_delivered", "events delivered to a webhook (answered 2xx)",
                            ["webhook", "event"], registry=REGISTRY)
WEBHOOK_FAILED = Counter("cox_webhook_failed", "events given up after [notify] max_attempts or max_age_s",
                         ["webhook", "event"], registry=REGISTRY)
TRACE_TURNS = Counter("cox_trace_turns", "turns exported as traces ([telemetry] otlp_endpoint), by outcome (ok; "
                      "failed: the collector did not take them, tried again later)", ["outcome"], registry=REGISTRY)
TRACE_SPANS = Counter("cox_trace_spans", "spans exported by OTLP", registry=REGISTRY)
TRACE_REREADS = Counter("cox_trace_rereads", "ended turns whose events were read again from the stream (this "
                        "gateway had not seen them all: a restart, another replica, a gap)", registry=REGISTRY)
WEBHOOK_SECONDS = Histogram("cox_webhook_attempt_seconds", "webhook delivery attempt latency", ["webhook"],
                            registry=REGISTRY, buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10))


class Middleware:
    """Counts and times every HTTP request by route template, as plain ASGI.

    (Starlette's ``@app.middleware("http")`` runs each request through an extra task and memory
    streams: a measurable share of a request that otherwise costs a millisecond or two.)
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            observe(scope.get("method", ""), getattr(scope.get("route"), "path", "unmatched"), status,
                    time.perf_counter() - start)


def observe(method: str, path: str, status: int, seconds: float) -> None:
    """Count and time one request by its route's template (``unmatched`` when none took it)."""
    REQUESTS.labels(method, path, str(status)).inc()
    LATENCY.labels(path).observe(seconds)


def render() -> Response:
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def count_usage(sample: dict[str, object]) -> None:
    """Model requests' usage, as a runner publishes it (``subjects.USAGE_METRICS``): the sum of
    ``requests`` of them (one when it is not given) of a model and purpose."""
    model, purpose = str(sample.get("model", "")), str(sample.get("purpose", ""))
    requests = sample.get("requests", 1)
    if not isinstance(requests, int) or isinstance(requests, bool) or requests < 0:
        raise ValueError(f"requests is not a count: {requests!r}")
    MODEL_REQUESTS.labels(model, purpose).inc(requests)
    for kind in ("input", "output", "cache_read", "cache_write"):
        n = sample.get(f"{kind}_tokens")
        if isinstance(n, int) and n > 0:
            MODEL_TOKENS.labels(model, purpose, kind).inc(n)
    cost = sample.get("cost")
    if isinstance(cost, (int, float)) and cost > 0:
        MODEL_COST.labels(model, purpose).inc(float(cost))
