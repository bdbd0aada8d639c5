"""A session's MCP tool servers (``[[mcp.servers]]``, docs/design.md "MCP tool servers").

One :class:`McpServers` belongs to a drive (this runner holding one session): its servers start
with the drive's first turn and stop when the drive ends. A stdio server runs inside the command
sandbox (:meth:`cox_runner.workspace.sandbox.Sandbox.wrap`) with the workspace as its folder and the
scrubbed environment commands get; an HTTP server is reached at its ``url``. Each server's tools
are listed once at start and offered to the model as ``<server>__<tool>`` with the server's input
schema.

Nothing here decides whether a call may run: the turn loop sends every call through the gate
first (guard, judge, person), like ``run_command``. A server that fails to start, or whose
connection closes (it died), changes state (``mcp.server`` events, taken by the loop with
:meth:`McpServers.take_changes`) and its tools are withdrawn; it never ends the turn.

The client is the official ``mcp`` package (``ClientSession`` over ``stdio_client`` or
``streamable_http_client``). Its transports run in anyio task groups, which must be entered and
left by the same task: each server's connection lives in a task of its own (:meth:`_Server._run`)
and the turn's calls reach it through the session object.
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib
import json
import re
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from coxswain.config import McpServerConfig, Settings
from coxswain.logs import redact_url

from . import limits
from .egress import Request
from .sandbox import Sandbox

if TYPE_CHECKING:
    from pydantic_ai.tools import ToolDefinition

SEP = "__"
NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")
"""What a tool name may be for the providers (OpenAI's rule, the strictest)."""
CLOSE_TIMEOUT_S = 5.0
STDERR_TAIL = 400


SDK_MODULES = ("mcp.client.stdio", "mcp.client.streamable_http", "mcp.shared.exceptions")
"""The MCP SDK's modules a server's connection imports (:meth:`_Server._run`)."""


def _import_sdk() -> None:
    for name in SDK_MODULES:
        importlib.import_module(name)


async def load_sdk() -> None:
    """Import the MCP SDK off the event loop. Its import builds pydantic schemas for every MCP
    type (~1 s of CPU, 9 s seen on a loaded 2-core machine): on the loop, it held the lease
    renewals until the lease lapsed and the turn ended ``crashed``. The runner calls this at start
    when servers are configured; a drive's first start calls it again (a no-op once imported)."""
    if not all(name in sys.modules for name in SDK_MODULES):
        await asyncio.to_thread(_import_sdk)


class McpDown(Exception):
    """The server's connection closed (it died) or it is not ready."""


@dataclass
class Change:
    """A server's new state, for an ``mcp.server`` event."""

    name: str
    state: str
    tools: list[str]
    error: str | None


@dataclass
class _Server:
    cfg: McpServerConfig
    state: str = "idle"
    error: str | None = None
    tools: dict[str, ToolDefinition] = field(default_factory=dict)
    """Model-facing name -> definition, while ready."""
    session: Any = None
    task: asyncio.Task[None] | None = None
    closing: asyncio.Event = field(default_factory=asyncio.Event)
    errlog: Any = None
    requests: list[Request] = field(default_factory=list)
    """What it asked the egress proxy for since its last call's result (a stdio server granted
    the network): recorded as ``network.request`` events with that result."""

    def public(self, tool: str) -> str:
        return f"{self.cfg.name}{SEP}{tool}"

    def alive(self) -> bool:
        """False once the connection closed (the SDK's dispatcher closes when the stream ends)."""
        if self.session is None or self.task is None or self.task.done():
            return False
        dispatcher = getattr(self.session, "_dispatcher", None)
        return not bool(getattr(dispatcher, "_closed", False))

    def stderr_tail(self) -> str:
        if self.errlog is None:
            return ""
        try:
            self.errlog.flush()
            self.errlog.seek(0)
            text = self.errlog.read()[-4000:]
        except (OSError, ValueError):
            return ""
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        return " | ".join(lines[-3:])[-STDERR_TAIL:]

    async def _run(self, workspace: Path, sandbox: Sandbox, env: dict[str, str],
                   ready: asyncio.Future[None]) -> None:
        """Open the connection, list the tools, hold it until closing (all in this task)."""
        from mcp import ClientSession, StdioServerParameters
        from mcp.client.stdio import stdio_client
        from mcp.client.streamable_http import streamable_http_client
        from pydantic_ai.tools import ToolDefinition  # a drive's: loaded with the turns (drive.load_turns)

        cfg = self.cfg
        box: limits.Box | None = None
        try:
            async with contextlib.AsyncExitStack() as stack:
                if cfg.url is not None:
                    streams = await stack.enter_async_context(streamable_http_client(cfg.url))
                else:
                    await sandbox.prepare(workspace)
                    sock = None
                    if sandbox.networked(cfg.network):
                        sock = (await stack.enter_async_context(sandbox.egress.grant(self.requests))).socket
                    argv = sandbox.wrap(workspace, cfg.argv(), cfg.network, egress=sock)
                    # pids and memory (and rlimits) for the server's lifetime; killed and removed
                    # with it (its CPU time is not bounded: it lives as long as the drive)
                    box = await asyncio.to_thread(limits.of(sandbox).box, "mcp")
                    argv = box.argv(argv)
                    params = StdioServerParameters(command=argv[0], args=argv[1:], env=env, cwd=str(workspace))
                    streams = await stack.enter_async_context(stdio_client(params, errlog=self.errlog))
                read, write = streams[0], streams[1]
                session = await stack.enter_async_context(ClientSession(read, write))
                await session.initialize()
                listed = await _list_all(session)
                self.tools = {}
                for t in listed:
                    public = self.public(t.name)
                    if not cfg.offers(t.name) or not NAME_RE.match(public):
                        continue
                    schema = t.input_schema if isinstance(t.input_schema, dict) else {"type": "object"}
                    self.tools[public] = ToolDefinition(name=public, description=t.description or "",
                                                        parameters_json_schema=schema)
                self.session = session
                if not ready.done():
                    ready.set_result(None)
                await self.closing.wait()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # noqa: BLE001 - any failure to start or to hold is the server's state
            if not ready.done():
                ready.set_exception(exc if isinstance(exc, Exception) else RuntimeError(repr(exc)))
        finally:
            self.session = None
            if box is not None:
                await box.close()


async def _list_all(session: Any) -> list[Any]:
    out: list[Any] = []
    cursor: str | None = None
    from mcp import types

    for _ in range(100):
        res = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)
        out.extend(res.tools)
        cursor = res.next_cursor
        if not cursor:
            break
    return out


