"""The HTTP API (docs/api.md). Reads come from Redis and JetStream; every change is a NATS request
to a turn-runner (or versions), which decides it atomically in Redis.

``create_app`` only assembles: the error handlers and body limit (:mod:`.errors`), the metrics
middleware, one router per section (:mod:`.routers`), the console's static files, and the send's
fast path in front of them all (:mod:`.turnpath`). What the
routes use is the :class:`~.deps.Deps` built once at start, reached through FastAPI dependencies.
"""

from __future__ import annotations

import functools
from typing import Any

from fastapi import FastAPI
from fastapi.staticfiles import StaticFiles
from starlette.types import Receive, Scope, Send

from coxswain import __version__

from . import errors, metrics, turnpath
from .deps import Deps
from .routers import answers, attachments, events, ops, runs, sessions, steering, turns, versions

ROUTERS = (steering.router, events.router, runs.router, sessions.router, answers.router, turns.router,
           attachments.router, versions.router, ops.router)
"""In the order a request is matched against them (FastAPI tries each route in turn, ~5 µs a route
that does not match): the routes of every turn first (a send, its Lead, Stop, an answer), then
the event log's reads and runs; no two routes of different routers match the same request
(tests/fast/test_routes.py), so the order changes nothing but the time."""


class GatewayApp(FastAPI):
    """The gateway's FastAPI app, with a send answered before FastAPI's own layers
    (:mod:`.turnpath`); everything else is FastAPI's."""

    turnpath: turnpath.TurnPath | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.turnpath is None:
            await super().__call__(scope, receive, send)
        else:
            await self.turnpath(scope, receive, send)


def create_app(deps: Deps) -> GatewayApp:
    app = GatewayApp(title="coxswain", version=__version__)
    app.state.deps = deps
    errors.install(app, max_body=deps.settings.max_body, root=deps.settings.root,
                   upload_limit=int(deps.settings.attachments.max_mb * 1024 * 1024))
    for router in ROUTERS:
        app.include_router(router)
    app.add_middleware(metrics.Middleware)
    # before all of FastAPI (its own layers too): it counts what it answers as the metrics do
    app.turnpath = turnpath.TurnPath(functools.partial(FastAPI.__call__, app), deps,
                                     route_of(app, "POST", turnpath.SEND_ROUTE))
    if ops.STATIC.exists():
        app.mount("/static", StaticFiles(directory=ops.STATIC), name="static")
    warm_routes(app)
    return app


def route_of(app: FastAPI, method: str, path: str) -> Any:
    """The route of ``path`` (its template) and ``method``."""
    for route in errors.routes(app.router.routes):
        if getattr(route, "path", None) == path and method in (getattr(route, "methods", None) or ()):
            return route
    raise LookupError(f"no route {method} {path}")


def warm_routes(app: FastAPI) -> None:
    """Build every router's route state now, at start, not on its first request.

    FastAPI (0.16x) builds an included router's routes (their dependency graphs and fields) the
    first time a request is matched against it: 50-90 ms of CPU on the event loop, once per router,
    inside some person's first request (tests/stack/test_loop_stalls.py found it). The hook is
    FastAPI's own (``_IncludedRouter.effective_candidates``); where a version has no such thing,
    nothing is warmed and the stall check says so.
    """
    from fastapi import routing

    included = getattr(routing, "_IncludedRouter", None)
    if included is None:
        return
    todo: list[Any] = list(app.router.routes)
    while todo:
        route = todo.pop()
        if isinstance(route, included):
            todo.extend(route.effective_candidates())
            route.effective_low_priority_routes()
