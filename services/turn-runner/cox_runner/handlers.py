"""What each tool does once the gate allowed the call: one small function per tool, in a table.

A new tool is its definition in :mod:`cox_runner.workspace.tools`, guard's policy for it, and one entry in
:data:`HANDLERS` here. A handler records the call's result (or raises to end the turn); errors
a tool meets (a missing file, a refused path) become an ``Error: ...`` result in
:func:`execute`. Handlers get a :class:`ToolContext`, never the turn loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from pydantic_ai.messages import ToolCallPart

from coxswain import events as ev
from coxswain import safefs, sandbox_user, textdiff
from coxswain.errors import CoxError
from coxswain.models import KeepRequest, Plan

from . import cmdversions, infra
from .budget import Budget
from .deps import Deps
from .errors import LeaseLost, SandboxUnavailable, StopRequested
from .gate import GateOutcome, Taint
from .recorder import Recorder
from .turn import EndTurn, Turn, stopped_by
from .workspace import egress, limits, tools
from .workspace.egress import Request
from .workspace.mcp_servers import McpDown

T = TypeVar("T")
PROGRAM_SETTLE_S = 0.3
"""``start_program`` waits this long for a program that fails at once, to say so in its result."""


@dataclass
class PlanState:
    """The turn's plan (``None``: no plan) and whether it was carried from an unfinished turn."""

    plan: Plan | None = None
    carried: bool = False

    def stored(self) -> str:
        """The plan as the session hash keeps it."""
        assert self.plan is not None
        return json.dumps(self.plan.model_dump(mode="json", exclude_none=True), ensure_ascii=False)


@dataclass
class ToolContext:
    deps: Deps
    turn: Turn
    rec: Recorder
    budget: Budget
    taint: Taint
    plan: PlanState
    log: Any
    guarded: Callable[[Coroutine[Any, Any, Any] | Awaitable[Any]], Awaitable[Any]]
    """Await something unless Stop/steer comes first (then StopRequested)."""


Handler = Callable[[ToolContext, ToolCallPart, dict[str, Any], GateOutcome], Awaitable[None]]


