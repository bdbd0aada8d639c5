"""A session's event log: its backlog and then its live events, as SSE or as JSON pages
(docs/api.md, "Reading events"). The streams' bounds are in :mod:`cox_gateway.streams`."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Request, Response
from fastapi.responses import JSONResponse

from coxswain import eventlog
from coxswain.errors import Invalid

from .. import errors
from ..deps import Principal, ReadsDep, Sid, StreamsDep
from ..streams import EventStream

router = APIRouter(responses=errors.responses(401, 404, 422, 429, 503))
MAX_WAIT_S = 60.0
EVENTS = {"description": "`text/event-stream` (the default): the backlog after `after`, then live events, "
                         "each `id: seq`, `event: type`, `data: event`; with `format=json`, a JSON array of events",
          "content": {"text/event-stream": {"schema": {"type": "string"}},
                      "application/json": {"schema": {"type": "array", "items": {
                          "type": "object", "required": ["seq", "type"]}}}}}


@router.get("/v1/sessions/{sid}/events", response_model=None, responses={200: EVENTS})
async def events(
    sid: Sid, request: Request, reads: ReadsDep, streams: StreamsDep, who: Principal,
    after: Annotated[int | None, Query(ge=0)] = None,
    format: Annotated[str, Query(pattern="^(sse|json)$")] = "sse",
    wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
) -> Response:
    h = await reads.owned(sid, who)
    start = after
    if start is None:
        last_id = request.headers.get("last-event-id")
        if last_id:
            try:
                start = int(last_id)
            except ValueError as exc:
                raise Invalid("Last-Event-ID must be an event seq") from exc
    start = start or 0
    if format == "json":
        if wait <= 0:
            return JSONResponse(await eventlog.backlog(streams.js, sid, start, int(h.get("seq") or 0), limit))
        with streams.slots.hold(who):
            async with streams.tail(sid, start, reads.seq_now(sid)) as tail:
                out = await tail.next(timeout=wait, limit=limit)
        return JSONResponse(out)
    streams.slots.take(who)  # given back when the stream ends (EventStream)
    shared = h.get("principal") != who and reads.role(who) != "admin"
    return EventStream(streams, sid, start, who, reads.seq_now(sid), shared=shared)
