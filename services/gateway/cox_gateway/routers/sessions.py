"""Sessions: list, create, read, change one; and what a new session may choose (its model,
its workspace)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from fastapi import Path as PathParam

from coxswain import rpc
from coxswain.errors import Forbidden, NotFound
from coxswain.ids import ID_RE
from coxswain.models import (
    CreateCmd,
    CreateSession,
    PatchCmd,
    PatchSession,
    Session,
    ShareBody,
    WorkspacesCmd,
    WorkspacesResult,
)

from .. import errors
from ..deps import Principal, ReadsDep, ServicesDep, SettingsDep, Sid

router = APIRouter(responses=errors.responses(401))


@router.get("/v1/sessions", responses=errors.responses(422, 503))
async def list_sessions(reads: ReadsDep, who: Principal,
                        limit: Annotated[int, Query(ge=1, le=500)] = 100) -> list[Session]:
    return await reads.listed(who, limit)


@router.get("/v1/models")
async def list_models(settings: SettingsDep, who: Principal) -> dict[str, Any]:
    """The model names a session may choose (for a client's model picker) and the default."""
    return {"default": settings.model.default, "models": sorted(settings.model.names())}


@router.post("/v1/sessions", status_code=201, responses=errors.responses(400, 403, 404, 409, 413, 422, 503))
async def create_session(body: CreateSession, services: ServicesDep, reads: ReadsDep, who: Principal) -> Session:
    reads.create(who)
    return await services.call(rpc.RUNNER_CREATE, CreateCmd(principal=who, **body.model_dump()))


@router.get("/v1/sessions/{sid}", responses=errors.responses(404, 422, 503))
async def get_session(sid: Sid, reads: ReadsDep, who: Principal) -> Session:
    view = await reads.view(sid, who)
    if view is None:
        raise NotFound("no such session")
    return view


@router.patch("/v1/sessions/{sid}", responses=errors.responses(400, 403, 404, 413, 422, 503))
async def patch_session(sid: Sid, body: PatchSession, services: ServicesDep, reads: ReadsDep, who: Principal) -> Session:
    budget = "spend_limit" in body.model_fields_set
    if budget and reads.role(who) != "admin":
        await reads.owned(sid, who)  # 404 unless the session is visible to them
        raise Forbidden("only an admin may change a session's daily spend budget (spend_limit)")
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_PATCH, PatchCmd(
        principal=p, sid=sid, spend_limit_set=budget, **body.model_dump())))


@router.post("/v1/sessions/{sid}/shares", responses=errors.responses(400, 403, 404, 413, 422, 503))
async def share(sid: Sid, body: ShareBody, services: ServicesDep, reads: ReadsDep, who: Principal) -> Session:
    """Share the session with ``principal`` as a ``reader`` or an ``approver`` (its owner or an
    admin; ``session.shared``); sharing again changes the role."""
    return await _sharing(sid, who, reads, lambda p: services.call(rpc.RUNNER_PATCH, PatchCmd(principal=p, sid=sid, share=body)))


@router.delete("/v1/sessions/{sid}/shares/{principal}", responses=errors.responses(403, 404, 422, 503))
async def unshare(sid: Sid, principal: Annotated[str, PathParam(pattern=ID_RE.pattern)], services: ServicesDep,
                  reads: ReadsDep, who: Principal) -> Session:
    """Take the share back (``session.unshared``): at once, the principal's open event streams
    of the session close."""
    return await _sharing(sid, who, reads,
                          lambda p: services.call(rpc.RUNNER_PATCH, PatchCmd(principal=p, sid=sid, unshare=principal)))


async def _sharing(sid: str, who: str, reads: Any, call: Any) -> Session:
    """Only the owner or an admin changes who a session is shared with (an approver: 403)."""
    view: Session = await reads.write(sid, who, call)
    return await reads.view(sid, who) or view


@router.get("/v1/workspaces", responses=errors.responses(503))
async def list_workspaces(services: ServicesDep, who: Principal) -> WorkspacesResult:
    """The folders under the root a new session may use (so a typo need not make a new one)."""
    return await services.call(rpc.RUNNER_WORKSPACES, WorkspacesCmd(principal=who))
