"""A session's transcript at a turn boundary: compact it, fork a new session from the end of a
turn, rewind to the end of one. Each is refused (409 ``busy``) while a turn runs."""

from __future__ import annotations

from fastapi import APIRouter

from coxswain import rpc
from coxswain.models import (
    CompactBody,
    CompactCmd,
    CompactResult,
    ForkBody,
    ForkCmd,
    RewindBody,
    RewindCmd,
    RewindResult,
    Session,
)

from .. import errors
from ..deps import Principal, ReadsDep, ServicesDep, Sid

router = APIRouter(responses=errors.responses(400, 401, 403, 404, 409, 413, 422, 503))


@router.post("/v1/sessions/{sid}/compact")
async def compact(sid: Sid, services: ServicesDep, reads: ReadsDep, who: Principal, body: CompactBody | None = None) -> CompactResult:
    """Compact the transcript between turns (``context.compacted``); 409 ``busy`` during a turn."""
    focus = body.focus if body is not None else None
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_COMPACT, CompactCmd(principal=p, sid=sid, focus=focus)))


@router.post("/v1/sessions/{sid}/fork", status_code=201, responses=errors.responses(410, 500))
async def fork(sid: Sid, body: ForkBody, services: ServicesDep, reads: ReadsDep, who: Principal) -> Session:
    """A new session: the transcript up to the end of turn ``at_turn``, the files as they were then."""
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_FORK, ForkCmd(principal=p, sid=sid, **body.model_dump())))


@router.post("/v1/sessions/{sid}/rewind", responses=errors.responses(410))
async def rewind(sid: Sid, body: RewindBody, services: ServicesDep, reads: ReadsDep, who: Principal) -> RewindResult:
    """Between turns: back to the end of turn ``to_turn`` (``session.rewound``); 409 ``busy`` during a turn."""
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_REWIND, RewindCmd(principal=p, sid=sid, **body.model_dump())))
