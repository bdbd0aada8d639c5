"""``cox acp``: coxswain as an Agent Client Protocol agent on stdio (JSON-RPC 2.0, from Zed), for
editors and terminal clients that drive ACP agents (Zed, JetBrains, Neovim, Emacs, Toad, ...).

It is a client of a running coxswain's v1 HTTP API and event stream like ``cox chat`` (it uses the
same :class:`~cox.chat_client.ChatApi`); nothing on the server knows ACP. The mapping is the table
in docs/api.md ("Agent Client Protocol"); how an event becomes a ``session/update`` is
:mod:`cox.acp_map`.

- Each ACP session is one coxswain session (the same id) with one event follower that resumes
  from the last seq it handed on (``Last-Event-ID``), so a lost connection neither repeats nor
  drops an update.
- A ``session/prompt`` is a send, or a queued send while a turn runs; it is answered when the turn
  that ran *its* message ends (``turn.start`` names the message), or ``cancelled`` when Stop
  discarded it. Each accepted prompt is answered exactly once.
- While the gateway does not answer for ``--outage-s`` seconds, the prompts waiting are answered
  with a clear error (the turns go on in coxswain); the follower keeps trying and the session works
  again when the gateway is back.
- Logs go to a file (``--log``), never to stdout: stdout is the protocol.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import binascii
import contextlib
import logging
import os
import posixpath
import secrets
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path
from typing import Any, cast

import httpx
from acp import PROTOCOL_VERSION, RequestError
from acp.core import AgentSideConnection
from acp.schema import (
    AgentCapabilities,
    Implementation,
    InitializeResponse,
    ListSessionsResponse,
    LoadSessionResponse,
    NewSessionResponse,
    PermissionOption,
    PromptCapabilities,
    PromptResponse,
    ResumeSessionResponse,
    SessionCapabilities,
    SessionInfo,
    SessionListCapabilities,
    SessionResumeCapabilities,
    SetSessionConfigOptionResponse,
    SetSessionModeResponse,
    ToolCallUpdate,
)
from acp.stdio import stdio_streams

from . import acp_map as amap
from .chat import resolve_token
from .chat_client import ApiError, ChatApi
from .run import add_gateway_args

log = logging.getLogger("cox.acp")
Event = dict[str, Any]

UNAVAILABLE = -32011
"""JSON-RPC error code: coxswain's gateway did not answer (the detail says for how long)."""
REFUSED = -32012
"""JSON-RPC error code: coxswain refused the request (its error code and detail in ``data``)."""
DISCARDED = "discarded"
"""The outcome of a prompt whose queued message Stop discarded (answered ``cancelled``)."""
ALLOW_ONCE, ALLOW_ALWAYS, REJECT_ONCE = "allow_once", "allow_always", "reject_once"
ANSWERS = {ALLOW_ONCE: ("allow", "once"), ALLOW_ALWAYS: ("allow", "session"), REJECT_ONCE: ("deny", "once")}
RETRIED = frozenset({0, 502, 503, 504})


def version() -> str:
    try:
        return metadata.version("coxswain")
    except metadata.PackageNotFoundError:  # a source checkout on sys.path, not installed
        return "0"


def request_error(exc: ApiError) -> RequestError:
    """A coxswain error answer as a JSON-RPC error a client can show as it is."""
    data = {"error": exc.code, "status": exc.status, "detail": exc.detail}
    if exc.status in RETRIED:
        return RequestError(UNAVAILABLE, f"coxswain is unavailable: {exc.detail}", data)
    if exc.status == 401:
        return RequestError(-32000, "coxswain refused the token (pass --token or set COX_TOKEN)", data)
    if exc.status == 404:
        return RequestError(-32002, f"not found: {exc.detail}", data)
    if exc.status in (409, 413, 422, 429):
        return RequestError(-32602 if exc.status == 422 else REFUSED, f"{exc.code}: {exc.detail}", data)
    return RequestError(-32603, f"{exc.code}: {exc.detail}", data)


def no_session(sid: str) -> RequestError:
    return RequestError(-32602, f"no session {sid} on this connection: session/new, session/load or session/resume it first",
                        {"sessionId": sid})


