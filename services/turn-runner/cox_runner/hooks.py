"""Hooks (docs/api.md, "Hooks"; docs/design.md, "Hooks in the turn loop"): the person's own checks,
in the Claude Code ``hooks.json`` shape, run by the turn loop at five points.

- ``PreToolUse``: after guard (a call guard refuses stays refused, and no hook runs for it),
  before the judge. ``allow`` answers what would have gone to the judge or to the person, except a
  security confirm (always the person's); ``deny`` refuses the call with the hook's reason (the
  model sees it as the result); ``ask`` opens an approval. Several hooks: deny > ask > allow.
- ``PostToolUse``: after the call's result; a ``block`` reason or ``additionalContext`` reaches the
  model as a note right after the result.
- ``UserPromptSubmit``: when a turn starts on a message; ``block`` ends the turn ``canceled`` with
  the reason before any model request; ``additionalContext`` (or plain stdout) is a note.
- ``Stop``: when the model would end the turn; ``block`` saves its reason as a Lead (the same
  Lead a person saves with ``POST /v1/sessions/{sid}/lead``), so the turn goes on with it as a
  user message. ``stop_hook_active`` is true once a Stop hook continued the turn, and at most
  ``[hooks] max_stop_continues`` continues happen per turn.
- ``PreCompact``: before the turn's transcript is compacted (``trigger: "auto"``); it is told, it
  cannot prevent it.

Every hook runs inside the command sandbox (the workspace read-write, the store folder and so
its ``hooks.json`` read-only, no network) with the payload on stdin, killed past its timeout.
Fail closed: a hook that times out, crashes, exits non-zero other than 2, or prints something that
is not an answer denies (``PreToolUse``) or blocks (``UserPromptSubmit``); for the other events
the failure is recorded (and, after a tool, told to the model). Each hook that ran is one
``hook.decision`` event.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from coxswain import events as ev
from coxswain import hookspec, safefs
from coxswain.errors import CoxError
from coxswain.hookspec import HookCommand, HooksSpec
from coxswain.models import CallSpec, GuardResult
from coxswain.proc import dies_with_me

from .deps import Deps
from .errors import SandboxUnavailable
from .gate import Gate, GateOutcome
from .recorder import Recorder
from .turn import Turn
from .workspace import limits, tools
from .workspace.sandbox import Sandbox

MAX_OUTPUT = 64 * 1024
"""Bytes of a hook's stdout (and of its stderr) kept; the rest is read and dropped."""
REASON_CHARS = 2000
HOOKS_FILE = "hooks.json"
PRE_RANK = {"deny": 3, "ask": 2, "allow": 1, "none": 0}


@dataclass
class Answer:
    """One hook's answer, as parsed (:func:`parse_answer`)."""

    decision: str
    """allow | deny | ask (PreToolUse); block | none; error (it failed)."""
    reason: str = ""
    context: str = ""
    """``additionalContext`` (or a UserPromptSubmit hook's plain stdout): a note for the model."""
    failed: bool = False


@dataclass
class Raw:
    code: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    error: str = ""


def _clip(text: str) -> str:
    text = text.strip()
    return text if len(text) <= REASON_CHARS else text[:REASON_CHARS] + "…"


def failed(reason: str) -> Answer:
    return Answer("error", reason, failed=True)


