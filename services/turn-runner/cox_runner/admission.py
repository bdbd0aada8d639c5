"""Admission: each person's action (create, patch, send, Lead, Stop, answer, observe, restore,
undo) as one atomic call into the Redis library, then a doorbell to the runner that holds the
session so it acts on it at once.

Any runner may admit any session's action: the queue group spreads requests, and Redis decides.
A send to an idle session starts the turn on the runner that admitted it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from coxswain import bus, keys, session_view
from coxswain import events as ev
from coxswain.errors import (
    Conflict,
    Invalid,
    NotAccepting,
    NotFound,
    TooLarge,
    TooManyPrograms,
    Unavailable,
    WorkspaceInvalid,
    logged,
)
from coxswain.ids import new_id
from coxswain.models import (
    Accepted,
    ApprovalCmd,
    CompactCmd,
    CompactResult,
    CreateCmd,
    LeadCmd,
    LeadResult,
    ObserveCmd,
    PatchCmd,
    ProgramStopCmd,
    RestoreCmd,
    RestoreRequest,
    SendCmd,
    SendResult,
    Session,
    StopCmd,
    StopResult,
    UndoCmd,
    UndoRequest,
    WriteOutcome,
)

from . import cmdversions, drive, instructions, spending
from .attachments import Attachments
from .deps import Deps
from .errors import LeaseLost, SandboxUnavailable, StoreDown
from .leases import Drive
from .redis.store import as_list
from .workspace import egress, tools
from .workspace.egress import Request
from .workspaces import Workspaces

STOP_SETTLE_S = 10.0
OBSERVE_TIMEOUT_S = 60.0
WORKSPACE_CACHE = 10_000
ROOT_SESSION = ("this session's workspace is the root itself, which reaches every workspace: it runs nothing "
                "more; open a session on a folder under the root")


async def _start_turn(r: Deps, sid: str, token: str, holder: Any, sent: float, first: dict[str, Any]) -> None:
    """Run the turn a send began: here, or where the session's programs run (``cox_send`` took
    the lease in that runner's name); when that runner is gone (no responder), here after all,
    and the turn finds its programs gone."""
    if holder and holder != r.owner:
        # The other runner reads the observations at the turn's first result: a doorbell for one
        # recorded before its drive exists would find none there.
        first = {k: v for k, v in first.items() if k != "observed"}
        if await r.doorbell.ask(str(holder), sid, "drive", {"token": token, "first": first}):
            return
        r.log.warning("programs.holder_gone", sid=sid, holder=holder)
    drive.start_drive(r, Drive(sid=sid, token=token, acquired=sent, first=first))


async def stop_programs(r: Deps, sid: str, data: dict[str, Any], principal: str | None = None) -> None:
    """Ask the runner that runs the session's programs (its program lock) to stop them (``data``:
    ``by``, and ``program_id`` for one); with ``principal``, only that person's session's."""
    if principal is not None and await r.redis.hget(keys.session(sid), "principal") != principal:
        raise NotFound("no such session")
    holder = await r.redis.get(keys.session(sid) + keys.PROGRAM_LOCK)
    if holder:
        await r.doorbell.ring(holder, sid, "programs", data)


async def _observed_run(r: Deps, sid: str, ws: str, command: str, requests: list[Request]) -> tuple[int | None, str]:
    """A person's ``!command`` run in the sandbox (beside the session's programs, on its loopback):
    its exit code and what it said (a refusal when the sandbox cannot start)."""
    try:
        with r.programs.joined(sid) as netns:
            res = await tools.run_command(Path(ws), command, OBSERVE_TIMEOUT_S, r.settings.runner.output_limit,
                                          r.sandbox, requests=requests, netns=netns)
    except SandboxUnavailable as exc:
        return None, f"Refused: the command sandbox is unavailable ({exc.detail}); the command was not run."
    return res.exit_code, (f"exit code {res.exit_code}\n" if res.exit_code is not None else "") + res.output


async def _background(r: Deps, cmd: ObserveCmd, ws: str) -> Accepted:
    """A person's ``!&command``: one of the session's programs (``program.started``, by ``person``),
    started on the runner that runs the session's programs (this one when it runs none); the
    model learns of it with its next tool result, as of a ``!command``."""
    holder = await r.redis.get(keys.session(cmd.sid) + keys.PROGRAM_LOCK)
    if holder and holder != r.owner:
        raise NotAccepting("the session's programs run on another turn-runner, which did not take this one; "
                           "send it again")
    why = r.programs.refusal(cmd.sid)
    if why is not None:
        raise TooManyPrograms(why)
    async with r.programs.books.version_token(cmd.sid) as token:
        snap = await cmdversions.snapshot(r.clients, r.log, cmd.sid, ws, token) if token else None
    try:
        p = await r.programs.start(cmd.sid, Path(ws), cmd.command, name=None, network=False, pty=False, by="person",
                                   snap=snap)
    except SandboxUnavailable as exc:
        raise Unavailable(f"the command sandbox is unavailable ({exc.detail}); the command was not run") from None
    turn_id, runner_id = await r.redis.hmget(keys.session(cmd.sid), ["turn_id", "runner"])
    said = (f"started in the background as program {p.program_id} ({p.name}); read it with read_program "
            f"{{\"program_id\": \"{p.program_id}\"}}")
    record = json.dumps({"command": f"&{cmd.command}", "output": said}, ensure_ascii=False)
    await r.store.fns.emit(sid=cmd.sid, token="", owner=r.owner,
                           ops=[r.programs.listing(cmd.sid), ("rpush", keys.OBSERVED, "", record)],
                           events=[ev.body(ev.ProgramStarted(sid=cmd.sid, turn_id=turn_id or None,
                                                             program_id=p.program_id, name=p.name,
                                                             command=p.command)),
                                   ev.body(ev.Observed(sid=cmd.sid, turn_id=turn_id or None,
                                                       command=f"&{cmd.command}", output=said))])
    await r.doorbell.ring(runner_id, cmd.sid, "observe")
    return Accepted()


class Admission:
    def __init__(self, deps: Deps) -> None:
        self.r = deps
        self._workspaces: dict[str, str] = {}
        self.workspaces = Workspaces(deps)
        self.attachments = Attachments(deps)

    # ------------------------------------------------------------------ sessions
    async def create(self, cmd: CreateCmd) -> Session:
        s = self.r.settings
        s.root.mkdir(parents=True, exist_ok=True)  # a stat when it exists: not worth a thread (workspaces.py)
        name = self.workspaces.name_of(cmd.workspace)
        model = cmd.model or s.model.default or ""
        if model and model not in self.r.models.names():
            raise Invalid(f"unknown model {model!r}; configured: {', '.join(sorted(self.r.models.names()))}")
        ws = await self.workspaces.admit(name, cmd.principal, cmd.create)
        sid = new_id("s")
        body = ev.body(ev.SessionCreated(sid=sid, workspace=str(ws), model=model or None, title=cmd.title,
                                         source="manual" if cmd.title else None))
        await self.r.store.fns.create(sid=sid, principal=cmd.principal, workspace=str(ws), model=model,
                                      title=cmd.title or "", body=body, owner=self.r.owner)
        view = await session_view.load(self.r.redis, sid, cmd.principal, self.r.settings.sandbox, self.r.settings.mcp)
        assert view is not None
        return view

    async def patch(self, cmd: PatchCmd) -> Session:
        if cmd.model is not None and cmd.model not in self.r.models.names():
            raise Invalid(f"unknown model {cmd.model!r}; configured: {', '.join(sorted(self.r.models.names()))}")
        fields = await _sharing(self.r.redis, cmd) if cmd.share or cmd.unshare else _patch_fields(cmd)
        res = await self.r.store.fns.patch(sid=cmd.sid, principal=cmd.principal, owner=self.r.owner, fields=fields)
        if cmd.unshare is not None:
            await self.r.redis.zrem(keys.shared_with(cmd.unshare), cmd.sid)
        if cmd.dont_ask is not None:
            # the holder re-reads its settings; turned on, it also answers a pending approval
            await self.r.doorbell.ring(res.get("runner"), cmd.sid, "approval")
        if cmd.spend_limit_set:  # an admin changed the session's daily budget: a paused session may go on
            await resume(self.r, cmd.sid, "patch")
        view = await session_view.load(self.r.redis, cmd.sid, cmd.principal, self.r.settings.sandbox, self.r.settings.mcp)
        if view is None:
            raise NotFound("no such session")
        return view

    # ------------------------------------------------------------------ messages
    async def send(self, cmd: SendCmd) -> SendResult:
        r = self.r
        if r.process.stopping:
            # A turn started here now would be cancelled by the shutdown at once: let the person's
            # retry reach a runner that stays (nothing was recorded).
            raise Unavailable("this turn-runner is shutting down; send again")
        ev.check_text(cmd.text)  # whatever is answered 202 must be recordable
        message_id = new_id("m")
        turn_id = new_id("t")
        sent = time.monotonic()
        ws = await self._workspace(cmd.sid)
        if ws is not None and self.workspaces.is_root(ws) and \
                await r.redis.hget(keys.session(cmd.sid), "principal") == cmd.principal:
            raise WorkspaceInvalid(ROOT_SESSION)
        agents = await instructions.agents_md_hash(ws)
        attached, wire = await self.attachments.named(cmd.sid, cmd.attachments)
        over = await spending.principal_over(r.store.fns, r.settings.limits, cmd.principal)
        res = await r.store.fns.send(
            sid=cmd.sid, principal=cmd.principal, message_id=message_id, text=cmd.text, mode=cmd.mode or "",
            client_id=cmd.client_id or "", runner=r.owner, lease_ms=r.settings.runner.lease_ms, turn_id=turn_id,
            owner=r.owner, models=" ".join(sorted(r.models.names())), agents_md=agents, attachments=wire,
            traceparent=cmd.traceparent or "", over=over, tx=cmd.tx or "")
        # The gateway sends the session's next request here, where its turn runs and its
        # transcript is kept (coxswain.rpc.Op.home): a replay names none.
        bus.set_home(res.get("runner"))
        if not res.get("replay"):
            if (started := res.get("resumed")) is not None:  # a pause of an earlier day lifted: the queue first
                await _resumed(r, cmd.sid, started, sent)
            if res.get("disposition") == "started":
                await _start_turn(r, cmd.sid, str(res["token"]), res.get("runner"), sent, {
                    "message_id": message_id, "text": cmd.text, "mode": cmd.mode or "send", "turn_id": turn_id,
                    "attachments": attached, "info": res.get("info"), "fresh": bool(res.get("fresh")),
                    "observed": res.get("observed")})
            elif res.get("disposition") == "steered":
                await r.doorbell.ring(res.get("runner"), cmd.sid, "steer")
        return SendResult(message_id=res["message_id"], disposition=res["disposition"],
                          position=res.get("position"))

    async def _workspace(self, sid: str) -> str | None:
        """A session's workspace (it never changes): asked of Redis once, then remembered."""
        ws = self._workspaces.get(sid)
        if ws is None:
            ws = await self.r.redis.hget(keys.session(sid), "workspace")
            if ws is not None:
                if len(self._workspaces) >= WORKSPACE_CACHE:
                    self._workspaces.pop(next(iter(self._workspaces)))
                self._workspaces[sid] = ws
        return ws

    async def lead(self, cmd: LeadCmd) -> LeadResult:
        """Save a Lead for the running turn; its runner applies it at the next safe boundary."""
        r = self.r
        Attachments.text_only(cmd.attachments)
        size = len(cmd.text.encode("utf-8"))
        if size > r.settings.lead.max_bytes:
            raise TooLarge(f"a Lead may hold {r.settings.lead.max_bytes} bytes of UTF-8; this one has {size}")
        res = await r.store.fns.lead(
            sid=cmd.sid, principal=cmd.principal, lead_id=new_id("l"), text=cmd.text, client_id=cmd.client_id or "",
            max_pending=r.settings.lead.max_pending, owner=r.owner, want_turn=cmd.turn_id or "",
            over=await spending.principal_over(r.store.fns, r.settings.limits, cmd.principal), tx=cmd.tx or "")
        bus.set_home(res.get("runner"))
        if not res.get("replay"):
            await r.doorbell.ring(res.get("runner"), cmd.sid, "lead", {"lead_id": res["lead_id"]})
        return LeadResult(lead_id=res["lead_id"], pending=int(res["pending"]), turn_id=res.get("turn_id"))

    async def stop(self, cmd: StopCmd) -> StopResult:
        r = self.r
        res = await r.store.fns.stop(sid=cmd.sid, principal=cmd.principal, owner=r.owner, tx=cmd.tx or "")
        turn_id = res.get("turn_id")
        if cmd.programs:  # "stop programs too": the runner that runs them stops them
            await stop_programs(r, cmd.sid, {"by": "stop"})
        bus.set_home(res.get("runner"))
        if res.get("stopped"):
            await r.doorbell.ring(res.get("runner"), cmd.sid, "stop")
            await self._settle(cmd.sid, turn_id)
        return StopResult(turn_id=turn_id, discarded=as_list(res.get("discarded")),
                          unapplied_leads=as_list(res.get("unapplied_leads")))

    async def _settle(self, sid: str, turn_id: str | None) -> None:
        """Wait (bounded) until the stopped turn has ended, so the reply describes a settled session."""
        base = keys.session(sid)
        loop = asyncio.get_running_loop()
        deadline = loop.time() + min(STOP_SETTLE_S, self.r.settings.runner.lease_ms / 1000 * 2 + 2)
        while loop.time() < deadline:
            cur, busy = await self.r.redis.hmget(base, ["turn_id", "busy"])
            if busy != "1" or (turn_id and cur != turn_id):
                return
            await asyncio.sleep(0.01)

    async def answer(self, cmd: ApprovalCmd) -> Accepted:
        r = self.r
        res = await r.store.fns.answer(
            sid=cmd.sid, principal=cmd.principal, aid=cmd.approval_id, decision=cmd.decision, scope=cmd.scope,
            message=cmd.message or "", owner=r.owner, actor="", why="", tx=cmd.tx or "",
        )
        bus.set_home(res.get("runner"))
        await r.doorbell.ring(res.get("runner"), cmd.sid, "approval")
        return Accepted()

    async def observe(self, cmd: ObserveCmd) -> Accepted:
        """The operator's ``!command``: run it now (in the sandbox, versioned like the model's
        commands), record it, fold it into the next tool result.

        The ``observed`` event and the entry the turn loop folds are written in one call, so the
        loop (which takes the entries atomically with the tool result it records) and a rebuild
        from the log agree on which result carried it. The files it changed are recorded in the
        same call, before it.
        """
        r = self.r
        base = keys.session(cmd.sid)
        ws, owner = await r.redis.hmget(base, ["workspace", "principal"])
        if ws is None or owner != cmd.principal:
            raise NotFound("no such session")
        if self.workspaces.is_root(ws):
            raise WorkspaceInvalid(ROOT_SESSION)
        if cmd.background:
            return await _background(r, cmd, ws)
        kept: list[ev._Event] = []
        requests: list[Request] = []
        async with self._command_token(cmd.sid, cmd.principal) as token:
            turn_id = await r.redis.hget(base, "turn_id") or None
            snap = await cmdversions.snapshot(r.clients, r.log, cmd.sid, ws, token) if token else None
            call_id = new_id("obs")
            exit_code, output = await _observed_run(r, cmd.sid, ws, cmd.command, requests)
            if token is not None:
                got = await cmdversions.changes(r.clients, r.log, cmd.sid, ws, token, snap, turn_id, call_id)
                kept = got.events
                if got.note:
                    output += f"\n{got.note}"
        turn_id, runner_id = await r.redis.hmget(base, ["turn_id", "runner"])
        turn_id = turn_id or None
        record = json.dumps({"command": cmd.command, "output": output}, ensure_ascii=False)
        await r.store.fns.emit(sid=cmd.sid, token="", owner=r.owner, ops=[("rpush", keys.OBSERVED, "", record)],
                               events=[*(ev.body(e) for e in egress.network_events({"sid": cmd.sid, "turn_id": turn_id},
                                                                            requests, call_id)),
                                       *(ev.body(e) for e in kept),
                                       ev.body(ev.Observed(sid=cmd.sid, turn_id=turn_id, command=cmd.command,
                                                           output=output, exit_code=exit_code))])
        await r.doorbell.ring(runner_id, cmd.sid, "observe")
        return Accepted()

    @contextlib.asynccontextmanager
    async def _command_token(self, sid: str, principal: str) -> AsyncIterator[int | None]:
        """The fencing token a person's command is versioned under: the session's own lease
        while idle (taken like a person's write, so no turn starts meanwhile), else the running
        turn's. None when neither can be had: the command then runs unversioned (logged)."""
        try:
            d = await self._begin_op(sid, principal, "observe")
        except Conflict:
            cur = await self.r.redis.get(keys.session(sid) + keys.LEASE)
            if cur is None or not cur.isdigit():
                self.r.log.warning("observe.unversioned", sid=sid, reason="no lease to version under")
                yield None
            else:
                yield int(cur)
            return
        try:
            yield int(d.token)
        finally:
            await self._end_op(d, "observe")

    async def program_stop(self, cmd: ProgramStopCmd) -> Accepted:
        """A person stops one program (``program.stopped`` by ``person``), where it runs."""
        await stop_programs(self.r, cmd.sid, {"by": "person", "program_id": cmd.program_id}, cmd.principal)
        return Accepted()

    # ------------------------------------------------------------------ a person's writes
    async def restore(self, cmd: RestoreCmd) -> WriteOutcome:
        return await self._person_write(cmd.sid, cmd.principal, "restore", cmd.version_id)

    async def undo(self, cmd: UndoCmd) -> WriteOutcome:
        return await self._person_write(cmd.sid, cmd.principal, "undo", None)

    async def _person_write(self, sid: str, principal: str, op: str, version_id: str | None) -> WriteOutcome:
        """Restore and undo are writes like any other: under the session's lease, versioned first."""
        r = self.r
        async with self._op_lease(sid, principal, op) as token:
            ws = await r.redis.hget(keys.session(sid), "workspace") or ""
            if version_id is not None:
                out = await r.clients.restore(RestoreRequest(sid=sid, workspace=ws, version_id=version_id,
                                                             token=int(token)))
            else:
                out = await r.clients.undo(UndoRequest(sid=sid, workspace=ws, token=int(token)))
            evs: list[str] = []
            for f in out.files:  # undoing a command puts back every file it changed
                evs += [ev.body(ev.VersionKept(sid=sid, path=f.kept.path, version_id=f.kept.version_id,
                                               store=f.kept.store)),
                        ev.body(ev.FileWritten(sid=sid, path=f.path, added=f.added, removed=f.removed, via=op,
                                               deleted=f.deleted))]
            await r.store.fns.emit(sid=sid, token=token, owner=r.owner, ops=[], events=evs)
            return out

    # ------------------------------------------------------------------ compaction
    async def compact(self, cmd: CompactCmd) -> CompactResult:
        """A person's compaction between turns: under the idle session's lease (409 ``busy``
        while a turn runs), the transcript rebuilt from the log is summarized by the session's
        model (or ``[model] compactor``) and a ``context.compacted`` event records it, so the
        next turn's rebuild applies it. Nothing is kept verbatim but the last turn's message and
        its Leads and approval messages; a failed summary drops the oldest tool outputs."""
        await drive.load_turns()  # the transcript and the model: a drive's machinery, off the loop
        async with self._op_lease(cmd.sid, cmd.principal, "compact") as token:
            return await _compact(self.r, cmd, token)

    @contextlib.asynccontextmanager
    async def _op_lease(self, sid: str, principal: str, op: str) -> AsyncIterator[str]:
        """Hold an idle session's lease for a person's operation (its fencing token); released
        (or the queue run) after. Conflict ``busy`` while a turn runs."""
        d = await self._begin_op(sid, principal, op)
        try:
            yield d.token
        except StoreDown as exc:
            raise Unavailable(f"redis is unavailable: {exc}") from exc
        finally:
            await self._end_op(d, op)

    async def _begin_op(self, sid: str, principal: str, op: str) -> Drive:
        r = self.r
        sent = time.monotonic()
        res = await r.store.fns.op_begin(sid=sid, principal=principal, runner=r.owner,
                                         lease_ms=r.settings.runner.lease_ms, op=op)
        d = Drive(sid=sid, token=str(res["token"]), acquired=sent)
        r.leases.hold(d)  # renewed by the lease keeper while the operation runs
        return d

    async def _end_op(self, d: Drive, op: str) -> None:
        r = self.r
        r.leases.release(d)
        d.disarm()
        try:
            await drive.finish_op(r, d)
        except LeaseLost as exc:
            # The lease lapsed (Redis gone or this runner stalled): a takeover releases the
            # session or runs what was queued meanwhile.
            r.log.warning("op.lease_lost", sid=d.sid, op=op, error=str(exc))