@dataclass
class Link:
    """One ACP session: the coxswain session, its follower and what waits on it."""

    sid: str
    mapper: amap.Mapper
    last: int = 0
    turn_id: str | None = None
    turn_msg: dict[str, str] = field(default_factory=dict)
    outcomes: dict[str, asyncio.Future[tuple[str, str | None]]] = field(default_factory=dict)
    mine: set[str] = field(default_factory=set)
    texts: list[str] = field(default_factory=list)
    asks: dict[str, asyncio.Task[None]] = field(default_factory=dict)
    answering: set[str] = field(default_factory=set)
    pending: dict[str, Event] = field(default_factory=dict)
    cancelling: bool = False
    lost_since: float | None = None
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    def outcome(self, mid: str) -> asyncio.Future[tuple[str, str | None]]:
        fut = self.outcomes.get(mid)
        if fut is None:
            fut = self.outcomes[mid] = asyncio.get_running_loop().create_future()
        return fut

    def settle(self, mid: str | None, outcome: str, detail: str | None = None) -> None:
        if mid is None:
            return
        fut = self.outcome(mid)
        if not fut.done():
            fut.set_result((outcome, detail))

    @contextlib.contextmanager
    def own(self, text: str) -> Iterator[None]:
        """This client sends ``text``: its ``user.msg`` is not echoed back (the client shows its
        own prompt); a refused send is forgotten again."""
        self.texts.append(text)
        try:
            yield
        except BaseException:
            with contextlib.suppress(ValueError):
                self.texts.remove(text)
            raise

    def waiting(self) -> list[str]:
        return [m for m in self.mine if not self.outcome(m).done()]