async def execute(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    """Run an allowed call through its handler; what the tool failed on becomes its result."""
    try:
        await HANDLERS.get(call.tool_name, mcp_call)(ctx, call, args, outcome)
    except (StopRequested, LeaseLost, asyncio.CancelledError, EndTurn):
        raise
    except CoxError as exc:
        await ctx.rec.result(call, False, f"Error: {exc.detail}")
    except (OSError, ValueError) as exc:
        await ctx.rec.result(call, False, f"Error: {exc}")


async def read_file(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    limit = ctx.deps.settings.runner.output_limit
    text = await asyncio.to_thread(tools.read_file, ctx.turn.workspace, outcome.path or args["path"], limit,
                                   args.get("offset"), args.get("limit"))
    ctx.taint.add(text)
    await ctx.rec.result(call, True, text)


async def find_files(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    s = ctx.deps.settings
    text = await asyncio.to_thread(tools.find_files, ctx.turn.workspace, args["pattern"], s.runner.output_limit,
                                   s.store_dir)
    ctx.taint.add(text)
    await ctx.rec.result(call, True, text)


async def search_text(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    s = ctx.deps.settings
    text = await asyncio.to_thread(tools.search_text, ctx.turn.workspace, args["pattern"], outcome.path or "",
                                   s.runner.output_limit, s.store_dir)
    ctx.taint.add(text)
    await ctx.rec.result(call, True, text)


async def edit_file(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    """Replace an exact occurrence (or exactly ``count``); written like ``write_file`` (kept first,
    fenced, versioned). No match, or not the number asked for, fails with where the matches are."""
    ctx.budget.actions += 1
    rel = outcome.path or args["path"]
    edit = await asyncio.to_thread(tools.edit_file, ctx.turn.workspace, rel, args["old"], args["new"],
                                   args.get("count"))
    if edit.content is None:
        await ctx.rec.result(call, False, edit.summary(rel))
        return
    await write(ctx, call, rel, edit.content, said=edit.summary(rel))


async def list_dir(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    text = await asyncio.to_thread(tools.list_dir, ctx.turn.workspace, outcome.path or "")
    await ctx.rec.result(call, True, text)


_SETTLING: set[asyncio.Task[None]] = set()


async def _settle_apart(cleanup: Coroutine[Any, Any, None], log: Any, rel: str) -> None:
    """Run a half-done write's cleanup to its end even if the caller is cancelled again.

    A turn that loses its lease is cancelled more than once (the local deadline, then the
    renewal that finds the lease gone): the cleanup is a task of its own, which a second
    cancellation of the caller does not reach, so no temporary file is left behind.
    """
    task = asyncio.ensure_future(cleanup)
    _SETTLING.add(task)

    def done(t: asyncio.Task[None]) -> None:
        _SETTLING.discard(t)
        if not t.cancelled() and t.exception() is not None:
            log.warning("write.cleanup_failed", path=rel, error=repr(t.exception()))

    task.add_done_callback(done)
    with contextlib.suppress(BaseException):
        await asyncio.shield(task)


async def write_file(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    ctx.budget.actions += 1
    await write(ctx, call, outcome.path or args["path"], args["content"])


async def write(ctx: ToolContext, call: ToolCallPart, rel: str, content: str, said: str | None = None) -> None:
    """Keep the previous content, then write atomically. Never cancelled half-way: neither a
    Lead nor Stop interrupts it (the write is not raced against the stop signal).

    Fenced for real, not checked-then-done: the content is staged in a temp file, the intent
    (path, temp name) is recorded in Redis by the same call that checks the lease's token,
    and only then is the temp file renamed into place. A runner that takes the session over
    settles every recorded intent first by renaming its temp file away (``safefs.abort``):
    a rename that had run is recorded as a write that landed; one that had not can no longer
    run, however long this process was paused between the check and the rename.
    """
    t, rec = ctx.turn, ctx.rec
    ws = t.workspace
    data = content.encode("utf-8", errors="surrogatepass")
    kept = await infra.call(ctx.deps, t, ctx.budget, ctx.log, "versions",
                            lambda attempt: ctx.deps.clients.keep(KeepRequest(
                                sid=t.sid, workspace=str(ws), path=rel, token=int(t.token), reason="write",
                                turn_id=t.turn_id, call_id=call.tool_call_id, again=attempt > 0,
                            )))

    sb = ctx.deps.settings.sandbox
    owner = sandbox_user.file_owner(sb.user, sb.mode)  # as root: the commands' user can change it

    def prepare() -> tuple[bytes | None, str]:
        return safefs.read(ws, rel), safefs.stage(ws, rel, data, owner=owner)

    staging = asyncio.ensure_future(asyncio.to_thread(prepare))
    try:
        old, tmp = await asyncio.shield(staging)
    except asyncio.CancelledError:
        # The thread runs on: once it has staged the file, nobody will ever commit it.
        async def unstage() -> None:
            await asyncio.wait({staging}, timeout=10)
            if staging.done() and staging.exception() is None:
                await asyncio.to_thread(safefs.discard, ws, rel, staging.result()[1])
        await _settle_apart(unstage(), ctx.log, rel)
        raise
    added, removed = textdiff.counts(old, data)
    intent = json.dumps({"path": rel, "tmp": tmp, "bytes": len(data), "added": added, "removed": removed,
                         "version_id": kept.version_id, "store": kept.store, "kept_path": kept.path})
    fence = asyncio.ensure_future(ctx.deps.leases.ensure(ctx.deps.store.fns, t.sid, t.token, call.tool_call_id, intent))
    try:
        await asyncio.shield(fence)
    except BaseException:
        # Cancelled (the drive's deadline passed) or refused or Redis failed: the write does
        # not go ahead. Refused, nothing was recorded and the temp file goes; otherwise the
        # intent may be recorded, so the temp file is renamed away (a takeover that settles
        # the intent finds "did not land" and removes it).
        async def unfence() -> None:
            if not fence.done():
                await asyncio.wait({fence}, timeout=5)
            refused = fence.done() and not fence.cancelled() and isinstance(fence.exception(), LeaseLost)
            await asyncio.to_thread(safefs.discard if refused else safefs.abort, ws, rel, tmp)
        await _settle_apart(unfence(), ctx.log, rel)
        raise
    await asyncio.shield(asyncio.to_thread(safefs.commit, ws, rel, tmp))
    text = f"Wrote {rel} ({len(data)} bytes, +{added} -{removed})."
    await rec.result(
        call, True, f"{said} {text}" if said else text,
        extra=[ev.VersionKept(**rec.e(), path=kept.path, version_id=kept.version_id, store=kept.store),
               ev.FileWritten(**rec.e(), path=rel, added=added, removed=removed)],
        first=True,
    )


async def run_command(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    t, rec, deps = ctx.turn, ctx.rec, ctx.deps
    if not await _sandbox_ready(ctx, call):
        return
    ctx.budget.actions += 1
    timeout = float(args.get("timeout_s") or deps.settings.runner.command_timeout_s)
    timeout = min(timeout, max(1.0, ctx.budget.time_left(time.monotonic())))
    limit = deps.settings.runner.output_limit
    snap = await cmdversions.before(deps, t, ctx.budget, ctx.log)
    requests: list[Request] = []
    try:
        with deps.programs.joined(t.sid) as netns:  # the session's programs are reached on its loopback
            res = await ctx.guarded(tools.run_command(t.workspace, args["command"], timeout, limit,
                                                      deps.sandbox, bool(args.get("network")), requests=requests,
                                                      netns=netns))
    except StopRequested:
        kept = await cmdversions.after(deps, t, ctx.log, call.tool_call_id, snap)
        note = f"\n{kept.note}" if kept.note else ""
        await rec.result(call, False, f"Cancelled: {stopped_by(t.stop_reason)} the turn; the command was killed.{note}",
                         extra=[*egress.network_events(rec.e(), requests, call.tool_call_id), *kept.events],
                         first=True, limit=kept.limit)
        raise
    ctx.taint.add(res.output)
    head = f"exit code {res.exit_code}\n" if res.exit_code is not None else ""
    kept = await cmdversions.after(deps, t, ctx.log, call.tool_call_id, snap)
    output = head + res.output + (f"\n{kept.note}" if kept.note else "")
    hit = res.limit
    if hit is None and kept.at_file_limit:  # a writer whose SIGXFSZ nobody reported (in a pipeline)
        hit = "file_mb"
        output += "\n" + limits.killed_note(hit, deps.settings.sandbox).replace(
            "the command passed", f"{kept.at_file_limit[0]} reached")
    await rec.result(call, res.exit_code == 0 and not res.timed_out and hit is None, output,
                     extra=[*egress.network_events(rec.e(), requests, call.tool_call_id), *kept.events],
                     first=True, limit=hit or kept.limit)


async def _sandbox_ready(ctx: ToolContext, call: ToolCallPart) -> bool:
    """Fail closed: a command whose sandbox cannot start is refused (recorded), never run bare."""
    sandbox = ctx.deps.sandbox
    await sandbox.ready()
    status = sandbox.status()
    if status.available:
        return True
    await ctx.rec.emit(ev.PolicyDecision(**ctx.rec.e(), call_id=call.tool_call_id, verdict="refuse",
                                         actor="sandbox", reason=f"the command sandbox is unavailable: {status.reason}",
                                         name=call.tool_name))
    ctx.log.error("sandbox.refused", sid=ctx.turn.sid, call_id=call.tool_call_id, reason=status.reason)
    await ctx.rec.result(call, False, f"Refused: the command sandbox is unavailable ({status.reason}); the "
                                      "command was not run. Commands never run outside the sandbox unless the "
                                      "operator sets [sandbox] mode = \"none\".")
    return False


async def start_program(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    """Start a program that outlives the turn (:mod:`cox_runner.programs`); at most
    ``[sandbox] max_programs`` per session."""
    t, rec, deps = ctx.turn, ctx.rec, ctx.deps
    progs = deps.programs
    why = progs.refusal(t.sid)
    if why is not None:
        await rec.result(call, False, f"Refused: {why}. The program was not started.")
        return
    if not await _sandbox_ready(ctx, call):
        return
    ctx.budget.actions += 1
    snap = await cmdversions.before(deps, t, ctx.budget, ctx.log)
    try:
        p = await progs.start(t.sid, t.workspace, args["command"], name=args.get("name"),
                              network=bool(args.get("network")), pty=bool(args.get("pty")), by="model", snap=snap)
    except SandboxUnavailable as exc:
        await rec.result(call, False, f"Refused: the command sandbox is unavailable ({exc.detail}); the program "
                                      "was not started.")
        return
    await rec.emit(ev.ProgramStarted(**rec.e(), program_id=p.program_id, name=p.name, command=p.command,
                                     network=p.network, pty=p.pty, call_id=call.tool_call_id),
                   ops=[progs.listing(t.sid)])
    with contextlib.suppress(TimeoutError):  # a program that fails at once says so in this result
        await asyncio.wait_for(asyncio.shield(p.done.wait()), PROGRAM_SETTLE_S)
    state = "running" if p.running else f"it already exited with code {p.code}"
    await rec.result(call, True, f"Started program {p.program_id} ({p.name}): {state}. Read its output with "
                                 f"read_program, send it input with write_program, end it with stop_program. It "
                                 "keeps running after this turn.")


async def _program(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any]) -> Any:
    """The program a call names, or None after recording an error result that says why."""
    t = ctx.turn
    progs = ctx.deps.programs
    p = progs.find(t.sid, str(args.get("program_id", "")))
    if p is None:
        here = ", ".join(f"{q.program_id} ({q.name})" for q in progs.running(t.sid)) or "none"
        await ctx.rec.result(call, False, f"Error: no program {args.get('program_id')!r} runs in this session "
                                          f"(running: {here}).")
    return p


async def read_program(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    """What a program wrote since the last read (bounded like a command's output); what it
    changed in the workspace since its last snapshot is versioned now."""
    t, rec, deps = ctx.turn, ctx.rec, ctx.deps
    p = await _program(ctx, call, args)
    if p is None:
        return
    wait = min(float(args.get("wait_s") or 0), max(0.0, ctx.budget.time_left(time.monotonic()) - 1))
    got = await ctx.guarded(deps.programs.read(p, since=args.get("since"), wait_s=wait))
    kept = await deps.programs.books.versions_after_read(p, int(t.token), t.turn_id, call.tool_call_id) \
        if p.running else []
    net = egress.network_events(rec.e(), p.requests, call.tool_call_id)  # a granted program's connections so far
    ctx.taint.add(got.text)
    await rec.result(call, True, got.text, extra=[*net, *kept], first=True)


async def write_program(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    """Input to a running program, once the gate allowed it (its own confirm)."""
    p = await _program(ctx, call, args)
    if p is None:
        return
    ctx.budget.actions += 1
    said = await ctx.deps.programs.write(p, args["text"])
    await ctx.rec.result(call, not said.startswith("Error"), said + ("" if said.startswith("Error") else
                                                                      "; read its answer with read_program."))


async def stop_program(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    p = await _program(ctx, call, args)
    if p is None:
        return
    was = p.running
    await ctx.deps.programs.stop(p, "model")
    said = f"Stopped program {p.program_id} ({p.name})." if was else         f"Program {p.program_id} ({p.name}) had already exited with code {p.code}."
    await ctx.rec.result(call, True, said)


async def respond(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    await ctx.rec.emit(ev.AgentMessage(**ctx.rec.e(), text=args["text"]))
    await ctx.rec.result(call, True, "Delivered to the person.")


async def plan_write(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    steps = [str(s) for s in args["steps"]]
    ctx.plan.plan = Plan(steps=steps, marks=[], turn_id=ctx.turn.turn_id)
    ctx.plan.carried = False
    await ctx.rec.emit(ev.PlanWrite(**ctx.rec.e(), steps=steps), ops=[("hset", "", "plan", ctx.plan.stored())])
    await ctx.rec.result(call, True, f"Plan of {len(steps)} steps recorded.")


async def plan_step(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    step = int(args["step"])
    plan = ctx.plan.plan
    if plan is None:
        await ctx.rec.result(call, False, "Error: there is no plan; write one with plan_write first.")
        return
    if not 1 <= step <= len(plan.steps):
        await ctx.rec.result(call, False, f"Error: the plan has steps 1 to {len(plan.steps)}.")
        return
    ctx.plan.plan = plan.model_copy(update={"marks": sorted(set(plan.marks) | {step})})
    await ctx.rec.emit(ev.PlanStep(**ctx.rec.e(), step=step), ops=[("hset", "", "plan", ctx.plan.stored())])
    await ctx.rec.result(call, True, f"Step {step} marked done.")


async def mcp_changes(rec: Recorder, servers: Any) -> None:
    """Record the MCP servers' state changes (``mcp.server`` events; the session object's list)."""
    if servers is None:
        return
    for c in servers.take_changes():
        await rec.emit(ev.McpServer(**rec.e(), name=c.name, state=c.state, tools=c.tools, error=c.error),
                       ops=[("hset", "", "mcp", servers.states())])


async def mcp_call(ctx: ToolContext, call: ToolCallPart, args: dict[str, Any], outcome: GateOutcome) -> None:
    """A call to an MCP server's tool, allowed by the gate like any action. Stop cancels it (the
    result says so); a server that dies during it is recorded ``exited`` and the call gets an
    error result. A stdio server's action is versioned like a command: what it changed in the
    workspace is kept (``version.kept``, ``file.written`` via ``command``)."""
    t, rec, deps = ctx.turn, ctx.rec, ctx.deps
    servers = t.mcp
    found = deps.settings.mcp.server_of(call.tool_name)
    why = servers.available(call.tool_name) if servers is not None else "no MCP server is running"
    if found is None or why is not None:
        await rec.result(call, False, f"Error: {why or 'unknown tool'}.")
        return
    cfg, tool = found
    action = not cfg.is_read_only(tool)
    if action:
        ctx.budget.actions += 1
    timeout = min(cfg.timeout_s, max(1.0, ctx.budget.time_left(time.monotonic())))
    versioned = action and cfg.url is None
    snap = await cmdversions.before(deps, t, ctx.budget, ctx.log) if versioned else None

    async def kept() -> list[ev._Event]:
        net = egress.network_events(rec.e(), servers.take_requests(cfg.name), call.tool_call_id, cfg.name)
        return [*net, *((await cmdversions.after(deps, t, ctx.log, call.tool_call_id, snap)).events if versioned else [])]

    try:
        ok, text = await ctx.guarded(servers.call(call.tool_name, args, timeout))
    except StopRequested:
        await rec.result(call, False, f"Cancelled: {stopped_by(t.stop_reason)} the turn; the MCP call was "
                                      "cancelled.", extra=await kept(), first=True)
        raise
    except McpDown as exc:
        await mcp_changes(rec, servers)
        await rec.result(call, False, f"Error: {exc}; its tools are withdrawn.", extra=await kept(), first=True)
        return
    text = tools.clip(text, deps.settings.runner.output_limit)
    ctx.taint.add(text)
    await rec.result(call, ok, text, extra=await kept(), first=True)


HANDLERS: dict[str, Handler] = {
    "read_file": read_file,
    "list_dir": list_dir,
    "find_files": find_files,
    "search_text": search_text,
    "write_file": write_file,
    "edit_file": edit_file,
    "run_command": run_command,
    "start_program": start_program,
    "read_program": read_program,
    "write_program": write_program,
    "stop_program": stop_program,
    "respond": respond,
    "plan_write": plan_write,
    "plan_step": plan_step,
}
"""One entry per tool in :data:`cox_runner.workspace.tooldefs.TOOLS` (a no-server test checks they match); an
MCP server's tools (``<server>__<tool>``) all go to :func:`mcp_call`."""
