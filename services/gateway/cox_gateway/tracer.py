"""Traces of turns, exported by OTLP from the event log (``[telemetry] otlp_endpoint``).

One durable JetStream pull consumer (``cox-traces``) on the events stream, shared by every
gateway replica like a webhook's: this gateway reads every session's events in order, keeps the
events of each session's running turn (small: texts, outputs and arguments dropped) and, at the
turn's ``turn.end``, makes its spans (:func:`coxswain.traces.turn_spans`) and posts them to the
collector. Every event is acknowledged as it is read except a ``turn.end``, acknowledged once its
turn is exported: a gateway that dies before that leaves it to be redelivered, and a ``turn.end``
whose turn this gateway did not see whole (it started before this gateway did, another replica
took some of its events, or the collector refused it and it came back) is made from the turn's
events read again from the stream. The ids are derived from the session and the turn, so a turn
exported twice is the same trace with the same spans, whoever exports it.

Turns never wait for any of this: they record their events as always, and the consumer reads
the log behind them.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import datetime
from typing import Any

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext, api
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.semconv._incubating.attributes import gen_ai_attributes as gen_ai
from opentelemetry.semconv.attributes import service_attributes
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from coxswain import __version__, eventlog, subjects, traces
from coxswain.config import Settings
from coxswain.errors import logged

from . import consumers, metrics

CONSUMER: str = "cox-traces"
FETCH_BATCH = 256
FETCH_WAIT_S = 2.0
ACK_WAIT_EXTRA_S = 60.0
"""The consumer's ack wait is one export's time-out plus this (room to read a turn again)."""
MAX_ACK_PENDING = 1000
MAX_SESSIONS = 10_000
"""Sessions whose running turn this gateway keeps events of (the oldest is forgotten beyond:
its turn is read again from the stream at its end)."""
MAX_TURN_EVENTS = 20_000
"""Events kept of one turn; a longer turn is read again from the stream at its end."""
MAX_ATTEMPTS = 20
"""Exports of one turn before it is given up (logged); each failure waits longer, up to a minute."""
REREAD_TIMEOUT_S = 30.0
COPY_WAIT_S = 2.0
"""How long a turn whose events share one instant waits to see whether a fork copied it."""
DROP = ("text", "output", "args", "preview", "judge", "summary", "changes", "steps", "observed", "message", "command")
"""Fields a kept event does without (the spans carry none of them whole)."""
KEEP_SHORT = ("command", "reason", "detail", "error")


def compact(ev: dict[str, Any]) -> dict[str, Any]:
    """What the spans need of an event: the large fields dropped, a few kept short."""
    out = {k: v for k, v in ev.items() if k not in DROP}
    for k in KEEP_SHORT:
        if isinstance(ev.get(k), str):
            out[k] = ev[k][: traces.MAX_TEXT]
    if isinstance(ev.get("tool_calls"), list):
        out["tool_calls"] = [{"call_id": c.get("call_id"), "name": c.get("name")}
                             for c in ev["tool_calls"] if isinstance(c, dict)]
    return out


class _Turn:
    """The kept events of a session's running turn, and whether every one of them was seen."""

    def __init__(self, turn_id: str, first: dict[str, Any]) -> None:
        self.turn_id = turn_id
        self.events = [compact(first)]
        self.whole = True
        self.last = int(first.get("seq") or 0)

    def add(self, ev: dict[str, Any]) -> None:
        seq = int(ev.get("seq") or 0)
        if seq != self.last + 1 or len(self.events) >= MAX_TURN_EVENTS:
            self.whole = False  # a gap (another replica took it, or it is on its way again)
        self.last = max(self.last, seq)
        if ev.get("type") == "assistant.delta" and self.events and self.events[-1].get("type") == "assistant.delta":
            return  # one delta stands for a request's stream
        if self.whole:
            self.events.append(compact(ev))