async def _compact(r: Deps, cmd: CompactCmd, token: str) -> CompactResult:
    """:meth:`Admission.compact` under the session's lease (``token``)."""
    from . import compaction, transcript  # loaded off the loop by drive.load_turns
    from .model import usage

    model = await r.redis.hget(keys.session(cmd.sid), "model") or "script"
    b = transcript.build(await r.events.read(cmd.sid))
    window = r.models.window(model) or compaction.DEFAULT_WINDOW
    name = r.settings.model.compactor or model
    used: list[dict[str, Any]] = []

    async def make_summary(text: str) -> str:
        try:
            s = await asyncio.wait_for(compaction.summarize(r, name, text, cmd.focus),
                                       compaction.COMPACT_TIMEOUT_S)
        except Exception as exc:  # noqa: BLE001 - a failed summary falls back
            r.log.warning("compaction.summary_failed", sid=cmd.sid, error=logged(exc))
            return ""
        used.append(s.usage)
        return s.text

    target = int(r.settings.limits.compact_at * window)
    out = await compaction.compact(b, keep_tokens=0, target=target, instructions="",
                                   make_summary=make_summary, render_chars=window * 2)
    if not out.changed:
        return CompactResult(compacted=False, before_tokens=out.before, after_tokens=out.after)
    event = ev.ContextCompacted(sid=cmd.sid, before_tokens=out.before, after_tokens=out.after,
                                summary=out.summary, through_seq=out.through_seq, dropped=out.dropped)
    evs = [*(ev.Usage(sid=cmd.sid, purpose="compaction", model=name, **u) for u in used), event]
    ops = [op for u in used for op in usage.totals_ops(u)]
    await r.store.fns.emit(sid=cmd.sid, token=token, owner=r.owner, ops=ops, events=[ev.body(e) for e in evs])
    for u in used:  # the gateways' metrics, and the principal's spend of the day (the session's is above)
        await r.clients.usage_seen({"model": name, "purpose": "compaction", **u})
        await spending.count_principal(r.store.fns, cmd.principal, float(u.get("cost") or 0))
    return CompactResult(compacted=True, before_tokens=out.before, after_tokens=out.after,
                         summary=out.summary, through_seq=out.through_seq, dropped=out.dropped)


