"""Operations: ``/healthz`` (every service over NATS, the sandbox, the webhooks), ``/metrics``
(Prometheus) and ``/``, the web console (its files under ``/static``, mounted by ``create_app``)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import APIRouter, Response
from fastapi.responses import FileResponse, JSONResponse, PlainTextResponse

from coxswain import __version__, rpc, subjects
from coxswain.errors import Unavailable

from .. import metrics
from ..deps import NotifierDep, Services, ServicesDep, SettingsDep

router = APIRouter()
STATIC = Path(__file__).parent.parent / "static"
UNHEALTHY = {"description": "A service does not answer over NATS: the same body, with `ok: false`",
             "content": {"application/json": {"schema": {"type": "object"}}}}


@router.get("/healthz", responses={503: UNHEALTHY})
async def healthz(services: ServicesDep, settings: SettingsDep, notifier: NotifierDep) -> JSONResponse:
    checks = await asyncio.gather(*(_health(services, s) for s in subjects.SERVICES))
    ok = all(c.get("ok") for c in checks)
    sandbox = settings.sandbox
    body = {"ok": ok, "services": dict(zip(subjects.SERVICES, checks, strict=True)),
            "sandbox": {"mode": sandbox.mode, "network": sandbox.network,
                        # configured; whether cgroups enforce them: services.runner.detail.sandbox.limits
                        "limits": {k: getattr(sandbox, k) for k in ("max_processes", "memory_mb", "cpu_seconds",
                                                                    "file_mb", "workspace_mb", "workspace_files")},
                        **({"warning": "commands run WITHOUT a sandbox ([sandbox] mode = \"none\")"}
                           if sandbox.mode == "none" else {})},
            "notify": await notifier.health()}
    return JSONResponse(body, status_code=200 if ok else 503)


@router.get("/metrics", response_class=PlainTextResponse,
            responses={200: {"description": "The Prometheus text format"}})
async def prometheus() -> Response:
    return metrics.render()


@router.get("/", include_in_schema=False, response_model=None)
async def console() -> Response:
    index = STATIC / "index.html"
    if index.exists():
        return FileResponse(index, headers={"Cache-Control": "no-store"})
    return JSONResponse({"service": "coxswain", "version": __version__, "api": "/docs"})


async def _health(services: Services, service: str) -> dict[str, Any]:
    try:
        health = await services.call(rpc.HEALTH[service], rpc.NoRequest())
        return {"ok": True, **health.model_dump(mode="json")}
    except Unavailable as exc:
        return {"ok": False, "detail": exc.detail}
    except Exception as exc:  # noqa: BLE001 - any failure is "not healthy"
        return {"ok": False, "detail": repr(exc)}
