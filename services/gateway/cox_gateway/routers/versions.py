"""Versions of a session's files: the Changes view, a file's versions, a diff, restore, undo.
Reads go to the versions service; restore and undo are changes, so they go through a
turn-runner (which refuses them during a turn)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query

from coxswain import rpc
from coxswain.models import (
    ChangesRequest,
    DiffRequest,
    DiffResult,
    ListVersionsRequest,
    ListVersionsResult,
    RestoreCmd,
    UndoCmd,
    UndoRequest,
    UndoTarget,
    WriteOutcome,
)

from .. import errors
from ..deps import Principal, ReadsDep, ServicesDep, Sid, VersionId

router = APIRouter(responses=errors.responses(401, 404, 422, 503))


@router.get("/v1/sessions/{sid}/changes")
async def changes(sid: Sid, services: ServicesDep, reads: ReadsDep, who: Principal) -> dict[str, Any]:
    h = await reads.owned(sid, who)
    res = await services.call(rpc.VERSIONS_CHANGES, ChangesRequest(sid=sid, workspace=h["workspace"]))
    return res.model_dump(mode="json")


@router.get("/v1/sessions/{sid}/versions")
async def list_versions(sid: Sid, services: ServicesDep, reads: ReadsDep, who: Principal,
                        path: Annotated[str, Query(min_length=1, max_length=4096)]) -> ListVersionsResult:
    h = await reads.owned(sid, who)
    return await services.call(rpc.VERSIONS_LIST, ListVersionsRequest(sid=sid, workspace=h["workspace"], path=path))


@router.get("/v1/sessions/{sid}/versions/{vid}/diff", responses=errors.responses(403, 410))
async def diff(sid: Sid, vid: VersionId, services: ServicesDep, reads: ReadsDep, who: Principal) -> DiffResult:
    h = await reads.owned(sid, who)
    return await services.call(rpc.VERSIONS_DIFF, DiffRequest(sid=sid, workspace=h["workspace"], version_id=vid))


@router.post("/v1/sessions/{sid}/versions/{vid}/restore", responses=errors.responses(403, 409, 410))
async def restore(sid: Sid, vid: VersionId, services: ServicesDep, reads: ReadsDep, who: Principal) -> WriteOutcome:
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_RESTORE, RestoreCmd(principal=p, sid=sid, version_id=vid)))


@router.get("/v1/sessions/{sid}/undo")
async def undo_target(sid: Sid, services: ServicesDep, reads: ReadsDep, who: Principal) -> UndoTarget:
    """What undo would put back now (read only), so a client can name it before the person asks."""
    h = await reads.owned(sid, who)
    return await services.call(rpc.VERSIONS_UNDO_TARGET, UndoRequest(sid=sid, workspace=h["workspace"]))


@router.post("/v1/sessions/{sid}/undo", responses=errors.responses(403, 409, 410))
async def undo(sid: Sid, services: ServicesDep, reads: ReadsDep, who: Principal) -> WriteOutcome:
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_UNDO, UndoCmd(principal=p, sid=sid)))
