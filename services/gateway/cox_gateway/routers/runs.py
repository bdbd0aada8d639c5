"""Runs: sessions whose turns the program drives (start one, list them), and the check a
benchmark runs in a session's workspace after its run (docs/api.md, "Runs")."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable
from typing import Annotated, Any, Literal, TypeVar

import redis.exceptions as redis_errors
from fastapi import APIRouter, Header, Query, Response

from coxswain import keys, rpc, traces
from coxswain.errors import Unavailable
from coxswain.models import CheckBody, CheckCmd, CheckResult, CreateRun, RunCmd, RunCreated, RunsResult

from .. import errors
from ..deps import Principal, ReadsDep, ServicesDep, Sid

T = TypeVar("T")

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
    lease_ms = reads.settings.runner.lease_ms
    return await reads.write(sid, who, lambda p: while_held(
        services.call(rpc.RUNNER_CHECK, CheckCmd(principal=p, sid=sid, **body.model_dump())),
        holder_gone(reads.redis, sid, lease_ms)))


REPLY_GRACE_S = 1.0
"""A reply that was on its way as the lease went (the check just ended and let it go) still wins."""
GONE_STEP_S = 0.05
"""How often :func:`holder_gone` looks whether a takeover has freed the session."""


async def holder_gone(redis: Any, sid: str, lease_ms: int) -> None:
    """Return once the lease the operation took is gone or another's: its runner died (or lost it),
    and the session is free for the check to be sent again.

    A check runs under the session's lease (its runner renews it); the request itself has no one
    left to answer it when that runner dies, and would wait for its bound (600 s). Read every
    half lease: the first token seen is the operation's; none within two leases of the request
    means no runner took it. Once the token is gone, the session stays busy until another runner
    takes it over (within a quarter lease) and ends the dead operation: the 503 waits for that
    (read every ``GONE_STEP_S``, for at most two leases), so that sending the check again is not
    met by 409 ``busy``. A turn that the takeover started (a message queued meanwhile) is a
    real ``busy``. Redis unreachable reads as no news (the call fails by itself then)."""
    key = keys.session(sid) + keys.LEASE
    step = max(0.1, lease_ms / 2000)
    loop = asyncio.get_running_loop()
    since = loop.time()
    seen: str | None = None
    gone_at: float | None = None
    while True:
        await asyncio.sleep(step if gone_at is None else GONE_STEP_S)
        try:
            if gone_at is not None:
                busy, turn_id = await redis.hmget(keys.session(sid), "busy", "turn_id")
                if busy != "1" or turn_id or loop.time() - gone_at > 2 * lease_ms / 1000:
                    return
                continue
            cur = await redis.get(key)
        except redis_errors.RedisError:
            continue
        if seen is None:
            if cur is not None:
                seen = cur
            elif loop.time() - since > 2 * lease_ms / 1000:
                return
        elif cur != seen:
            gone_at = loop.time()


async def while_held(call: Awaitable[T], gone: Awaitable[None]) -> T:
    """``call``'s answer, or 503 ``unavailable`` once ``gone`` says its runner went away."""
    answer = asyncio.ensure_future(call)
    watch = asyncio.ensure_future(gone)
    try:
        await asyncio.wait({answer, watch}, return_when=asyncio.FIRST_COMPLETED)
        if not answer.done():
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(answer), REPLY_GRACE_S)
            raise Unavailable("the runner running the check went away (its lease lapsed); send it again")
        return answer.result()
    finally:
        for t in (answer, watch):
            t.cancel()