async def _sharing(redis: Any, cmd: PatchCmd) -> list[tuple[str, str]]:
    """A share change's one field for ``cox_patch``; a new share's index entry goes first
    (another slot: an entry without a share is skipped when listed)."""
    if cmd.share is not None:
        await redis.zadd(keys.shared_with(cmd.share.principal), {cmd.sid: int(time.time() * 1000)})
        return [("share", json.dumps({"principal": cmd.share.principal, "role": cmd.share.role}))]
    return [("unshare", str(cmd.unshare))]


def _patch_fields(cmd: PatchCmd) -> list[tuple[str, str]]:
    """PATCH's changes as ``cox_patch``'s (name, value) pairs."""
    fields: list[tuple[str, str]] = []
    if cmd.title is not None:
        fields.append(("title", cmd.title))
    if cmd.auto_title is not None:
        fields.append(("auto_title", "1" if cmd.auto_title else "0"))
    if cmd.model is not None:
        fields.append(("model", cmd.model))
    if cmd.dont_ask is not None:
        fields.append(("dont_ask", "1" if cmd.dont_ask else "0"))
    if cmd.spend_limit_set:
        fields.append(("spend_limit", "" if cmd.spend_limit is None else repr(float(cmd.spend_limit))))
    return fields


# ------------------------------------------------------------------ daily budgets: a paused session goes on
async def resume(r: Deps, sid: str, by: str) -> bool:
    """Ask Redis whether a paused session goes on now (its budgets raised: by ``patch`` or
    ``reload``, see :mod:`cox_runner.spending`); when it does and it is idle, its first waiting
    message starts here (the rest follow in order). True when the pause was lifted."""
    lim = r.settings.limits
    principal, ws = await r.redis.hmget(keys.session(sid), ["principal", "workspace"])
    usd = ""
    if lim.principal_spend is not None and principal:
        usd = repr((await spending.principal_spend(r.store.fns, principal))[1])
    turn_id = new_id("t")
    sent = time.monotonic()
    res = await r.store.fns.budget_resume(
        sid=sid, owner=r.owner, session_spend="" if lim.session_spend is None else repr(lim.session_spend),
        principal_usd=usd, principal_spend="" if lim.principal_spend is None else repr(lim.principal_spend),
        runner=r.owner, lease_ms=r.settings.runner.lease_ms, turn_id=turn_id,
        agents_md=await instructions.agents_md_hash(ws), by=by)
    if isinstance(res.get("next"), dict):
        await _resumed(r, sid, dict(res), sent)
    r.log.info("budget.resume", sid=sid, by=by, resumed=res.get("resumed"), still=res.get("budget"))
    return bool(res.get("resumed"))


async def _resumed(r: Deps, sid: str, started: dict[str, Any], sent: float) -> None:
    """Run the waiting message a lifted pause started (``{next, token, turn_id, runner, fresh?}``)."""
    first = {**started["next"], "turn_id": started["turn_id"], "fresh": bool(started.get("fresh"))}
    await _start_turn(r, sid, str(started["token"]), started.get("runner"), sent, first)


async def resume_all(r: Deps, by: str) -> int:
    """After a reload of the configured budgets: every paused session (the buckets' paused
    indexes) that may go on now goes on. How many did."""
    async with r.redis.pipeline(transaction=False) as pipe:
        for b in range(keys.buckets()):
            pipe.zrange(keys.paused(b), 0, -1)
        found = await pipe.execute()
    n = 0
    for sid in sorted({s for got in found for s in got or []}):
        try:
            n += await resume(r, sid, by)
        except Exception as exc:  # noqa: BLE001 - one session's failure does not stop the others
            r.log.warning("budget.resume_failed", sid=sid, error=logged(exc))
    return n
