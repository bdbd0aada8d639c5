"""Runs: sessions whose turns the program drives, and a workspace's check (docs/api.md, "Runs").

- **A run** (``POST /v1/runs``) is made in one Redis call (``cox_run``): the session as
  ``cox_create`` makes one, marked a run (``run.start``), its first turn begun on ``text``. From
  then on ``cox_turn_end`` goes on with it: a turn that ends without finishing queues the run's
  ``continue`` in the same call, so a takeover never loses or doubles one (the redis library,
  "runs"). With ``template`` the run works in a copy: the template (a workspace the caller may
  use) is copied beside it into ``<template>-run-<n>``, claimed for the caller first, by the
  versions service's descriptor walk (``coxswain.fdcopy``, as a fork copies; the store folder
  left out).
- **A check** (``POST /v1/sessions/{sid}/check``) is the owner's own command, run without
  approval in the sandbox a turn's commands get, between turns (under the idle session's lease,
  like a restore: 409 ``busy`` while a turn runs), versioned like a command and recorded as
  ``check {command, exit_code}``.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from coxswain import events as ev
from coxswain import keys, session_view
from coxswain.errors import (
    Conflict,
    Invalid,
    NotAccepting,
    NotFound,
    Unavailable,
    WorkspaceInvalid,
    WorkspaceNested,
)
from coxswain.ids import new_id
from coxswain.models import CheckCmd, CheckResult, ForkFilesRequest, RunCmd, RunCreated, RunInfo

from . import cmdversions, drive, instructions
from .admission import ROOT_SESSION, Admission
from .errors import SandboxUnavailable
from .leases import Drive
from .workspace import egress, tools
from .workspace.egress import Request

MAX_NAME_TRIES = 100
NAME_MAX = 255


def next_free(parent: Path, base: str) -> int:
    """The ``n`` after the highest ``<base>-run-<n>`` beside the template (one listing, so a
    sweep of thousands does not try every taken name in turn)."""
    pat = re.compile(re.escape(base) + r"-run-(\d+)")
    try:
        names = os.listdir(parent)
    except FileNotFoundError:
        return 1
    return max((int(m[1]) for n in names if (m := pat.fullmatch(n))), default=0) + 1


class Runs:
    def __init__(self, admission: Admission, reload: Callable[[str], Awaitable[bool]] | None = None) -> None:
        self.a = admission
        self.r = admission.r
        self.reload = reload
        """Loads an archived session back (the archiver's): a replayed client_id may name one."""

    # ------------------------------------------------------------------ a run
    async def create(self, cmd: RunCmd) -> RunCreated:
        r = self.r
        s = r.settings
        if r.process.stopping:
            raise Unavailable("this turn-runner is shutting down; send again")
        ev.check_text(cmd.text)
        if (cmd.workspace is None) == (cmd.template is None):
            raise Invalid("a run needs exactly one of workspace and template (a workspace is required, as for "
                          "POST /v1/sessions)")
        model = cmd.model or s.model.default or ""
        if model and model not in r.models.names():
            raise Invalid(f"unknown model {model!r}; configured: {', '.join(sorted(r.models.names()))}")
        if not model:
            raise NotAccepting("no model is chosen for this run and [model] default is empty")
        s.root.mkdir(parents=True, exist_ok=True)  # a stat when it exists: not worth a thread (workspaces.py)
        sid = new_id("s")
        if cmd.client_id is not None:
            # The sid is reserved for the client_id first (SET NX): every request with it makes
            # the session under that one sid, and cox_run refuses a sid that exists, so of two
            # concurrent requests (or a request and its retry after a crash) one makes the run.
            k = keys.run_client_id(cmd.principal, cmd.client_id)
            had = await r.redis.set(k, sid, nx=True, px=keys.RUN_CLIENT_ID_KEEP_MS, get=True)
            if had is not None:
                sid = str(had)
                if (made := await self._made(sid, cmd.principal)) is not None:
                    return made
        spaces = self.a.workspaces
        copied: tuple[Path, str, bool] | None = None
        if cmd.template is not None:
            if cmd.create is True:
                raise Invalid("create applies to workspace; a template's copy is always a new folder")
            copied = await self._copy(cmd.template, cmd.principal, sid)
            ws = copied[0]
        else:
            assert cmd.workspace is not None
            ws = await spaces.admit(spaces.name_of(cmd.workspace), cmd.principal,
                                    True if cmd.create is None else cmd.create)
        message_id, turn_id = new_id("m"), new_id("t")
        created = ev.body(ev.SessionCreated(sid=sid, workspace=str(ws), model=model))
        start = ev.body(ev.RunStart(sid=sid, confirm=cmd.confirm, unattended=cmd.unattended, max_turns=cmd.max_turns))
        run = json.dumps({"confirm": cmd.confirm, "unattended": cmd.unattended, "max_turns": cmd.max_turns,
                          **({"traceparent": cmd.traceparent} if cmd.traceparent else {})})
        sent = time.monotonic()
        try:
            res = await r.store.fns.run(
                sid=sid, principal=cmd.principal, workspace=str(ws), model=model, title="", body=created,
                owner=r.owner, message_id=message_id, text=cmd.text, runner=r.owner,
                lease_ms=s.runner.lease_ms, turn_id=turn_id, agents_md=await instructions.agents_md_hash(str(ws)),
                run=run, start_body=start,
            )
        except BaseException as exc:
            if copied is not None:  # a copy nobody runs in is not left behind
                await asyncio.to_thread(shutil.rmtree, copied[0], True)
                if copied[2]:
                    await spaces.release(copied[1], cmd.principal)
            if cmd.client_id is not None and isinstance(exc, Conflict):
                # a concurrent request with this client_id made the session first: its run
                if (made := await self._made(sid, cmd.principal)) is not None:
                    return made
            raise
        r.log.info("run.started", sid=sid, workspace=str(ws), confirm=cmd.confirm, unattended=cmd.unattended,
                   max_turns=cmd.max_turns, template=cmd.template)
        drive.start_drive(r, Drive(sid=sid, token=str(res["token"]), acquired=sent, first={
            "message_id": message_id, "text": cmd.text, "mode": "send", "turn_id": turn_id, "info": res.get("info"),
            "fresh": True,  # the session was made by the call that began the turn (loop.TurnLoop._load)
        }))
        return RunCreated(session_id=sid, workspace=str(ws), run=RunInfo(
            state="running", confirm=cmd.confirm, unattended=cmd.unattended, max_turns=cmd.max_turns, turns=1))

    async def _made(self, sid: str, principal: str) -> RunCreated | None:
        """The run already made under ``sid`` (a replay of its ``client_id``), as it is now; None
        while its session does not exist (the request that reserved the sid has not made it yet,
        or died before it did: this request makes it)."""
        view = await session_view.load(self.r.redis, sid, principal, self.r.settings.sandbox, self.r.settings.mcp)
        if view is None and self.reload is not None and await self.reload(sid):  # archived since
            view = await session_view.load(self.r.redis, sid, principal, self.r.settings.sandbox, self.r.settings.mcp)
        if view is None or view.run is None:
            return None
        self.r.log.info("run.replayed", sid=sid)
        return RunCreated(session_id=sid, workspace=view.workspace, run=view.run, replay=True)

    async def _copy(self, template: str, principal: str, sid: str) -> tuple[Path, str, bool]:
        """Copy the template into ``<template>-run-<n>`` beside it (n the next free), claimed for
        ``principal`` first: (its folder, its workspace name, whether this call made the claim)."""
        r = self.r
        spaces = self.a.workspaces
        src = await spaces.admit(spaces.name_of(template), principal, create=False)  # 404: not yours, or missing
        root = Path(await asyncio.to_thread(os.path.realpath, r.settings.root))
        base = src.name
        if len(f"{base}-run-{MAX_NAME_TRIES}".encode()) > NAME_MAX:
            raise Invalid("the template's name is too long to name its copies after it")
        first = await asyncio.to_thread(next_free, src.parent, base)
        for n in range(first, first + MAX_NAME_TRIES):
            target = src.parent / f"{base}-run-{n}"
            if await asyncio.to_thread(os.path.lexists, target):
                continue
            wname = os.path.relpath(target, root).replace(os.sep, "/")
            try:
                claim = await r.store.fns.ws_claim(name=wname, owner=principal)
            except WorkspaceNested:
                continue
            if claim["owner"] != principal:
                continue
            made = bool(claim["created"])
            try:
                await r.clients.fork_files(ForkFilesRequest(sid=sid, workspace=str(src), target=str(target)))
            except Conflict:  # another run took this name meanwhile (its folder exists): the next
                if made:
                    await spaces.release(wname, principal)
                continue
            except BaseException:
                if made:
                    await spaces.release(wname, principal)
                raise
            return Path(os.path.realpath(target)), wname, made
        raise Conflict(f"no free folder name like {base}-run-N beside the template")

    # ------------------------------------------------------------------ a check
    async def check(self, cmd: CheckCmd) -> CheckResult:
        """Run the owner's command in the sandbox in the session's workspace, between turns."""
        r = self.r
        base = keys.session(cmd.sid)
        ws, owner = await r.redis.hmget(base, ["workspace", "principal"])
        if ws is None or owner != cmd.principal:
            raise NotFound("no such session")
        if self.a.workspaces.is_root(ws):
            raise WorkspaceInvalid(ROOT_SESSION)
        requests: list[Request] = []
        async with self.a._op_lease(cmd.sid, cmd.principal, "check") as token:
            snap = await cmdversions.snapshot(r.clients, r.log, cmd.sid, ws, int(token))
            call_id = new_id("chk")
            exit_code: int | None = None
            try:
                res = await tools.run_command(Path(ws), cmd.command, cmd.timeout_s, r.settings.runner.output_limit,
                                              r.sandbox, requests=requests)
            except SandboxUnavailable as exc:
                output = f"Refused: the command sandbox is unavailable ({exc.detail}); the command was not run."
            else:
                exit_code = None if res.timed_out else res.exit_code
                output = res.output + (f"\n[timed out after {cmd.timeout_s:g}s]" if res.timed_out else "")
            got = await cmdversions.changes(r.clients, r.log, cmd.sid, ws, int(token), snap, None, call_id)
            if got.note:
                output += f"\n{got.note}"
            evs = [*(ev.body(e) for e in egress.network_events({"sid": cmd.sid, "turn_id": None}, requests, call_id)),
                   *(ev.body(e) for e in got.events),
                   ev.body(ev.Check(sid=cmd.sid, command=cmd.command, exit_code=exit_code))]
            await r.store.fns.emit(sid=cmd.sid, token=token, owner=r.owner, ops=[], events=evs)
        r.log.info("check.done", sid=cmd.sid, exit_code=exit_code)
        return CheckResult(exit_code=exit_code, output=output)
