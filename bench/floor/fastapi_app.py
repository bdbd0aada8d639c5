"""The send route's chained floor with the framework the gateway must use (FastAPI + uvicorn).

``POST /v1/sessions/{sid}/messages`` the way any FastAPI app would write it and no more: the path
parameter checked against a pattern, a bearer token checked by a dependency, the body validated
into a pydantic model, sent as a NATS request to the floor's responder (which runs one Redis
script), and the reply validated into the response model and answered 202. What a send costs
beyond this is ours; what this costs beyond the bare ASGI app (``asgi_app.py``) is FastAPI's,
Starlette's and pydantic's per-request work, which the product cannot leave out.
"""

from __future__ import annotations

import contextlib
import secrets
from collections.abc import AsyncIterator
from typing import Annotated, Any, Literal

import nats
from fastapi import Depends, FastAPI, HTTPException, Path
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field

from bench.floor.asgi_app import CHAIN, serve

TOKEN = "floor-token"
ROUTE = "/v1/sessions/{sid}/messages"


class Message(BaseModel):
    text: Annotated[str, Field(min_length=1, max_length=1_000_000)]
    mode: Literal["queue", "steer", "now"] | None = None
    pad: str = ""


class Reply(BaseModel):
    ok: bool


BEARER = HTTPBearer(auto_error=False)


async def principal(creds: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> str:
    if creds is None or not secrets.compare_digest(creds.credentials, TOKEN):
        raise HTTPException(401, "a bearer token is required")
    return "floor"


def make_app(url: str) -> FastAPI:
    # (module-level dependencies: with postponed annotations FastAPI resolves them by name)
    state: dict[str, Any] = {}

    @contextlib.asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        state["nc"] = await nats.connect(url)
        yield
        await state["nc"].drain()

    app = FastAPI(lifespan=lifespan)

    @app.post(ROUTE, status_code=202)
    async def send(sid: Annotated[str, Path(pattern=r"^[A-Za-z0-9_-]{1,64}$")], body: Message,
                   who: Annotated[str, Depends(principal)]) -> Reply:
        msg = await state["nc"].request(CHAIN, body.model_dump_json().encode(), timeout=5)
        return Reply.model_validate_json(msg.data)

    return app


if __name__ == "__main__":
    serve(make_app)