def _scrub(cfg: McpServerConfig, text: str | None) -> str | None:
    """An error as events and logs may show it: the server's ``env`` values and the URL's
    credentials (``user:pass@``) replaced (a server's stderr may print them)."""
    if text is None:
        return None
    for value in cfg.env.values():
        if len(value) >= 4:
            text = text.replace(value, "***")
    if cfg.url is not None:
        text = text.replace(cfg.url, redact_url(cfg.url))
    return text


def describe(exc: BaseException) -> str:
    """A short reason for a failure (an exception group's first leaf)."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return text[:300]


class McpServers:
    """The MCP servers of one drive (one session on this runner)."""

    def __init__(self, settings: Settings, sandbox: Sandbox, log: Any) -> None:
        self.settings = settings
        self.sandbox = sandbox
        self.log = log
        self.servers: dict[str, _Server] = {c.name: _Server(c) for c in settings.mcp.enabled()}
        self.started = False
        self._changes: list[Change] = []
        self.workspace: Path | None = None

    def __bool__(self) -> bool:
        return bool(self.servers)

    async def start(self, workspace: Path, env: dict[str, str]) -> None:
        """Start every server once (concurrently), each bounded by its ``start_timeout_s``."""
        if self.started:
            return
        self.started = True
        self.workspace = workspace
        try:
            await load_sdk()
            await asyncio.gather(*(self._start(s, workspace, env) for s in self.servers.values()))
        except asyncio.CancelledError:
            # Stop during the start: nothing half-started stays behind; the next turn starts again.
            await self.aclose()
            self.servers = {c.name: _Server(c) for c in self.settings.mcp.enabled()}
            self._changes = []
            self.started = False
            raise

    async def _start(self, s: _Server, workspace: Path, env: dict[str, str]) -> None:
        loop = asyncio.get_running_loop()
        ready: asyncio.Future[None] = loop.create_future()
        if s.cfg.url is None:
            s.errlog = tempfile.TemporaryFile("w+", prefix="cox-mcp-")  # the server's stderr, for its error
        s.task = asyncio.create_task(s._run(workspace, self.sandbox, {**env, **s.cfg.env}, ready),
                                     name=f"mcp-{s.cfg.name}")
        try:
            await asyncio.wait_for(asyncio.shield(ready), s.cfg.start_timeout_s)
        except TimeoutError:
            ready.cancel()  # a failure the server task reports later has no reader
            await self._stop(s)
            self._set(s, "failed", f"it did not start within {s.cfg.start_timeout_s:g}s")
            return
        except Exception as exc:  # noqa: BLE001 - the reason is the server's state
            tail = s.stderr_tail()
            await self._stop(s)
            self._set(s, "failed", describe(exc) + (f" (stderr: {tail})" if tail else ""))
            return
        self._set(s, "ready", None)
        self.log.info("mcp.ready", server=s.cfg.name, tools=sorted(s.tools))

    def _set(self, s: _Server, state: str, error: str | None) -> None:
        s.state, s.error = state, _scrub(s.cfg, error)
        if state != "ready":
            s.tools = {}
            self.log.warning("mcp.server", server=s.cfg.name, state=state, error=error)
        self._changes.append(Change(s.cfg.name, state, sorted(s.tools), error))

    def take_requests(self, name: str) -> list[Request]:
        """The connections server ``name`` asked the egress proxy for since last taken."""
        s = self.servers.get(name)
        if s is None:
            return []
        out, s.requests[:] = list(s.requests), []
        return out

    def take_changes(self) -> list[Change]:
        """State changes not recorded yet (each an ``mcp.server`` event); checks for servers that
        died since (their connection closed) first."""
        for s in self.servers.values():
            if s.state == "ready" and not s.alive():
                self._exited(s, None)
        out, self._changes = self._changes, []
        return out

    def _exited(self, s: _Server, why: str | None) -> None:
        tail = s.stderr_tail()
        err = why or "the server's connection closed (it exited)"
        self._set(s, "exited", err + (f" (stderr: {tail})" if tail else ""))

    def states(self) -> str:
        """Every server's state, as the session hash's ``mcp`` keeps it for the session object."""
        return json.dumps([{"name": s.cfg.name, "state": s.state, "tools": sorted(s.tools), "error": s.error}
                           for s in self.servers.values() if s.state != "idle"], ensure_ascii=False)

    def tool_defs(self) -> list[ToolDefinition]:
        """The tools of the servers that are ready now (withdrawn ones are not offered)."""
        return [d for s in self.servers.values() if s.state == "ready" for d in s.tools.values()]

    def find(self, public: str) -> tuple[McpServerConfig, str] | None:
        """The configured server and tool a model-facing name stands for (ready or not)."""
        return self.settings.mcp.server_of(public)

    def available(self, public: str) -> str | None:
        """Why a call to ``public`` cannot go to its server now, or None when it can."""
        found = self.find(public)
        if found is None:
            return None
        s = self.servers[found[0].name]
        if s.state != "ready":
            what = {"failed": "did not start", "exited": "exited", "idle": "is not started"}.get(s.state, s.state)
            return f"the MCP server {s.cfg.name!r} {what}" + (f": {s.error}" if s.error else "") + \
                "; its tools are withdrawn"
        if public not in s.tools:
            return f"the MCP server {s.cfg.name!r} offers no tool {found[1]!r}"
        return None

    async def call(self, public: str, args: dict[str, Any], timeout_s: float) -> tuple[bool, str]:
        """Call the tool; (ok, text the model reads). Raises :class:`McpDown` when the server's
        connection closed (it is marked ``exited``); a time-out is an error result."""
        found = self.find(public)
        if found is None:
            raise McpDown(f"no MCP server for {public!r}")
        cfg, tool = found
        s = self.servers[cfg.name]
        session = s.session
        if s.state != "ready" or session is None:
            raise McpDown(self.available(public) or "the MCP server is not ready")
        try:
            return await self._call(s, cfg, tool, session, args, timeout_s)
        finally:
            await self._settle(s)  # nothing the server made during the call stays setuid/setgid

    async def _settle(self, s: _Server) -> None:
        if s.cfg.url is None and self.workspace is not None:
            await self.sandbox.settle(self.workspace)

    async def _call(self, s: _Server, cfg: McpServerConfig, tool: str, session: Any, args: dict[str, Any],
                    timeout_s: float) -> tuple[bool, str]:
        from mcp.shared.exceptions import MCPError

        try:
            res = await asyncio.wait_for(session.call_tool(tool, args), timeout_s)
        except TimeoutError:
            return False, f"Error: the MCP tool did not answer within {timeout_s:g}s."
        except MCPError as exc:
            if not s.alive() or "closed" in str(exc).lower():
                self._exited(s, f"the server's connection closed during a call ({exc})")
                await self._stop(s)
                raise McpDown(f"the MCP server {cfg.name!r} exited during the call") from exc
            return False, f"Error: {exc}"
        except (OSError, RuntimeError, ValueError) as exc:
            return False, f"Error: the MCP call failed: {describe(exc)}"
        return not bool(getattr(res, "is_error", False)), render(res)

    async def _stop(self, s: _Server) -> None:
        s.closing.set()
        task = s.task
        if task is not None and not task.done():
            if s.session is None:  # still starting: nothing to wind down politely
                task.cancel()
            try:
                await asyncio.wait_for(asyncio.shield(task), CLOSE_TIMEOUT_S)
            except (TimeoutError, asyncio.CancelledError):
                task.cancel()
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(task, CLOSE_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - the server is going away either way
                pass
        if s.errlog is not None and (task is None or task.done()):
            s.errlog.close()
            s.errlog = None
        if task is not None:
            await self._settle(s)  # and what it made before it exited

    async def aclose(self) -> None:
        """Stop every server (the drive ends): bounded, and finished even if the caller is cancelled."""
        servers = [s for s in self.servers.values() if s.task is not None]
        if not servers:
            return
        done = asyncio.ensure_future(asyncio.gather(*(self._stop(s) for s in servers), return_exceptions=True))
        with contextlib.suppress(BaseException):
            await asyncio.shield(done)


def render(res: Any) -> str:
    """A tool result as text for the model: its text parts, other content named."""
    parts: list[str] = []
    for c in getattr(res, "content", None) or []:
        kind = getattr(c, "type", "")
        if kind == "text":
            parts.append(str(getattr(c, "text", "")))
        elif kind == "resource":
            r = getattr(c, "resource", None)
            parts.append(str(getattr(r, "text", "") or f"[resource {getattr(r, 'uri', '')}]"))
        else:
            parts.append(f"[{kind or 'content'} not shown]")
    text = "\n".join(parts)
    if not text.strip() and getattr(res, "structured_content", None) is not None:
        text = json.dumps(res.structured_content, ensure_ascii=False)
    return text