def parse_answer(event: str, raw: Raw, timeout: float) -> Answer:
    """A hook's answer from its exit code and output (the Claude Code rules, failing closed).

    Exit 2: block (``deny`` for PreToolUse) with stderr as the reason. Another non-zero exit, a
    timeout or a spawn failure: failed. Exit 0 with empty stdout: no decision. Exit 0 with a JSON
    object: ``hookSpecificOutput.permissionDecision`` (allow|deny|ask) and
    ``permissionDecisionReason``, else the legacy ``decision`` (approve|block) and ``reason``;
    ``continue: false`` with ``stopReason`` blocks too. Anything else printed: failed (except a
    UserPromptSubmit hook's plain text, which is context for the model, as in Claude Code).
    """
    if raw.error:
        return failed(raw.error)
    if raw.timed_out:
        return failed(f"the hook timed out after {timeout:g}s and was killed")
    err = _clip(raw.stderr.decode("utf-8", errors="replace"))
    if raw.code == 2:
        return Answer("deny" if event == "PreToolUse" else "block", err or "the hook exited with code 2")
    if raw.code != 0:
        return failed(f"the hook exited with code {raw.code}" + (f": {err}" if err else ""))
    text = raw.stdout.decode("utf-8", errors="replace").strip()
    if not text:
        return Answer("none")
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if not isinstance(obj, dict):
        if event == "UserPromptSubmit" and obj is None:
            return Answer("none", context=_clip(text))
        return failed(f"the hook's answer is not a JSON object: {_clip(text)[:200]!r}")
    return _from_json(event, obj)


def _from_json(event: str, obj: dict[str, Any]) -> Answer:
    hso = obj.get("hookSpecificOutput")
    if hso is not None and not isinstance(hso, dict):
        return failed("the hook's hookSpecificOutput is not an object")
    hso = hso or {}
    context = hso.get("additionalContext")
    if context is not None and not isinstance(context, str):
        return failed("the hook's additionalContext is not a string")
    context = _clip(context or "")
    reason = obj.get("reason")
    if reason is not None and not isinstance(reason, str):
        return failed("the hook's reason is not a string")
    reason = _clip(reason or "")
    if obj.get("continue") is False:
        why = obj.get("stopReason")
        why = _clip(why) if isinstance(why, str) and why.strip() else reason or "the hook said not to continue"
        return Answer("deny" if event == "PreToolUse" else "block", why, context)
    decision = obj.get("decision")
    if event == "PreToolUse":
        pd = hso.get("permissionDecision")
        if pd is not None:
            if pd not in ("allow", "deny", "ask"):
                return failed(f"the hook's permissionDecision {pd!r} is not allow, deny or ask")
            why = hso.get("permissionDecisionReason")
            return Answer(pd, _clip(why) if isinstance(why, str) else reason, context)
        if decision is None:
            return Answer("none", reason, context)
        legacy = {"approve": "allow", "allow": "allow", "block": "deny", "deny": "deny", "ask": "ask"}
        if decision not in legacy:
            return failed(f"the hook's decision {decision!r} is not approve or block")
        return Answer(legacy[decision], reason, context)
    if decision is None:
        return Answer("none", reason, context)
    if decision != "block":
        return failed(f"the hook's decision {decision!r} is not \"block\"")
    if event == "Stop" and not reason:
        return failed("a Stop hook that blocks must give a reason (it is what the model is told)")
    return Answer("block", reason or "blocked by a hook", context)


async def run_hook(deps: Deps, workspace: Path, command: str, payload: bytes, timeout: float) -> Raw:
    """Run one hook command in the command sandbox with ``payload`` on stdin."""
    sandbox = deps.sandbox
    try:
        await sandbox.prepare(workspace)
        argv = sandbox.argv(workspace, command, False, offline=True)  # a hook never has the network
    except SandboxUnavailable as exc:
        return Raw(None, b"", b"", error=f"the command sandbox is unavailable: {exc}")
    try:
        return await _spawn(sandbox, workspace, argv, payload, timeout)
    finally:
        await sandbox.settle(workspace)  # nothing the hook made stays setuid/setgid on the host


async def _spawn(sandbox: Sandbox, workspace: Path, argv: list[str], payload: bytes, timeout: float) -> Raw:
    env = tools.command_env(workspace)
    env.update(CLAUDE_PROJECT_DIR=str(workspace), COX_PROJECT_DIR=str(workspace))
    try:
        box = await asyncio.to_thread(limits.of(sandbox).box, "hook")
    except OSError as exc:
        return Raw(None, b"", b"", error=f"the hook's resource limits could not be set up: {exc.strerror}")
    try:
        raw = await _run_boxed(box, box.argv(argv), workspace, env, payload, timeout, sandbox.needs_preexec)
    finally:
        await box.close()
    hit = box.limit or box.exceeded() or box.note_exit(raw.code, raw.stderr)
    if hit is not None:
        return Raw(raw.code, raw.stdout, raw.stderr, error=limits.killed_note(hit, sandbox.cfg, "hook").strip("[]"))
    return raw


