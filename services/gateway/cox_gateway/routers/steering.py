"""Steering a session while it works: a message (now, queued or as the next turn), a Lead into
the running turn, Stop, an approval's answer, the queue, a command the person ran (observe)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, Request

from coxswain import rpc, traces
from coxswain.events import check_text
from coxswain.models import (
    ApprovalAnswer,
    ApprovalCmd,
    LeadCmd,
    LeadMessage,
    LeadResult,
    ObserveBody,
    ObserveCmd,
    ProgramStopCmd,
    QueueOrder,
    QueueOrderCmd,
    QueueRemoveCmd,
    QueueResult,
    SendCmd,
    SendMessage,
    SendResult,
    StopBody,
    StopCmd,
    StopResult,
)

from .. import errors
from ..deps import BEARER_SECURITY, Deps, Principal, ReadsDep, ServicesDep, Sid, VersionId, caller

router = APIRouter(responses=errors.responses(401, 403, 404, 422, 503))


# A send and a Lead are the routes of every turn: they take their parts from ``caller`` (deps.py).
@router.post("/v1/sessions/{sid}/messages", status_code=202, responses=errors.responses(400, 409, 413),
             openapi_extra=BEARER_SECURITY)
async def send(sid: Sid, body: SendMessage, request: Request,
               traceparent: Annotated[str | None, Header(max_length=512)] = None) -> SendResult:
    """``traceparent`` (W3C trace context): the turn this message starts is exported as a child of
    that span ([telemetry] otlp_endpoint); one that is not valid is ignored."""
    deps, who = caller(request)
    return await send_message(deps, who, sid, body, traceparent)


async def send_message(deps: Deps, who: str, sid: str, body: SendMessage, traceparent: str | None) -> SendResult:
    """The send route's work, once its parts are read: also what :mod:`..turnpath` runs."""
    check_text(body.text)  # 413 before it travels: what is accepted must be recordable
    tp = traces.valid_traceparent(traceparent)
    return await deps.reads.write(sid, who, lambda p: deps.services.call(rpc.RUNNER_SEND, SendCmd(
        principal=p, sid=sid, **body.model_dump(), traceparent=tp)))


@router.post("/v1/sessions/{sid}/lead", status_code=202, responses=errors.responses(400, 409, 413, 429),
             openapi_extra=BEARER_SECURITY)
async def lead(sid: Sid, body: LeadMessage, request: Request) -> LeadResult:
    deps, who = caller(request)
    return await deps.reads.write(sid, who, lambda p: deps.services.call(
        rpc.RUNNER_LEAD, LeadCmd(principal=p, sid=sid, **body.model_dump())))


@router.post("/v1/sessions/{sid}/stop", responses=errors.responses(400, 413))
async def stop(sid: Sid, services: ServicesDep, reads: ReadsDep, who: Principal,
               body: StopBody | None = None) -> StopResult:
    """Stop the turn and discard the queue; with ``{"programs": true}`` the session's programs too."""
    programs = bool(body and body.programs)
    return await reads.approve(sid, who, lambda p: services.call(rpc.RUNNER_STOP, StopCmd(
        principal=p, sid=sid, programs=programs)))


@router.post("/v1/sessions/{sid}/approvals/{aid}", responses=errors.responses(400, 409, 413))
async def answer(sid: Sid, aid: VersionId, body: ApprovalAnswer, services: ServicesDep, reads: ReadsDep, who: Principal) -> dict[str, Any]:
    await reads.approve(sid, who, lambda p: services.call(rpc.RUNNER_ANSWER, ApprovalCmd(principal=p, sid=sid, approval_id=aid, **body.model_dump())))
    return {"ok": True, "approval_id": aid, "decision": body.decision}


@router.delete("/v1/sessions/{sid}/queue/{mid}", responses=errors.responses(409))
async def queue_remove(sid: Sid, mid: VersionId, services: ServicesDep, reads: ReadsDep, who: Principal) -> QueueResult:
    """Remove a queued message before it starts (recorded as ``queue.removed``); 409 ``not_queued`` after."""
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_QUEUE_REMOVE, QueueRemoveCmd(principal=p, sid=sid, message_id=mid)))


@router.put("/v1/sessions/{sid}/queue/order", responses=errors.responses(400, 409, 413))
async def queue_order(sid: Sid, body: QueueOrder, services: ServicesDep, reads: ReadsDep, who: Principal) -> QueueResult:
    """Reorder the queue: every queued message id once, in the new order (``queue.reordered``)."""
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_QUEUE_ORDER, QueueOrderCmd(principal=p, sid=sid, **body.model_dump())))


@router.post("/v1/sessions/{sid}/programs/{program_id}/stop", status_code=202)
async def program_stop(sid: Sid, program_id: VersionId, services: ServicesDep, reads: ReadsDep,
                       who: Principal) -> dict[str, Any]:
    """Stop one of the session's programs (``program.stopped`` by ``person``, recorded when it ended)."""
    await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_PROGRAM_STOP, ProgramStopCmd(
        principal=p, sid=sid, program_id=program_id)))
    return {"ok": True, "program_id": program_id}


@router.post("/v1/sessions/{sid}/observe", status_code=202, responses=errors.responses(400, 409, 413))
async def observe(sid: Sid, body: ObserveBody, services: ServicesDep, reads: ReadsDep, who: Principal) -> dict[str, Any]:
    await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_OBSERVE, ObserveCmd(principal=p, sid=sid, **body.model_dump())))
    return {"ok": True}
