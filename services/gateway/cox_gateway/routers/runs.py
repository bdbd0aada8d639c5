"""Runs: sessions whose turns the program drives (start one, list them), and the check a
benchmark runs in a session's workspace after its run (docs/api.md, "Runs")."""

from __future__ import annotations

import asyncio
from typing import Annotated, Literal

from fastapi import APIRouter, Header, Query, Response

from coxswain import keys, rpc, traces
from coxswain.models import CheckBody, CheckCmd, CheckResult, CreateRun, RunCmd, RunCreated, RunsResult

from .. import errors
from ..deps import Principal, ReadsDep, ServicesDep, Sid

router = APIRouter(responses=errors.responses(401, 503))


@router.post("/v1/runs", status_code=201, responses={
    200: {"model": RunCreated, "description": "the run a POST with this `client_id` made before (`replay: true`)"},
    **errors.responses(400, 403, 404, 409, 413, 422)})
async def start_run(body: CreateRun, services: ServicesDep, reads: ReadsDep, who: Principal, response: Response,
                    traceparent: Annotated[str | None, Header(max_length=512)] = None) -> RunCreated:
    """A session whose turns the program drives until one completes (or ``max_turns``); with a
    ``client_id`` the caller used before, that run again (200, ``replay: true``). ``traceparent``
    (W3C trace context): each of its turns is exported as a child of that span."""
    reads.create(who)
    made: RunCreated = await services.call(rpc.RUNNER_RUN, RunCmd(principal=who, **body.model_dump(),
                                                                  traceparent=traces.valid_traceparent(traceparent)))
    if made.replay:
        response.status_code = 200
    return made


@router.get("/v1/runs", responses=errors.responses(422))
async def list_runs(reads: ReadsDep, who: Principal, state: Literal["running", "ended"] | None = None,
                    limit: Annotated[int, Query(ge=1, le=10_000)] = 1000) -> RunsResult:
    """The caller's runs, newest first (``state`` filters)."""
    sids = await reads.redis.zrevrange(keys.runs_of(who), 0, limit - 1)
    views = await asyncio.gather(*(reads.view(s, who) for s in sids))
    return RunsResult(runs=[v for v in views
                            if v is not None and v.run is not None and (state is None or v.run.state == state)])


@router.post("/v1/sessions/{sid}/check", responses=errors.responses(400, 403, 404, 409, 413, 422))
async def check(sid: Sid, body: CheckBody, services: ServicesDep, reads: ReadsDep, who: Principal) -> CheckResult:
    """Run the owner's command in the sandbox in the session's workspace (no approval; 409
    ``busy`` while a turn runs); recorded as a ``check`` event. Exit code 0 is a pass."""
    return await reads.write(sid, who, lambda p: services.call(rpc.RUNNER_CHECK,
                                                               CheckCmd(principal=p, sid=sid, **body.model_dump())))
