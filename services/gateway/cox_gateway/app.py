"""The HTTP API (docs/api.md). Reads come from Redis and JetStream; every change is a NATS request
to a turn-runner (or versions), which decides it atomically in Redis."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

from fastapi import Depends, FastAPI, Query, Request, Response
from fastapi import Path as PathParam
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel

from coxswain import __version__, archive, eventlog, keys, rpc, session_view, subjects
from coxswain.errors import Invalid, NotFound, Unavailable
from coxswain.events import check_text
from coxswain.ids import ID_RE
from coxswain.models import (
    ApprovalAnswer,
    ApprovalCmd,
    ChangesRequest,
    CompactBody,
    CompactCmd,
    CompactResult,
    CreateCmd,
    CreateSession,
    DiffRequest,
    DiffResult,
    ForkBody,
    ForkCmd,
    LeadCmd,
    LeadMessage,
    LeadResult,
    ListVersionsRequest,
    ListVersionsResult,
    ObserveBody,
    ObserveCmd,
    PatchCmd,
    PatchSession,
    QueueOrder,
    QueueOrderCmd,
    QueueRemoveCmd,
    QueueResult,
    RestoreCmd,
    RewindBody,
    RewindCmd,
    RewindResult,
    SendCmd,
    SendMessage,
    SendResult,
    Session,
    StopCmd,
    StopResult,
    UndoCmd,
    UndoRequest,
    UndoTarget,
    WorkspacesCmd,
    WorkspacesResult,
    WriteOutcome,
)

from . import errors, metrics, streams

if TYPE_CHECKING:
    from .service import Gateway

Q = TypeVar("Q", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


async def _principal(request: Request) -> str:
    """The principal the bearer token names (401 otherwise)."""
    return str(request.app.state.gw.auth.principal(request))


Principal = Annotated[str, Depends(_principal)]
Sid = Annotated[str, PathParam(pattern=ID_RE.pattern, description="session id")]
VersionId = Annotated[str, PathParam(pattern=ID_RE.pattern)]
STATIC = Path(__file__).parent / "static"
MAX_WAIT_S = 60.0


def create_app(gw: Gateway) -> FastAPI:
    app = FastAPI(title="coxswain", version=__version__)
    app.state.gw = gw
    errors.install(app, max_body=gw.settings.max_body, root=gw.settings.root)
    app.add_middleware(metrics.Middleware)

    async def call(op: rpc.Op[Q, R], request: Q) -> R:
        return await rpc.call(gw.nc, op, request)

    async def owned(sid: str, who: str) -> dict[str, str]:
        h: dict[str, str] = await gw.redis.hgetall(keys.session(sid))
        if not h:
            entry = await gw.archived(sid)  # an archived session reads from the archive
            # no entry: it may have been loaded back (and its entry deleted) meanwhile: look again
            h = archive.hash_of(entry) if entry is not None else await gw.redis.hgetall(keys.session(sid))
        if not h or h.get("principal") != who:
            raise NotFound("no such session")
        return h

    # ------------------------------------------------------------------ sessions
    @app.get("/v1/sessions")
    async def list_sessions(who: Principal, limit: Annotated[int, Query(ge=1, le=500)] = 100) -> list[Session]:
        sids = await gw.redis.zrevrange(keys.principal(who), 0, limit - 1)
        views = await asyncio.gather(*(view_of(s, who) for s in sids))
        return [v for v in views if v is not None]

    async def view_of(sid: str, who: str) -> Session | None:
        """The session as Redis has it, or as the archive has it when it was archived."""
        view = await session_view.load(gw.redis, sid, who, gw.settings.sandbox, gw.settings.mcp)
        if view is None:
            entry = await gw.archived(sid)
            if entry is not None:
                view = archive.view(entry, who, gw.settings.sandbox, gw.settings.mcp)
            else:  # it may have been loaded back (and its entry deleted) meanwhile: look again
                view = await session_view.load(gw.redis, sid, who, gw.settings.sandbox, gw.settings.mcp)
        return view

    @app.get("/v1/models")
    async def list_models(who: Principal) -> dict[str, Any]:
        """The model names a session may choose (for a client's model picker) and the default."""
        return {"default": gw.settings.model.default, "models": sorted(gw.settings.model.names())}

    @app.post("/v1/sessions", status_code=201)
    async def create_session(body: CreateSession, who: Principal) -> Session:
        return await call(rpc.RUNNER_CREATE, CreateCmd(principal=who, **body.model_dump()))

    @app.get("/v1/sessions/{sid}")
    async def get_session(sid: Sid, who: Principal) -> Session:
        view = await view_of(sid, who)
        if view is None:
            raise NotFound("no such session")
        return view

    @app.patch("/v1/sessions/{sid}")
    async def patch_session(sid: Sid, body: PatchSession, who: Principal) -> Session:
        return await call(rpc.RUNNER_PATCH, PatchCmd(principal=who, sid=sid, **body.model_dump()))

    # ------------------------------------------------------------------ steering
    @app.post("/v1/sessions/{sid}/messages", status_code=202)
    async def send(sid: Sid, body: SendMessage, who: Principal) -> SendResult:
        check_text(body.text)  # 413 before it travels: what is accepted must be recordable
        return await call(rpc.RUNNER_SEND, SendCmd(principal=who, sid=sid, **body.model_dump()))

    @app.post("/v1/sessions/{sid}/lead", status_code=202)
    async def lead(sid: Sid, body: LeadMessage, who: Principal) -> LeadResult:
        return await call(rpc.RUNNER_LEAD, LeadCmd(principal=who, sid=sid, **body.model_dump()))

    @app.post("/v1/sessions/{sid}/stop")
    async def stop(sid: Sid, who: Principal) -> StopResult:
        return await call(rpc.RUNNER_STOP, StopCmd(principal=who, sid=sid))

    @app.post("/v1/sessions/{sid}/approvals/{aid}")
    async def answer(sid: Sid, aid: VersionId, body: ApprovalAnswer, who: Principal) -> dict[str, Any]:
        await call(rpc.RUNNER_ANSWER, ApprovalCmd(principal=who, sid=sid, approval_id=aid, **body.model_dump()))
        return {"ok": True, "approval_id": aid, "decision": body.decision}

    @app.delete("/v1/sessions/{sid}/queue/{mid}")
    async def queue_remove(sid: Sid, mid: VersionId, who: Principal) -> QueueResult:
        """Remove a queued message before it starts (recorded as ``queue.removed``); 409 ``not_queued`` after."""
        return await call(rpc.RUNNER_QUEUE_REMOVE, QueueRemoveCmd(principal=who, sid=sid, message_id=mid))

    @app.put("/v1/sessions/{sid}/queue/order")
    async def queue_order(sid: Sid, body: QueueOrder, who: Principal) -> QueueResult:
        """Reorder the queue: every queued message id once, in the new order (``queue.reordered``)."""
        return await call(rpc.RUNNER_QUEUE_ORDER, QueueOrderCmd(principal=who, sid=sid, **body.model_dump()))

    @app.get("/v1/workspaces")
    async def list_workspaces(who: Principal) -> WorkspacesResult:
        """The folders under the root a new session may use (so a typo need not make a new one)."""
        return await call(rpc.RUNNER_WORKSPACES, WorkspacesCmd(principal=who))

    @app.post("/v1/sessions/{sid}/compact")
    async def compact(sid: Sid, who: Principal, body: CompactBody | None = None) -> CompactResult:
        """Compact the transcript between turns (``context.compacted``); 409 ``busy`` during a turn."""
        focus = body.focus if body is not None else None
        return await call(rpc.RUNNER_COMPACT, CompactCmd(principal=who, sid=sid, focus=focus))

    @app.post("/v1/sessions/{sid}/observe", status_code=202)
    async def observe(sid: Sid, body: ObserveBody, who: Principal) -> dict[str, Any]:
        await call(rpc.RUNNER_OBSERVE, ObserveCmd(principal=who, sid=sid, **body.model_dump()))
        return {"ok": True}

    # ------------------------------------------------------------------ versions
    @app.get("/v1/sessions/{sid}/changes")
    async def changes(sid: Sid, who: Principal) -> dict[str, Any]:
        h = await owned(sid, who)
        res = await call(rpc.VERSIONS_CHANGES, ChangesRequest(sid=sid, workspace=h["workspace"]))
        return res.model_dump(mode="json")

    @app.get("/v1/sessions/{sid}/versions")
    async def list_versions(sid: Sid, who: Principal,
                            path: Annotated[str, Query(min_length=1, max_length=4096)]) -> ListVersionsResult:
        h = await owned(sid, who)
        return await call(rpc.VERSIONS_LIST, ListVersionsRequest(sid=sid, workspace=h["workspace"], path=path))

    @app.get("/v1/sessions/{sid}/versions/{vid}/diff")
    async def diff(sid: Sid, vid: VersionId, who: Principal) -> DiffResult:
        h = await owned(sid, who)
        return await call(rpc.VERSIONS_DIFF, DiffRequest(sid=sid, workspace=h["workspace"], version_id=vid))

    @app.post("/v1/sessions/{sid}/versions/{vid}/restore")
    async def restore(sid: Sid, vid: VersionId, who: Principal) -> WriteOutcome:
        return await call(rpc.RUNNER_RESTORE, RestoreCmd(principal=who, sid=sid, version_id=vid))

    @app.get("/v1/sessions/{sid}/undo")
    async def undo_target(sid: Sid, who: Principal) -> UndoTarget:
        """What undo would put back now (read only), so a client can name it before the person asks."""
        h = await owned(sid, who)
        return await call(rpc.VERSIONS_UNDO_TARGET, UndoRequest(sid=sid, workspace=h["workspace"]))

    @app.post("/v1/sessions/{sid}/undo")
    async def undo(sid: Sid, who: Principal) -> WriteOutcome:
        return await call(rpc.RUNNER_UNDO, UndoCmd(principal=who, sid=sid))

    # ------------------------------------------------------------------ fork and rewind
    @app.post("/v1/sessions/{sid}/fork", status_code=201)
    async def fork(sid: Sid, body: ForkBody, who: Principal) -> Session:
        """A new session: the transcript up to the end of turn ``at_turn``, the files as they were then."""
        return await call(rpc.RUNNER_FORK, ForkCmd(principal=who, sid=sid, **body.model_dump()))

    @app.post("/v1/sessions/{sid}/rewind")
    async def rewind(sid: Sid, body: RewindBody, who: Principal) -> RewindResult:
        """Between turns: back to the end of turn ``to_turn`` (``session.rewound``); 409 ``busy`` during a turn."""
        return await call(rpc.RUNNER_REWIND, RewindCmd(principal=who, sid=sid, **body.model_dump()))

    # ------------------------------------------------------------------ events
    @app.get("/v1/sessions/{sid}/events", response_model=None)
    async def events(
        sid: Sid, request: Request, who: Principal,
        after: Annotated[int | None, Query(ge=0)] = None,
        format: Annotated[str, Query(pattern="^(sse|json)$")] = "sse",
        wait: Annotated[float, Query(ge=0, le=MAX_WAIT_S)] = 0.0,
        limit: Annotated[int, Query(ge=1, le=10_000)] = 1000,
    ) -> Response:
        h = await owned(sid, who)
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
                return JSONResponse(await eventlog.backlog(gw.js, sid, start, int(h.get("seq") or 0), limit))
            with gw.slots.hold(who):
                async with eventlog.Tail(gw.hub, gw.js, sid, start, gw.seq_now(sid)) as tail:
                    out = await tail.next(timeout=wait, limit=limit)
            return JSONResponse(out)
        gw.slots.take(who)  # given back when the stream ends (streams.EventStream)
        return streams.EventStream(gw, sid, start, who)

    # ------------------------------------------------------------------ operations
    @app.get("/healthz")
    async def healthz() -> JSONResponse:
        checks = await asyncio.gather(*(_health(gw, s) for s in subjects.SERVICES))
        services = dict(zip(subjects.SERVICES, checks, strict=True))
        ok = all(c.get("ok") for c in checks)
        sandbox = gw.settings.sandbox
        body = {"ok": ok, "services": services,
                "sandbox": {"mode": sandbox.mode, "network": sandbox.network,
                            # configured; whether cgroups enforce them: services.runner.detail.sandbox.limits
                            "limits": {k: getattr(sandbox, k) for k in ("max_processes", "memory_mb", "cpu_seconds",
                                                                        "file_mb", "workspace_mb", "workspace_files")},
                            **({"warning": "commands run WITHOUT a sandbox ([sandbox] mode = \"none\")"}
                               if sandbox.mode == "none" else {})},
                "notify": await gw.notifier.health()}
        return JSONResponse(body, status_code=200 if ok else 503)

    @app.get("/metrics")
    async def prometheus() -> Response:
        return metrics.render()

    @app.get("/", include_in_schema=False, response_model=None)
    async def console() -> Response:
        index = STATIC / "index.html"
        if index.exists():
            return FileResponse(index, headers={"Cache-Control": "no-store"})
        return JSONResponse({"service": "coxswain", "version": __version__, "api": "/docs"})

    if STATIC.exists():
        from fastapi.staticfiles import StaticFiles

        app.mount("/static", StaticFiles(directory=STATIC), name="static")
    return app


async def _health(gw: Gateway, service: str) -> dict[str, Any]:
    try:
        health = await rpc.call(gw.nc, rpc.HEALTH[service], rpc.NoRequest())
        return {"ok": True, **health.model_dump(mode="json")}
    except Unavailable as exc:
        return {"ok": False, "detail": exc.detail}
    except Exception as exc:  # noqa: BLE001 - any failure is "not healthy"
        return {"ok": False, "detail": repr(exc)}