async def _run_boxed(box: limits.Box, argv: list[str], workspace: Path, env: dict[str, str], payload: bytes,
                     timeout: float, preexec: bool) -> Raw:
    try:
        # the standard library's spawn (vfork), as for a command: uvloop's forks the whole runner
        proc = await tools.spawn(argv, cwd=str(workspace), env=env, stdin=True, stderr_apart=True,
                                 preexec_fn=dies_with_me() if preexec else None)
    except OSError as exc:
        return Raw(None, b"", b"", error=f"the hook could not start: {exc}")
    try:
        return await _watch(proc, box, payload, timeout)
    finally:
        proc.close()


async def _watch(proc: tools.Child, box: limits.Box, payload: bytes, timeout: float) -> Raw:

    async def feed() -> None:
        assert proc.stdin is not None
        with contextlib.suppress(OSError, ConnectionError):
            proc.stdin.write(payload)
            await proc.stdin.drain()
        with contextlib.suppress(OSError, ConnectionError):
            proc.stdin.close()

    async def pump(stream: asyncio.StreamReader | None, into: bytearray) -> None:
        assert stream is not None
        while block := await stream.read(65536):
            if len(into) < MAX_OUTPUT:
                into += block[:MAX_OUTPUT - len(into)]

    out, err = bytearray(), bytearray()
    work: asyncio.Future[Any] = asyncio.ensure_future(asyncio.gather(feed(), pump(proc.stdout, out), pump(proc.stderr, err), proc.wait()))
    watcher: asyncio.Future[Any] = asyncio.create_task(box.watch())
    try:
        done, _ = await asyncio.wait({work, watcher}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        if work not in done:
            await asyncio.to_thread(box.kill)
            await _kill(proc)
            work.cancel()
            with contextlib.suppress(BaseException):
                await work
            return Raw(proc.returncode, bytes(out), bytes(err), timed_out=not done)
    except asyncio.CancelledError:
        await asyncio.shield(asyncio.to_thread(box.kill))
        await _kill(proc)
        work.cancel()
        raise
    finally:
        watcher.cancel()
    return Raw(proc.returncode, bytes(out), bytes(err))


async def _kill(proc: tools.Child) -> None:
    if proc.returncode is not None:
        return
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, signal.SIGKILL)
    with contextlib.suppress(BaseException):
        await asyncio.wait_for(proc.wait(), 5)


@dataclass
class Found:
    """A hook to run and where it came from."""

    matcher: str
    hook: HookCommand
    source: str


