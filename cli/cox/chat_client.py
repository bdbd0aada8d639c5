"""The v1 API (docs/api.md) as the terminal chat uses it: JSON calls and a resuming event follower."""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import httpx
from httpx_sse import aconnect_sse


class ApiError(Exception):
    """An error answer: the server's ``{"error": code, "detail": text}`` and the status."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        super().__init__(f"{code}: {detail}")
        self.status, self.code, self.detail = status, code, detail


def client_id() -> str:
    return "c_" + secrets.token_hex(10)


class ChatApi:
    def __init__(self, url: str, token: str, timeout: float = 30.0) -> None:
        self.url = url.rstrip("/")
        self.token = token
        self.http = httpx.AsyncClient(base_url=self.url, headers={"Authorization": f"Bearer {token}"},
                                      timeout=timeout)

    async def aclose(self) -> None:
        await self.http.aclose()

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   params: dict[str, Any] | None = None) -> Any:
        try:
            r = await self.http.request(method, path, json=body, params=params)
        except httpx.HTTPError as exc:
            raise ApiError(0, "network", f"the server did not answer ({exc})") from exc
        try:
            data = r.json() if r.content else None
        except ValueError:
            data = {"detail": r.text}
        if r.status_code >= 400:
            d = data if isinstance(data, dict) else {}
            raise ApiError(r.status_code, str(d.get("error") or f"http_{r.status_code}"), str(d.get("detail") or r.text))
        return data

    @staticmethod
    def s(sid: str, rest: str = "") -> str:
        return f"/v1/sessions/{sid}{rest}"

    async def create(self, workspace: str, model: str | None = None) -> dict[str, Any]:
        return dict(await self.call("POST", "/v1/sessions", {"workspace": workspace, **({"model": model} if model else {})}))

    async def session(self, sid: str) -> dict[str, Any]:
        return dict(await self.call("GET", self.s(sid)))

    async def patch(self, sid: str, **body: Any) -> dict[str, Any]:
        return dict(await self.call("PATCH", self.s(sid), body))

    async def send(self, sid: str, text: str, mode: str | None = None,
                   attachments: list[str] | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"text": text, "client_id": client_id()}
        if mode:
            body["mode"] = mode
        if attachments:
            body["attachments"] = attachments
        return dict(await self.call("POST", self.s(sid, "/messages"), body))

    async def attach(self, sid: str, name: str, data: bytes, media_type: str) -> dict[str, Any]:
        """Upload one file (multipart, the field ``file``): ``{attachment_id, name, media_type, size}``."""
        try:
            r = await self.http.post(self.s(sid, "/attachments"), files={"file": (name, data, media_type)})
        except httpx.HTTPError as exc:
            raise ApiError(0, "network", f"the server did not answer ({exc})") from exc
        try:
            d = r.json()
        except ValueError:
            d = {"detail": r.text}
        if r.status_code >= 400:
            d = d if isinstance(d, dict) else {}
            raise ApiError(r.status_code, str(d.get("error") or f"http_{r.status_code}"), str(d.get("detail") or r.text))
        return dict(d)

    async def lead(self, sid: str, text: str) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, "/lead"), {"text": text, "client_id": client_id()}))

    async def observe(self, sid: str, command: str, background: bool = False) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, "/observe"), {"command": command, "background": background}))

    async def program_stop(self, sid: str, program_id: str) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, f"/programs/{program_id}/stop")))

    async def stop_programs(self, sid: str) -> dict[str, Any]:
        """Stop with "stop programs too"."""
        return dict(await self.call("POST", self.s(sid, "/stop"), {"programs": True}))

    async def stop(self, sid: str) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, "/stop")))

    async def answer(self, sid: str, aid: str, decision: str, scope: str = "once",
                     message: str | None = None) -> dict[str, Any]:
        body: dict[str, Any] = {"decision": decision, "scope": scope}
        if message:
            body["message"] = message
        return dict(await self.call("POST", self.s(sid, f"/approvals/{aid}"), body))

    async def queue_remove(self, sid: str, message_id: str) -> dict[str, Any]:
        return dict(await self.call("DELETE", self.s(sid, f"/queue/{message_id}")))

    async def queue_order(self, sid: str, message_ids: list[str]) -> dict[str, Any]:
        return dict(await self.call("PUT", self.s(sid, "/queue/order"), {"message_ids": message_ids}))

    async def versions(self, sid: str, path: str) -> dict[str, Any]:
        return dict(await self.call("GET", self.s(sid, "/versions"), params={"path": path}))

    async def diff(self, sid: str, vid: str) -> dict[str, Any]:
        return dict(await self.call("GET", self.s(sid, f"/versions/{vid}/diff")))

    async def restore(self, sid: str, vid: str) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, f"/versions/{vid}/restore")))

    async def undo(self, sid: str) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, "/undo")))

    async def fork(self, sid: str, at_turn: int) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, "/fork"), {"at_turn": at_turn}))

    async def rewind(self, sid: str, to_turn: int, scope: str) -> dict[str, Any]:
        return dict(await self.call("POST", self.s(sid, "/rewind"), {"to_turn": to_turn, "scope": scope}))

    async def backlog(self, sid: str, after: int) -> AsyncIterator[dict[str, Any]]:
        """Every recorded event after ``after``, in JSON pages."""
        while True:
            batch = await self.call("GET", self.s(sid, "/events"), params={"format": "json", "after": after, "limit": 1000})
            if not batch:
                return
            for ev in batch:
                after = ev["seq"]
                yield ev

    async def follow(self, sid: str, after: int, on_event: Callable[[dict[str, Any]], Awaitable[None]],
                     on_status: Callable[[str], None]) -> None:
        """Live events after ``after`` until cancelled: reconnects with ``Last-Event-ID`` and hands
        on each seq exactly once, in order (a gap reconnects from the last seq handed on)."""
        last = after
        pause = 0.25
        while True:
            try:
                headers = {"Last-Event-ID": str(last)}
                async with aconnect_sse(self.http, "GET", self.s(sid, "/events"), headers=headers,
                                        timeout=httpx.Timeout(30.0, read=None)) as source:
                    if source.response.status_code == 401:
                        on_status("token refused")
                        return
                    if source.response.status_code != 200:
                        raise ApiError(source.response.status_code, "stream", "the event stream was refused")
                    on_status("live")
                    pause = 0.25
                    async for sse in source.aiter_sse():
                        if not sse.data:
                            continue
                        ev = json.loads(sse.data)
                        seq = int(ev.get("seq", 0))
                        if seq <= last:
                            continue
                        if seq != last + 1:
                            break
                        last = seq
                        await on_event(ev)
            except (httpx.HTTPError, ApiError, ValueError):
                pass
            on_status("reconnecting")
            await asyncio.sleep(pause)
            pause = min(pause * 2, 4.0)