class CoxAgent:
    """The ACP agent (the SDK's ``Agent`` protocol) over a coxswain gateway."""

    def __init__(self, api: ChatApi, root: str | None = None, context_size: int = 200_000,
                 outage_s: float = 30.0) -> None:
        self.api = api
        self.root = root
        self.context_size = context_size
        self.outage_s = outage_s
        self.conn: AgentSideConnection | None = None
        self.links: dict[str, Link] = {}
        self.models: list[str] | None = None

    def on_connect(self, conn: Any) -> None:
        self.conn = conn

    # ---- calls to coxswain -------------------------------------------------------------------

    async def call(self, method: str, path: str, body: dict[str, Any] | None = None,
                   params: dict[str, Any] | None = None, retry: bool = False) -> Any:
        """One API call; ``retry`` (a call with a ``client_id``, safe to repeat) retries while
        the gateway is away, for up to ``outage_s``."""
        deadline = time.monotonic() + self.outage_s
        pause = 0.25
        while True:
            try:
                return await self.api.call(method, path, body, params)
            except ApiError as exc:
                if not (retry and exc.status in RETRIED) or time.monotonic() + pause > deadline:
                    log.warning("%s %s: %s %s", method, path, exc.status, exc)
                    raise request_error(exc) from exc
            await asyncio.sleep(pause)
            pause = min(pause * 2, 2.0)

    async def workspace_root(self) -> str:
        if self.root is None:
            data = await self.call("GET", "/v1/workspaces")
            self.root = str(data["root"])
        return self.root

    async def model_names(self) -> list[str]:
        if self.models is None:
            try:
                data = await self.call("GET", "/v1/models")
                self.models = [str(m) for m in data.get("models") or []]
            except RequestError:
                return []
        return self.models

    async def settings(self, s: dict[str, Any]) -> tuple[Any, list[Any]]:
        return amap.modes(bool(s.get("dont_ask"))), [amap.model_option(str(s.get("model") or ""), await self.model_names())]

    # ---- the ACP agent ------------------------------------------------------------------------

    async def initialize(self, protocol_version: int, client_capabilities: Any = None, client_info: Any = None,
                         **kwargs: Any) -> InitializeResponse:
        log.info("initialize from %s (protocol %s)", client_info, protocol_version)
        return InitializeResponse(
            protocol_version=min(protocol_version, PROTOCOL_VERSION),
            agent_capabilities=AgentCapabilities(
                load_session=True,
                prompt_capabilities=PromptCapabilities(image=True, audio=False, embedded_context=True),
                session_capabilities=SessionCapabilities(list=SessionListCapabilities(),
                                                         resume=SessionResumeCapabilities()),
            ),
            agent_info=Implementation(name="coxswain", title="coxswain", version=version()),
            auth_methods=[],
        )

    async def authenticate(self, method_id: str, **kwargs: Any) -> None:
        return None

    async def new_session(self, cwd: str, mcp_servers: Any = None, **kwargs: Any) -> NewSessionResponse:
        root = await self.workspace_root()
        workspace = under_root(cwd, root)
        s = await self.call("POST", "/v1/sessions", {"workspace": workspace})
        await self.attach(s, replay=False)
        mode, options = await self.settings(s)
        return NewSessionResponse(session_id=s["id"], modes=mode, config_options=options)

    async def load_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                           **kwargs: Any) -> LoadSessionResponse:
        s = await self.call("GET", ChatApi.s(session_id))
        await self.attach(s, replay=True)
        mode, options = await self.settings(s)
        return LoadSessionResponse(modes=mode, config_options=options)

    async def resume_session(self, cwd: str, session_id: str, mcp_servers: Any = None,
                             **kwargs: Any) -> ResumeSessionResponse:
        s = await self.call("GET", ChatApi.s(session_id))
        await self.attach(s, replay=False)
        mode, options = await self.settings(s)
        return ResumeSessionResponse(modes=mode, config_options=options)

    async def list_sessions(self, cwd: str | None = None, cursor: str | None = None, **kwargs: Any) -> ListSessionsResponse:
        rows = await self.call("GET", "/v1/sessions", params={"limit": 500})
        want = os.path.realpath(cwd) if cwd else None
        out = []
        for s in rows:
            ws = str(s.get("workspace") or "")
            if want is not None and os.path.realpath(ws) != want:
                continue
            updated = datetime.fromtimestamp(int(s.get("created") or 0) / 1000, UTC).isoformat()
            out.append(SessionInfo(session_id=s["id"], cwd=ws, title=s.get("title"), updated_at=updated))
        return ListSessionsResponse(sessions=out)

    async def set_session_mode(self, mode_id: str, session_id: str, **kwargs: Any) -> SetSessionModeResponse:
        self.link(session_id)
        if mode_id not in (amap.ASK, amap.DONT_ASK):
            raise RequestError(-32602, f"no mode {mode_id!r}: {amap.ASK} or {amap.DONT_ASK}", {"modeId": mode_id})
        await self.call("PATCH", ChatApi.s(session_id), {"dont_ask": mode_id == amap.DONT_ASK})
        return SetSessionModeResponse()

    async def set_config_option(self, config_id: str, session_id: str, value: str | bool,
                                **kwargs: Any) -> SetSessionConfigOptionResponse:
        self.link(session_id)
        if config_id != amap.MODEL_OPTION:
            raise RequestError(-32602, f"no config option {config_id!r} (there is {amap.MODEL_OPTION!r})",
                               {"configId": config_id})
        s = await self.call("PATCH", ChatApi.s(session_id), {"model": str(value)})
        _, options = await self.settings({**s, "model": s.get("next_model") or s.get("model")})
        return SetSessionConfigOptionResponse(config_options=options)

    async def prompt(self, prompt: list[Any], session_id: str, **kwargs: Any) -> PromptResponse:
        link = self.link(session_id)
        images = [b for b in prompt if getattr(b, "type", None) == "image"]
        rest = [b for b in prompt if getattr(b, "type", None) != "image"]
        text = prompt_text(rest) if rest or not images else "(an image)" if len(images) == 1 else "(images)"
        attachments = [await self.upload(link, b, n) for n, b in enumerate(images, 1)]
        reply = await self.send(link, text, None, attachments)
        mid = str(reply["message_id"])
        link.mine.add(mid)
        log.info("prompt %s on %s: %s", mid, session_id, reply.get("disposition"))
        outcome, detail = await link.outcome(mid)
        if outcome == DISCARDED:
            return PromptResponse(stop_reason="cancelled")
        reason = amap.stop_reason(outcome)
        if reason is None:
            raise RequestError(amap.TURN_FAILED, f"the turn ended {outcome}" + (f": {detail}" if detail else ""),
                               {"outcome": outcome, "detail": detail})
        return PromptResponse(stop_reason=reason)

    async def cancel(self, session_id: str, **kwargs: Any) -> None:
        link = self.links.get(session_id)
        if link is None:
            return
        waiting = link.waiting()
        link.cancelling = True
        try:
            for task in list(link.asks.values()):
                task.cancel()
            reply = await self.call("POST", ChatApi.s(session_id, "/stop"), retry=True)
            link.settle(link.turn_msg.get(str(reply.get("turn_id"))), "stopped")
            for mid in reply.get("discarded") or []:
                link.settle(str(mid), DISCARDED)
            for mid in waiting:  # Stop ended the running turn and discarded the rest
                link.settle(mid, "stopped")
        except RequestError as exc:
            log.warning("cancel of %s: %s", session_id, exc)
        finally:
            link.cancelling = False

    async def ext_method(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        if method == "session/steering":
            return await self.lead(params)
        if method == "coxswain/steer":
            return await self.queued(params, "steer")
        raise RequestError.method_not_found(f"_{method}")

    async def ext_notification(self, method: str, params: dict[str, Any]) -> None:
        log.info("ignored notification _%s", method)

    async def inject(self, params: dict[str, Any]) -> dict[str, Any]:
        """``session/inject {sessionId, mode, prompt}`` (the proposed ACP steering call):
        ``steer`` is coxswain's Lead, ``queue`` a queued message."""
        mode = params.get("mode")
        if mode == "steer":
            return await self.lead(params)
        if mode == "queue":
            return await self.queued(params, "queue")
        raise RequestError(-32602, f"session/inject mode must be steer or queue, not {mode!r}", {"mode": mode})

    # ---- steering -----------------------------------------------------------------------------

    def params_link(self, params: dict[str, Any]) -> tuple[Link, str]:
        sid = params.get("sessionId")
        if not isinstance(sid, str):
            raise RequestError(-32602, "sessionId is required", None)
        blocks = params.get("prompt")
        if not isinstance(blocks, list) or not blocks:
            raise RequestError(-32602, "prompt (a list of content blocks) is required", None)
        return self.link(sid), "\n".join(block_text(b) for b in blocks)

    async def lead(self, params: dict[str, Any]) -> dict[str, Any]:
        """A Lead into the running turn (never a new turn: refused when no turn runs)."""
        link, text = self.params_link(params)
        turn = link.turn_id
        if turn is None:
            s = await self.call("GET", ChatApi.s(link.sid))
            turn = s.get("turn_id")
        if not turn:
            raise RequestError(REFUSED, "no_turn: no turn is running to steer; send a prompt instead",
                               {"error": "no_turn"})
        body = {"text": text, "client_id": new_client_id(), "turn_id": turn}
        with link.own(text):
            r = await self.call("POST", ChatApi.s(link.sid, "/lead"), body, retry=True)
        return {"leadId": r.get("lead_id"), "turnId": r.get("turn_id"), "pending": r.get("pending")}

    async def queued(self, params: dict[str, Any], mode: str) -> dict[str, Any]:
        link, text = self.params_link(params)
        r = await self.send(link, text, mode)
        return {"messageId": r.get("message_id"), "disposition": r.get("disposition"), "position": r.get("position")}

    async def send(self, link: Link, text: str, mode: str | None,
                   attachments: list[str] | None = None) -> dict[str, Any]:
        """A send (``mode`` None: queued instead when a turn runs, as a plain ACP client's
        prompt while busy means), retried with one ``client_id`` while the gateway is away."""
        body: dict[str, Any] = {"text": text, "client_id": new_client_id(), **({"mode": mode} if mode else {}),
                                **({"attachments": attachments} if attachments else {})}
        try:
            with link.own(text):
                return dict(await self.call("POST", ChatApi.s(link.sid, "/messages"), body, retry=True))
        except RequestError as exc:
            if mode is None and isinstance(exc.data, dict) and exc.data.get("error") == "busy":
                return await self.send(link, text, "queue", attachments)
            raise

    async def upload(self, link: Link, block: Any, n: int) -> str:
        """An image block of a prompt as an attachment of the session (``POST .../attachments``):
        the message names it, and the model sees the image (or the send is refused, 409
        ``not_accepting``, when the session's model takes no images)."""
        try:
            data = base64.b64decode(str(block.data), validate=True)
        except (ValueError, binascii.Error) as exc:
            raise RequestError(-32602, f"image {n}: its data is not base64", None) from exc
        mime = str(getattr(block, "mime_type", "") or "application/octet-stream")
        name = f"image-{n}.{mime.split('/')[-1].split('+')[0] or 'bin'}"
        try:
            r = await self.api.http.post(ChatApi.s(link.sid, "/attachments"), files={"file": (name, data, mime)})
        except httpx.HTTPError as exc:
            raise request_error(ApiError(0, "network", f"the server did not answer ({exc})")) from exc
        body = r.json() if r.content else {}
        if r.status_code >= 400:
            d = body if isinstance(body, dict) else {}
            raise request_error(ApiError(r.status_code, str(d.get("error") or f"http_{r.status_code}"),
                                         str(d.get("detail") or r.text)))
        return str(body["attachment_id"])

    # ---- following a session ------------------------------------------------------------------

    def link(self, sid: str) -> Link:
        link = self.links.get(sid)
        if link is None:
            raise no_session(sid)
        return link

    async def attach(self, s: dict[str, Any], replay: bool) -> Link:
        sid = str(s["id"])
        old = self.links.pop(sid, None)
        if old is not None:
            for task in old.tasks:
                task.cancel()
        mapper = amap.Mapper(workspace=str(s.get("workspace") or ""), context_size=self.context_size,
                             models=await self.model_names())
        link = Link(sid=sid, mapper=mapper, last=int(s.get("last_seq") or 0), turn_id=s.get("turn_id"))
        if replay:
            link.last = 0
            try:
                async for ev in self.api.backlog(sid, 0):
                    await self.on_event(link, ev, replay=True)
            except ApiError as exc:
                raise request_error(exc) from exc
        else:
            link.pending = {str(a["approval_id"]): {**a, "type": "approval.pending"} for a in s.get("approvals") or []}
        self.links[sid] = link
        for ev in list(link.pending.values()):
            self.ask(link, ev)

        def status(state: str) -> None:
            if state == "live":
                if link.lost_since is not None:
                    log.info("session %s: the event stream is back (from seq %s)", sid, link.last)
                link.lost_since = None
            elif link.lost_since is None:
                link.lost_since = time.monotonic()
                log.warning("session %s: the event stream is %s (last seq %s)", sid, state, link.last)

        async def handed(ev: Event) -> None:
            await self.on_event(link, ev, replay=False)

        link.tasks.append(asyncio.create_task(self.api.follow(sid, link.last, handed, status)))
        link.tasks.append(asyncio.create_task(self.watch(link)))
        return link

    async def watch(self, link: Link) -> None:
        """While the gateway is away for ``outage_s``, answer the prompts waiting with an error
        (once: the turns go on in coxswain, a later ``session/load`` shows them)."""
        while True:
            await asyncio.sleep(0.5)
            lost = link.lost_since
            if lost is None or time.monotonic() - lost < self.outage_s:
                continue
            for mid in link.waiting():
                fut = link.outcome(mid)
                fut.set_exception(RequestError(
                    UNAVAILABLE,
                    f"coxswain at {self.api.url} has not answered for {int(time.monotonic() - lost)} s; "
                    "the turn goes on there: session/load the session to see it when it is back",
                    {"error": "unavailable", "messageId": mid}))

    async def on_event(self, link: Link, ev: Event, replay: bool) -> None:
        seq = int(ev.get("seq") or 0)
        if seq <= link.last and not replay:
            return
        link.last = max(link.last, seq)
        t = ev.get("type")
        if t == "turn.start":
            link.turn_id = ev.get("turn_id")
            link.turn_msg[str(ev.get("turn_id"))] = str(ev.get("message_id"))
        elif t == "turn.end":
            if link.turn_id == ev.get("turn_id"):
                link.turn_id = None
            if not replay:
                link.settle(link.turn_msg.get(str(ev.get("turn_id"))), str(ev.get("outcome")), ev.get("detail"))
        elif t == "queue.discarded" and not replay:
            for mid in ev.get("message_ids") or []:
                link.settle(str(mid), DISCARDED)
        elif t == "approval.pending":
            link.pending[str(ev["approval_id"])] = ev
            if not replay:
                self.ask(link, ev)
        elif t == "approval.resolved":
            aid = str(ev.get("approval_id"))
            link.pending.pop(aid, None)
            if not replay:
                await self.withdraw(link, aid, ev)
        elif t == "user.msg" and not replay and ev.get("text") in link.texts:
            link.texts.remove(ev["text"])  # this client's own prompt: the client shows it already
            return
        for update in link.mapper.updates(ev, replay=replay):
            await self.update(link.sid, update)

    async def update(self, sid: str, update: Any) -> None:
        if self.conn is None:
            return
        try:
            await self.conn.session_update(session_id=sid, update=update)
        except (ConnectionError, OSError, RequestError) as exc:  # the editor went away: nothing to tell
            log.warning("session/update to the client failed: %s", exc)

    # ---- approvals ----------------------------------------------------------------------------

    def ask(self, link: Link, ev: Event) -> None:
        aid = str(ev["approval_id"])
        if aid in link.asks:
            return
        task = asyncio.create_task(self.permission(link, ev))
        link.asks[aid] = task
        task.add_done_callback(lambda _t: link.asks.pop(aid, None))

    async def permission(self, link: Link, ev: Event) -> None:
        """``session/request_permission`` for one pending approval; its answer is the approval."""
        if self.conn is None:
            return
        aid, cid = str(ev["approval_id"]), str(ev.get("call_id") or ev["approval_id"])
        name, args = str(ev.get("name", "")), ev.get("args")
        title = "Continue past the soft limit?" if name == "continue" else amap.tool_title(name, args)
        reason = str(ev.get("reason") or "")
        tool_call = ToolCallUpdate(tool_call_id=cid, title=title, kind=amap.tool_kind(name, args),
                                   status="pending", raw_input=args, locations=link.mapper.locations(args),
                                   content=[amap.text_content(reason)] if reason else None)
        options = [PermissionOption(option_id=ALLOW_ONCE, name="Allow once", kind="allow_once")]
        network = isinstance(args, dict) and bool(args.get("network"))
        if not ev.get("security") or network:
            options.append(PermissionOption(option_id=ALLOW_ALWAYS, name="Always, this session", kind="allow_always"))
        options.append(PermissionOption(option_id=REJECT_ONCE, name="Deny", kind="reject_once"))
        raw = getattr(self.conn, "_conn", None)
        request_id = getattr(raw, "_next_request_id", None)  # the id the next request takes
        try:
            resp = await self.conn.request_permission(session_id=link.sid, tool_call=tool_call, options=options)
        except asyncio.CancelledError:
            if raw is not None and request_id is not None:
                with contextlib.suppress(Exception):
                    await raw.send_notification("$/cancel_request", {"requestId": request_id})
            raise
        except (ConnectionError, OSError, RequestError, ValueError) as exc:
            log.warning("request_permission %s: %s", aid, exc)
            return
        outcome = resp.outcome
        if getattr(outcome, "outcome", None) == "cancelled":
            if link.cancelling:
                return  # Stop closes the approval
            decision, scope = "deny", "once"
        else:
            decision, scope = ANSWERS.get(str(getattr(outcome, "option_id", "")), ("deny", "once"))
        meta = resp.field_meta or {}
        message = meta.get("message") if isinstance(meta.get("message"), str) else None
        body: dict[str, Any] = {"decision": decision, "scope": scope, **({"message": message} if message else {})}
        link.answering.add(aid)
        try:
            await self.call("POST", ChatApi.s(link.sid, f"/approvals/{aid}"), body, retry=True)
        except RequestError as exc:
            log.info("approval %s answered %s: %s", aid, decision, exc)

    async def withdraw(self, link: Link, aid: str, ev: Event) -> None:
        """An approval answered elsewhere (the console, don't-ask, the turn's end) withdraws
        the request this client still shows."""
        task = link.asks.get(aid)
        if aid in link.answering:
            link.answering.discard(aid)
            return
        if task is None or task.done():
            return
        task.cancel()
        log.info("approval %s was answered elsewhere (%s): request withdrawn", aid, ev.get("actor"))

    async def close(self) -> None:
        for link in self.links.values():
            for task in link.tasks:
                task.cancel()
        await self.api.aclose()


def new_client_id() -> str:
    return "acp_" + secrets.token_hex(10)


def block_text(block: Any) -> str:
    """A content block given as JSON (an extension's params) as text."""
    if isinstance(block, dict):
        if block.get("type") == "text":
            return str(block.get("text", ""))
        if block.get("type") == "resource_link":
            return f"@{block.get('uri')}"
        raise RequestError(-32602, f"a {block.get('type')} content block is not supported (text only)", None)
    return str(block)


def prompt_text(blocks: list[Any]) -> str:
    try:
        text = "\n".join(amap.text_of(b) for b in blocks)
    except ValueError as exc:
        raise RequestError(-32602, str(exc), None) from exc
    if not text.strip():
        raise RequestError(-32602, "the prompt has no text", None)
    return text


def under_root(cwd: str, root: str) -> str:
    """``cwd`` as a workspace name: its path under coxswain's workspace root (links resolved);
    anything else is a clear JSON-RPC error, not an internal one."""
    if not cwd or not posixpath.isabs(cwd):
        raise RequestError(-32602, f"cwd must be an absolute path, not {cwd!r}", {"cwd": cwd})
    real, base = os.path.realpath(cwd), os.path.realpath(root)
    rel = os.path.relpath(real, base)
    if rel == "." or rel.startswith(".."):
        where = "is the workspace root itself" if rel == "." else "is not under"
        raise RequestError(-32602, f"cwd {cwd} {where} coxswain's workspace root {root}: "
                                   "open a folder under it (each folder under the root is a workspace)",
                           {"cwd": cwd, "root": root})
    return rel


async def serve(agent: CoxAgent) -> None:
    """The agent on this process's stdin and stdout (the SDK's stdio connection), with
    ``session/inject`` routed to :meth:`CoxAgent.inject` (the SDK knows only ``_``-prefixed
    extensions)."""
    reader, writer = await stdio_streams(limit=50 * 1024 * 1024)
    conn = AgentSideConnection(cast(Any, agent), writer, reader, listening=False, use_unstable_protocol=True)
    inner = conn._conn._handler

    async def handler(method: str, params: Any, is_notification: bool) -> Any:
        if method == "session/inject" and not is_notification:
            return await agent.inject(params if isinstance(params, dict) else {})
        return await inner(method, params, is_notification)

    conn._conn._handler = handler
    try:
        await conn.listen()
    finally:
        await agent.close()
        with contextlib.suppress(Exception):
            await conn.close()


def default_log() -> Path:
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(base) / "coxswain" / "acp.log"


def build_parser(p: argparse.ArgumentParser) -> None:
    add_gateway_args(p)
    p.add_argument("--workspace-root", default=None, metavar="DIR",
                   help="coxswain's workspace root as this machine sees it (default: the server's)")
    p.add_argument("--log", default=None, metavar="FILE",
                   help="where to log (default $XDG_STATE_HOME/coxswain/acp.log); never stdout")
    p.add_argument("--context-size", type=int, default=200_000, metavar="TOKENS",
                   help="the context window usage_update reports against (default 200000)")
    p.add_argument("--outage-s", type=float, default=30.0, metavar="S",
                   help="answer waiting prompts with an error after the gateway is away this long (default 30)")


def run(args: argparse.Namespace) -> int:
    path = Path(args.log) if args.log else default_log()
    path.parent.mkdir(parents=True, exist_ok=True)
    logging.basicConfig(filename=str(path), level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", force=True)
    token = resolve_token(args)
    if not token:
        print("cox acp: no token: pass --token, set COX_TOKEN, or run where cox up keeps .cox/token", file=sys.stderr)
        return 2
    agent = CoxAgent(ChatApi(args.url, token), args.workspace_root, args.context_size, args.outage_s)
    log.info("cox acp %s on %s", version(), args.url)
    try:
        asyncio.run(serve(agent))
    except KeyboardInterrupt:
        pass
    log.info("cox acp: the client closed the connection")
    return 0