class Hooks:
    """A turn's hooks: loaded once at its start, run at the loop's five points."""

    def __init__(self, deps: Deps, turn: Turn, rec: Recorder, log: Any) -> None:
        self.deps = deps
        self.turn = turn
        self.rec = rec
        self.log = log
        self.cfg = deps.settings.hooks
        self.sources: list[tuple[str, HooksSpec]] = []
        self.stop_continues = 0

    def nothing_to_load(self) -> bool:
        """True when :meth:`load` would find no hook, known from the config and two ``lstat`` calls
        (no thread, no read): hooks off, or none in the config and the workspace's store folder a
        real folder without a hooks file in it (or no store folder at all). Anything else (a
        link, a file there, an error) is for :meth:`load` to read and judge."""
        cfg = self.cfg
        if not cfg.enabled:
            return True
        if cfg.inline or cfg.file is not None:
            return False
        if not cfg.workspace:
            return True
        store = os.path.join(self.turn.workspace, self.deps.settings.store_dir)
        try:
            st = os.lstat(store)
        except FileNotFoundError:
            return True
        except OSError:
            return False
        if not stat.S_ISDIR(st.st_mode):
            return False
        try:
            os.lstat(os.path.join(store, HOOKS_FILE))
        except FileNotFoundError:
            return True
        except OSError:
            return False
        return False

    def load(self) -> None:
        """Read the config's hooks and the workspace's ``<store_dir>/hooks.json`` (no link followed).

        Raises :class:`~coxswain.hookspec.BadHooks`: a hooks file that cannot be read is not
        skipped (the person's checks would silently not run), the turn ends ``error`` saying why.
        """
        cfg = self.cfg
        self.sources = []
        if not cfg.enabled:
            return
        config = HooksSpec(**cfg.inline)
        if cfg.file is not None:
            try:
                raw = cfg.file.read_bytes()
            except OSError as exc:
                raise hookspec.BadHooks(f"[hooks] file {str(cfg.file)!r} cannot be read: {exc}") from exc
            config = config.merged(hookspec.parse(raw, f"[hooks] file {str(cfg.file)!r}"))
        if not config.empty():
            self.sources.append(("config", config))
        if cfg.workspace:
            rel = f"{self.deps.settings.store_dir}/{HOOKS_FILE}"
            try:
                data = safefs.read(self.turn.workspace, rel, hookspec.MAX_FILE_BYTES + 1)
            except (CoxError, OSError) as exc:
                raise hookspec.BadHooks(f"the workspace's {rel} cannot be read: {exc}") from exc
            if data is not None:
                spec = hookspec.parse(data, f"the workspace's {rel}")
                if not spec.empty():
                    self.sources.append(("workspace", spec))

    def has(self, event: str, tool: str | None = None) -> bool:
        return bool(self._found(event, tool))

    def _found(self, event: str, tool: str | None) -> list[Found]:
        return [Found(m.matcher, h, source) for source, spec in self.sources for m in spec.of(event)
                if m.matches(tool if event in hookspec.TOOL_EVENTS else None) for h in m.hooks]

    def _payload(self, event: str, extra: dict[str, Any]) -> bytes:
        t = self.turn
        base = {"session_id": t.sid, "turn_id": t.turn_id, "cwd": str(t.workspace), "hook_event_name": event,
                "permission_mode": "default"}
        return json.dumps({**base, **extra}, ensure_ascii=False, default=str).encode()

    async def run(self, event: str, extra: dict[str, Any], tool: str | None = None,
                  call_id: str | None = None) -> list[Answer]:
        """Run every hook of ``event`` that matches ``tool`` (concurrently, as Claude Code does);
        each answer is a ``hook.decision`` event."""
        found = self._found(event, tool)
        if not found:
            return []
        payload = self._payload(event, extra)

        async def one(f: Found) -> tuple[Answer, int]:
            timeout = f.hook.timeout or self.cfg.timeout_s
            t0 = time.monotonic()
            raw = await run_hook(self.deps, self.turn.workspace, f.hook.command, payload, timeout)
            return parse_answer(event, raw, timeout), int((time.monotonic() - t0) * 1000)

        results = await asyncio.gather(*(one(f) for f in found))
        answers: list[Answer] = []
        evs: list[ev._Event] = []
        for f, (a, ms) in zip(found, results, strict=True):
            if a.failed and event == "PreToolUse":
                a = Answer("deny", f"{a.reason} (a PreToolUse hook that fails denies the call)", failed=True)
            elif a.failed and event == "UserPromptSubmit":
                a = Answer("block", f"{a.reason} (a UserPromptSubmit hook that fails blocks the message)",
                           failed=True)
            answers.append(a)
            self.log.info("hook.ran", hook_event=event, command=f.hook.command[:200], decision=a.decision,
                          failed=a.failed, duration_ms=ms)
            evs.append(ev.HookDecision(**self.rec.e(), hook_event=event, matcher=f.matcher,
                                       command=f.hook.command, decision=a.decision,
                                       reason=a.reason, duration_ms=ms, failed=a.failed, source=f.source,
                                       tool_call_id=call_id, tool=tool))
        await self.rec.emit(*evs)
        return answers

    # ------------------------------------------------------------------ the five points
    async def pre_tool(self, call_id: str, tool: str, args: dict[str, Any]) -> Answer | None:
        """The PreToolUse verdict on a call (None: no hook matched or none decided)."""
        answers = await self.run("PreToolUse", {"tool_name": tool, "tool_input": args, "tool_use_id": call_id},
                                 tool, call_id)
        decided = [a for a in answers if a.decision in PRE_RANK and a.decision != "none"]
        if not decided:
            return None
        top = max(decided, key=lambda a: PRE_RANK[a.decision])
        reasons = [a.reason for a in decided if a.decision == top.decision and a.reason]
        return Answer(top.decision, "; ".join(reasons), failed=top.failed)

    async def post_tool(self, call_id: str, tool: str, args: dict[str, Any], output: str, ok: bool) -> str | None:
        """What PostToolUse hooks tell the model about a call's result (a note), if anything."""
        answers = await self.run("PostToolUse", {"tool_name": tool, "tool_input": args, "tool_use_id": call_id,
                                                 "tool_response": {"output": output, "ok": ok}}, tool, call_id)
        lines: list[str] = []
        for a in answers:
            if a.decision == "block":
                lines.append(f"A PostToolUse hook flagged the result of {tool} ({call_id}): {a.reason}")
            elif a.failed:
                lines.append(f"A PostToolUse hook on {tool} ({call_id}) failed: {a.reason}")
            if a.context:
                lines.append(a.context)
        return "\n".join(lines) or None

    async def prompt_submit(self, prompt: str) -> tuple[str | None, str | None]:
        """(why the message is blocked, or None; context for the model, or None)."""
        answers = await self.run("UserPromptSubmit", {"prompt": prompt})
        blocked = [a.reason for a in answers if a.decision == "block"]
        context = "\n".join(a.context for a in answers if a.context)
        return ("; ".join(blocked) if blocked else None), (context or None)

    async def stop(self, last_text: str) -> str | None:
        """What a Stop hook wants the model to do before the turn ends (a Lead), or None."""
        if self.stop_continues >= self.cfg.max_stop_continues or not self.has("Stop"):
            return None
        answers = await self.run("Stop", {"stop_hook_active": self.stop_continues > 0,
                                          "last_assistant_message": last_text})
        reasons = [a.reason for a in answers if a.decision == "block"]
        if not reasons:
            return None
        self.stop_continues += 1
        return "\n".join(reasons)

    async def pre_compact(self, trigger: str) -> None:
        await self.run("PreCompact", {"trigger": trigger, "custom_instructions": ""})