def to_sdk(spans: list[traces.Span], resource: Resource) -> list[ReadableSpan]:
    """The SDK's spans (what the OTLP exporter encodes) for :class:`coxswain.traces.Span` s."""
    scope = InstrumentationScope("coxswain", __version__)
    out = []
    for s in spans:
        flags = TraceFlags(TraceFlags.SAMPLED if s.sampled else TraceFlags.DEFAULT)
        ctx = SpanContext(s.trace_id, s.span_id, is_remote=False, trace_flags=flags)
        parent = (SpanContext(s.trace_id, s.parent_id, is_remote=s.parent_remote, trace_flags=flags)
                  if s.parent_id is not None else None)
        op = s.attributes.get(gen_ai.GEN_AI_OPERATION_NAME)
        out.append(ReadableSpan(
            name=s.name, context=ctx, parent=parent, resource=resource, attributes=s.attributes,
            events=[Event(e.name, e.attributes, e.ts_ns) for e in s.events],
            kind=SpanKind.CLIENT if op == traces.OP_CHAT else SpanKind.INTERNAL,
            status=Status(StatusCode.ERROR, s.error) if s.error else Status(StatusCode.UNSET),
            start_time=s.start_ns, end_time=s.end_ns, instrumentation_scope=scope,
        ))
    return out


