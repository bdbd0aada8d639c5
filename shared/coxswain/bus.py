"""Typed request-reply over NATS: one pydantic model in, one out, errors as codes.

A reply is ``{"ok": true, "result": {...}}`` or an error envelope (:mod:`coxswain.errors`).
Transport failures (no responders, timeout, closed connection) become :class:`Unavailable`, so
the gateway answers 503 instead of 500 when a service or NATS is down.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

import nats.errors
from nats.aio.client import Client
from pydantic import BaseModel

from .errors import CoxError, Unavailable, from_wire

T = TypeVar("T", bound=BaseModel)


def ok(result: BaseModel | dict[str, Any]) -> bytes:
    payload = result.model_dump(mode="json") if isinstance(result, BaseModel) else result
    return json.dumps({"ok": True, "result": payload}, ensure_ascii=False).encode()


def err(exc: CoxError) -> bytes:
    return json.dumps(exc.to_wire(), ensure_ascii=False).encode()


async def call(nc: Client, subject: str, request: BaseModel, result: type[T], timeout: float = 10.0) -> T:
    """Send ``request`` to ``subject`` and parse the reply as ``result`` (or raise its error)."""
    data = await raw_call(nc, subject, request.model_dump_json().encode(), timeout)
    return result.model_validate(data)


async def raw_call(nc: Client, subject: str, payload: bytes, timeout: float = 10.0) -> Any:
    if nc.is_closed or not nc.is_connected:
        raise Unavailable("the message bus is not connected")
    try:
        msg = await nc.request(subject, payload, timeout=timeout)
    except nats.errors.NoRespondersError as exc:
        raise Unavailable(f"no service answers {subject}") from exc
    except nats.errors.TimeoutError as exc:
        raise Unavailable(f"{subject} did not answer within {timeout:g}s") from exc
    except (nats.errors.ConnectionClosedError, nats.errors.ConnectionDrainingError,
            nats.errors.ConnectionReconnectingError, nats.errors.OutboundBufferLimitError) as exc:
        raise Unavailable(f"the message bus is not connected: {exc}") from exc
    try:
        data = json.loads(msg.data)
    except ValueError as exc:
        raise Unavailable(f"{subject} answered with something that is not JSON") from exc
    if isinstance(data, dict) and data.get("ok") is False:
        raise from_wire(data)
    if not isinstance(data, dict) or "result" not in data:
        raise Unavailable(f"{subject} answered without a result")
    return data["result"]
