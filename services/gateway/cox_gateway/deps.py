"""What the routes need, built once when the gateway starts and reached through FastAPI
dependencies: a route names the parts it uses (``services: ServicesDep``, ``who: Principal``), never the
whole service.

``Deps`` lives in ``app.state.deps``; each ``...Dep`` below is an ``Annotated`` type whose
dependency returns one part of it. The dependencies are ``async`` (FastAPI runs a plain ``def``
dependency in a worker thread). The routes of every turn (a send, a Lead) take theirs from
:func:`caller` instead: each dependency node costs FastAPI some 10 µs a request.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any, TypeVar

from fastapi import Depends, Request
from fastapi import Path as PathParam
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from nats.aio.client import Client
from pydantic import BaseModel

from coxswain import rpc
from coxswain.config import Settings
from coxswain.errors import Unavailable
from coxswain.ids import ID_RE

from .auth import Auth
from .notifier import Notifier
from .reads import SessionReads
from .streams import Streams

Q = TypeVar("Q", bound=BaseModel)
R = TypeVar("R", bound=BaseModel)


HOMES_KEPT = 65_536
"""Sessions whose home runner a gateway remembers (the oldest learnt is forgotten first): ~100
bytes each."""


class Services:
    """Requests over NATS to the other services (``coxswain.rpc``): every change a route asks
    for, and the reads of the versions store.

    A session's send, Lead, Stop and answer (:attr:`coxswain.rpc.Op.home`) go to the runner its
    last such reply named, where its turn runs and the transcript of its last turn is kept: the
    next turn starts there without reading the session's log from the stream, and a Lead or Stop
    reaches the running turn without a doorbell between runners. A session it knows no home of,
    and one whose home stopped, go to any runner; one whose home did not answer is forgotten."""

    def __init__(self, nc: Client) -> None:
        self.nc = nc
        self.homes: dict[str, str] = {}
        """Session id -> the runner its turns run on, as the last reply said."""

    async def call(self, op: rpc.Op[Q, R], request: Q) -> R:
        if not op.home:
            return await rpc.call(self.nc, op, request)
        sid: str = getattr(request, "sid")  # noqa: B009 - every home operation's request has one (rpc.HOME_OPS)
        home = self.homes.get(sid)
        try:
            reply, now = await rpc.call_home(self.nc, op, request, home)
        except Unavailable:
            self.homes.pop(sid, None)
            raise
        if now is not None and now != home and ID_RE.fullmatch(now):  # never a subject it could not name
            self.homes.pop(sid, None)
            if len(self.homes) >= HOMES_KEPT:
                del self.homes[next(iter(self.homes))]
            self.homes[sid] = now
        return reply


@dataclass(frozen=True)
class Deps:
    settings: Settings
    auth: Auth
    services: Services
    reads: SessionReads
    streams: Streams
    notifier: Notifier


def of(request: Request) -> Deps:
    deps: Deps = request.app.state.deps
    return deps


BEARER = HTTPBearer(auto_error=False, description="A token of `[auth] tokens` (or `COX_TOKEN`): it names a principal")
"""Only so the OpenAPI document says every /v1 call needs a bearer token; :class:`.auth.Auth` checks it."""
Bearer = Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]


async def _principal(request: Request, _: Bearer) -> str:
    """The principal the bearer token names (401 otherwise)."""
    return of(request).auth.principal(request)


async def _settings(request: Request) -> Settings:
    return of(request).settings


async def _services(request: Request) -> Services:
    return of(request).services


async def _reads(request: Request) -> SessionReads:
    return of(request).reads


async def _streams(request: Request) -> Streams:
    return of(request).streams


async def _notifier(request: Request) -> Notifier:
    return of(request).notifier


def caller(request: Request) -> tuple[Deps, str]:
    """The parts and the principal for a route of every turn (a send, a Lead), without the four
    dependency nodes (services, reads, principal and its bearer scheme) FastAPI would solve for
    it per request: ~40 µs of a send's ~160 in the gateway. Such a route declares its bearer
    scheme with :data:`BEARER_SECURITY` instead, so the OpenAPI document says the same."""
    deps = of(request)
    return deps, deps.auth.principal(request)


BEARER_SECURITY: dict[str, Any] = {"security": [{"HTTPBearer": []}]}
"""A route's ``openapi_extra`` when it takes its principal from :func:`caller`: the security
requirement :data:`BEARER` gives the other routes."""

Principal = Annotated[str, Depends(_principal)]
SettingsDep = Annotated[Settings, Depends(_settings)]
ServicesDep = Annotated[Services, Depends(_services)]
ReadsDep = Annotated[SessionReads, Depends(_reads)]
StreamsDep = Annotated[Streams, Depends(_streams)]
NotifierDep = Annotated[Notifier, Depends(_notifier)]

Sid = Annotated[str, PathParam(pattern=ID_RE.pattern, description="session id")]
VersionId = Annotated[str, PathParam(pattern=ID_RE.pattern)]