class Tracer(consumers.Consuming):
    """The trace exporter of this gateway (:meth:`run`, a task of the gateway)."""

    def __init__(self, settings: Settings, js: JetStreamContext, log: Any) -> None:
        self.cfg = settings.telemetry
        self.url = self.cfg.traces_url()
        self._models = settings.model
        self._js = js
        self._log = log.bind(exporter="traces")
        self._started = datetime.datetime.now(datetime.UTC)
        self._turns: collections.OrderedDict[str, _Turn] = collections.OrderedDict()
        self._ended: collections.OrderedDict[str, str] = collections.OrderedDict()
        """sid -> the turn that ended last (an event of it recorded after its end, an automatic
        title, is not the start of a turn)."""
        self._resource = Resource.create({service_attributes.SERVICE_NAME: self.cfg.service_name,
                                          service_attributes.SERVICE_VERSION: __version__})
        self._exporter = OTLPSpanExporter(endpoint=self.url, timeout=self.cfg.timeout_s)
        self.state = "starting"
        self.error = None

    def provider_of(self, model: str) -> str | None:
        p = self._models.provider(model)
        return p.kind if p is not None else "coxswain"

    # ------------------------------------------------------------ the loop
    async def run(self) -> None:
        try:
            await self._keep_consuming("traces", CONSUMER)
        finally:
            with contextlib.suppress(Exception):
                await asyncio.to_thread(self._exporter.shutdown)

    def _config(self) -> api.ConsumerConfig:
        return api.ConsumerConfig(
            name=CONSUMER, durable_name=CONSUMER, description="coxswain traces (OTLP)",
            filter_subject=subjects.EVENTS_WILDCARD, ack_policy=api.AckPolicy.EXPLICIT,
            # A new exporter starts with the events recorded since this gateway started; an
            # existing consumer keeps its place.
            deliver_policy=api.DeliverPolicy.BY_START_TIME, opt_start_time=self._started,
            ack_wait=self.cfg.timeout_s + ACK_WAIT_EXTRA_S, max_deliver=-1, max_ack_pending=MAX_ACK_PENDING,
        )

    async def _subscribe(self) -> Any:
        return await consumers.bind(self._js, self._config(), self._log, "traces")

    async def _consume(self, sub: Any) -> None:
        while True:
            try:
                msgs = await sub.fetch(batch=FETCH_BATCH, timeout=FETCH_WAIT_S)
            except nats.errors.TimeoutError:
                continue
            for msg in msgs:
                await self.take(msg)

    async def take(self, msg: Msg) -> None:
        """One message of the stream: its events seen in order. A ``turn.end`` always ends its
        message (``eventlog``), so the message is acknowledged once the turn it ends is exported."""
        try:
            evs = eventlog.events_in(msg.data)
        except ValueError:
            evs = []
        for ev in evs:
            if not isinstance(ev, dict) or not ev.get("sid"):
                continue
            done = self.see(ev)
            if done is not None:
                await self._export(msg, ev, done)
                return
        await msg.ack()

    def see(self, ev: dict[str, Any]) -> list[dict[str, Any]] | None:
        """Keep an event of a session's turn; at a ``turn.end`` the turn's events when they were
        all seen here (``[]`` when they must be read again from the stream), else None."""
        sid, type_, turn_id = str(ev["sid"]), ev.get("type"), ev.get("turn_id")
        cur = self._turns.get(sid)
        if turn_id and self._ended.get(sid) == turn_id and type_ != "turn.end":
            return None
        if turn_id and (cur is None or cur.turn_id != turn_id):
            # The first event of a turn begins it (its user.msg); any other first sight of a
            # turn (it began before this gateway, or elsewhere) is kept as not whole.
            cur = _Turn(str(turn_id), ev)
            cur.whole = type_ == "user.msg"
            self._turns[sid] = cur
            self._turns.move_to_end(sid)
            while len(self._turns) > MAX_SESSIONS:
                self._turns.popitem(last=False)
        elif cur is not None:
            if int(ev.get("seq") or 0) <= cur.last and type_ != "turn.end":
                return None  # seen already (redelivered)
            cur.add(ev)
        if type_ != "turn.end" or not turn_id:
            return None
        self._turns.pop(sid, None)
        self._ended[sid] = str(turn_id)
        self._ended.move_to_end(sid)
        while len(self._ended) > MAX_SESSIONS:
            self._ended.popitem(last=False)
        if cur is not None and cur.whole and cur.turn_id == turn_id:
            return cur.events
        return []

    async def _reread(self, sid: str, turn_id: str, until: int) -> list[dict[str, Any]]:
        """The turn's events as the stream holds them (the session's log up to its turn.end)."""
        metrics.TRACE_REREADS.inc()
        log: list[dict[str, Any]] = []
        loop = asyncio.get_running_loop()
        deadline = loop.time() + REREAD_TIMEOUT_S
        async with eventlog.EventFeed(self._js, sid) as feed:
            while feed.last < until and loop.time() < deadline:
                batch = await feed.next(timeout=1.0)
                log.extend(compact(e) for e in batch if int(e.get("seq") or 0) <= until)
            if feed.last < until:
                raise TimeoutError(f"the stream gave seq {feed.last} of {until} in {REREAD_TIMEOUT_S:g} s")
        return traces.turn_events(log, turn_id)

    async def _copied(self, sid: str, end: dict[str, Any]) -> bool:
        """Is this turn one a fork copied into its log? Then the ``session.forked`` recorded in
        the same call (same ``ts``) follows it in the stream."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + COPY_WAIT_S
        async with eventlog.EventFeed(self._js, sid, after=int(end.get("seq") or 0)) as feed:
            while (left := deadline - loop.time()) > 0:
                for e in await feed.next(timeout=left):
                    if e.get("ts") != end.get("ts"):
                        return False  # recorded later: not one call with the turn
                    if e.get("type") == "session.forked":
                        return True
        return False

    async def _export(self, msg: Msg, end: dict[str, Any], evs: list[dict[str, Any]]) -> None:
        sid, turn_id = str(end["sid"]), str(end["turn_id"])
        meta = msg.metadata
        attempt = int(meta.num_delivered or 1)
        where = {"sid": sid, "turn_id": turn_id, "attempt": attempt}
        try:
            if not evs:
                evs = await self._reread(sid, turn_id, int(end.get("seq") or 0))
            if traces.one_instant(evs) and await self._copied(sid, end):
                await msg.ack()  # a fork's copy of a turn another session ran (and exported)
                return
            spans = traces.turn_spans(evs, self.provider_of)
            if spans and spans[0].sampled:
                result = await asyncio.to_thread(self._exporter.export, to_sdk(spans, self._resource))
            else:
                result = SpanExportResult.SUCCESS  # nothing to send (the caller's trace is not sampled)
        except (nats.errors.Error, OSError) as exc:  # TimeoutError included
            self._log.warning("traces.reread_failed", error=logged(exc), **where)
            result = SpanExportResult.FAILURE
            spans = []
        except Exception as exc:  # noqa: BLE001 - a bug: seen once, and the turn is not tried forever
            self._log.error("traces.failed", error=logged(exc), exc_info=exc, **where)
            with contextlib.suppress(nats.errors.Error):
                await msg.term()
            return
        try:
            if result == SpanExportResult.SUCCESS:
                await msg.ack()
                metrics.TRACE_TURNS.labels("ok").inc()
                metrics.TRACE_SPANS.inc(len(spans))
                self._log.debug("traces.exported", spans=len(spans), **where)
                return
            metrics.TRACE_TURNS.labels("failed").inc()
            if attempt >= MAX_ATTEMPTS:
                await msg.term()
                self._log.warning("traces.gave_up", **where)
                return
            delay = min(60.0, 2.0 ** min(attempt, 6))
            await msg.nak(delay=delay)
            self._log.info("traces.retry", delay_s=delay, **where)
        except nats.errors.Error as exc:
            self._log.warning("traces.ack_lost", error=logged(exc), **where)

    async def health(self) -> dict[str, Any]:
        out: dict[str, Any] = {"state": self.state, "turns_open": len(self._turns)}
        if self.error:
            out["error"] = self.error
        return out