async def gate_pre_tool(hooks: Hooks, gate: Gate, call: CallSpec, g: GuardResult) -> GateOutcome | None:
    """The PreToolUse step of :meth:`cox_runner.gate.Gate.decide`, after guard, before the judge.

    None: no hook decided, the gate goes on as without hooks. A call guard refused never gets
    here. ``allow`` does not answer a security confirm (the gate goes on to the person).
    """
    if not hooks.has("PreToolUse", call.name):
        return None
    a = await hooks.pre_tool(call.call_id, call.name, call.args)
    if a is None:
        return None
    if a.decision == "deny":
        why = f"denied by a PreToolUse hook: {a.reason or 'no reason given'}"
        await gate._decided(call, "refuse", "hook", why, g)
        return GateOutcome(False, why, "hook", g.path, guard=g)
    if a.decision == "ask":
        why = f"a PreToolUse hook asks the person: {a.reason}" if a.reason else "a PreToolUse hook asks the person"
        return await gate.ask_person(call, g, None, reason=why)
    if g.verdict == "allow":
        return GateOutcome(True, g.reason, g.actor, g.path, guard=g)
    if g.security:
        return None
    why = f"allowed by a PreToolUse hook: {a.reason}" if a.reason else "allowed by a PreToolUse hook"
    await gate._decided(call, "allow", "hook", why, g)
    return GateOutcome(True, why, "hook", g.path, guard=g)
