"""The approval gate of one tool call: guard, then the judge, then the person.

docs/design.md, "Policy": guard decides allow/ask/refuse (pin, denylist, protected paths, credential
content, taint, the writes/commands settings, standing approvals). An ``ask`` that is not a
security confirm is answered by the don't-ask switch when it is on, else by the judge when guard
routes it there; what the judge refuses or fails on goes to the person with the judge's answer.
A security confirm always goes to the person. Every decision is a ``policy.decision`` event; a
write's decisions carry guard's preview of what it would change (the Changes view reads them).

Taint needs two lists from the turn: fragments of tool output (:class:`Taint`) and the person's
own words (:func:`person_words`), which are not taint even when output held them.

:class:`Gate` owns the turn's approval state (the approval open now, what "always this turn"
allowed) and takes what it needs (the recorder, the budget's waiting time, the plan for the
judge) instead of the turn loop.
"""

from __future__ import annotations

import asyncio
import json
import re
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pydantic_ai.messages import ModelRequest, UserPromptPart

from coxswain import approval_links, keys, readpolicy
from coxswain import attachments as att
from coxswain import events as ev
from coxswain.errors import CoxError, Resolved
from coxswain.ids import new_id
from coxswain.models import (
    ATTACHMENT_CALL,
    STANDING_NETWORK,
    CallSpec,
    GuardRequest,
    GuardResult,
    JudgeRequest,
    JudgeResult,
    Plan,
)

from . import infra
from .budget import Budget
from .deps import Deps
from .errors import StopRequested
from .model import usage
from .model.script_model import SCRIPT_RE
from .recorder import Recorder
from .turn import Turn
from .workspace import tools

APPROVAL_POLL_S = 1.0
SCREENED_CHARS = 1_000_000
"""How much of an attachment's text guard's credential check sees (a request fits a NATS message)."""
UNATTENDED = "unattended"
"""The reason an unattended run's declines are recorded with (``approval.resolved``, actor ``run``)."""


def running_run(info: dict[str, Any]) -> dict[str, Any] | None:
    """The session's run (the hash's ``run``) while it drives the session, else None."""
    raw = info.get("run")
    if not raw:
        return None
    run = json.loads(raw)
    return run if isinstance(run, dict) and run.get("state") == "running" else None
MAX_TRUSTED_CHARS = 200_000
COMMAND_LIKE = frozenset({"run_command", "start_program", "write_program"})
"""Calls whose arguments are checked for taint (built from tool output) like a command's."""


@dataclass
class GateOutcome:
    allowed: bool
    reason: str
    actor: str
    path: str | None = None
    message: str | None = None
    """A person's message given with the answer: delivered as a user message after the result."""
    guard: GuardResult | None = None


def standing_key(name: str, args: dict[str, Any], path: str | None) -> str:
    """What "always" remembers: a command's program (and subcommand), a written path, or, for a
    command that asked for the network, the network."""
    if name in ("run_command", "start_program") and args.get("network") is True:
        return STANDING_NETWORK
    if name == "write_program":  # "always": input to this program, for the session
        return f"input:{args.get('program_id')}"
    if name in ("run_command", "start_program"):
        try:
            words = shlex.split(str(args.get("command", "")))
        except ValueError:
            words = str(args.get("command", "")).split()
        if not words:
            return ""
        if len(words) > 1 and not words[1].startswith("-") and "/" not in words[1]:
            return f"{words[0]} {words[1]}"
        return words[0]
    if name == "write_file" and path is not None:
        return f"write:{path}"
    if "__" in name:  # an MCP server's tool: "always" allows that tool for the session
        return f"mcp:{name}"
    return ""


class Taint:
    """Fragments of what tools returned this turn: a command containing one was built from tool
    output (guard's taint rule)."""

    def __init__(self) -> None:
        self._frags: list[str] = []

    def add(self, text: str) -> None:
        for frag in re.findall(r"[^\s'\"`]{8,}", text)[:500]:
            self._frags.append(frag[:200])
        del self._frags[:-2000]

    def fragments(self) -> list[str]:
        return list(dict.fromkeys(self._frags))


def person_words(turn: Turn, rec: Recorder) -> list[str]:
    """What the person wrote in this session (newest first, bounded), ``script`` blocks
    removed: a script stands for the model's answers, not for the person's words."""
    texts: list[str] = [turn.text, *(text for text, _ in rec.pending_user)]
    for msg in reversed(rec.history.messages):
        if isinstance(msg, ModelRequest):
            texts.extend(p.content for p in msg.parts
                         if isinstance(p, UserPromptPart) and isinstance(p.content, str))
    out: list[str] = []
    size = 0
    for text in texts:
        cleaned = SCRIPT_RE.sub(" ", text).strip()
        if cleaned and cleaned not in out:
            out.append(cleaned[:MAX_TRUSTED_CHARS - size])
            size += len(out[-1])
            if size >= MAX_TRUSTED_CHARS:
                break
    return out


class Gate:
    """The approval gate of a turn's calls, and the approval state it owns."""

    def __init__(self, deps: Deps, turn: Turn, rec: Recorder, budget: Budget, taint: Taint,
                 plan: Callable[[], Plan | None], log: Any) -> None:
        self.deps = deps
        self.log = log
        self.turn = turn
        self.rec = rec
        self.budget = budget
        self.taint = taint
        self.plan = plan
        self.open_approval: str | None = None
        self.pre_tool: Callable[[Gate, CallSpec, GuardResult], Awaitable[GateOutcome | None]] | None = None
        """The turn's PreToolUse hooks, asked after guard and before the judge (set by the loop)."""
        self.run = running_run(turn.info)
        """The session's run while it drives (``confirm``, ``unattended``), else None."""

    async def decide(self, call: CallSpec) -> GateOutcome:
        turn = self.turn
        # A call that changes nothing (a read, respond, the plan tools, a program read or
        # stopped) is decided here by guard's own function for it (coxswain.readpolicy): allowed
        # or refused, never a question, so neither the standing approvals nor the don't-ask
        # switch are read for it. Every other call goes to guard.
        local = readpolicy.decide(self.deps.settings.root, str(turn.workspace), call.name, call.args)
        dont_ask = False
        if local is not None:
            g = local
        else:
            stored, dont_ask = await self.policy_inputs()
            standing = set(stored) | turn.turn_standing
            # Taint is about commands and MCP calls (arguments built from tool output); a write's
            # content is enough to send.
            command = call.name in COMMAND_LIKE or self.deps.settings.mcp.server_of(call.name) is not None
            req = GuardRequest(
                sid=turn.sid, workspace=str(turn.workspace), call=call, dont_ask=dont_ask, standing=sorted(standing),
                tainted=self.taint.fragments() if command else [], trusted=person_words(turn, self.rec) if command else [],
            )
            g = await self._guard(req)
        decision = ev.PolicyDecision(sid=turn.sid, turn_id=turn.turn_id, call_id=call.call_id,
                                     verdict=g.verdict, actor=g.actor, reason=g.reason, security=g.security,
                                     name=call.name, path=g.path, preview=g.preview)
        # A read changes nothing: its call, decision and result go in one record (a turn that ends
        # first records them on its way out; after a crash the takeover closes the open call).
        if g.verdict == "allow" and call.name in tools.READ_ONLY:
            self.rec.defer(decision)
        else:
            await self.rec.emit(decision)
        if g.verdict == "refuse":
            return GateOutcome(False, g.reason, g.actor, g.path, guard=g)
        if self.pre_tool is not None and (hooked := await self.pre_tool(self, call, g)) is not None:
            return hooked  # a PreToolUse hook decided (cox_runner.hooks.gate_pre_tool)
        if g.verdict == "allow":
            return GateOutcome(True, g.reason, g.actor, g.path, guard=g)

        if not g.security and dont_ask:
            await self._decided(call, "allow", "setting", "the don't-ask switch is on", g)
            return GateOutcome(True, "don't ask is on", "setting", g.path, guard=g)

        run = self.run
        if run is not None and not g.security and run.get("confirm") == "yolo":
            await self._decided(call, "allow", "run", "the run allows every ordinary confirm (confirm: yolo)", g)
            return GateOutcome(True, "allowed by the run (confirm: yolo)", "run", g.path, guard=g)
        if run is not None and not g.security and run.get("confirm") == "judge":
            # The judge decides every ordinary confirm of the run; what it does not allow is declined.
            j = await self._ask_judge(call)
            await self._judge_usage(j)
            if j.verdict == "allow":
                await self._decided(call, "allow", "judge", j.reason, g)
                return GateOutcome(True, j.reason, "judge", g.path, guard=g)
            why = f"declined: the run's judge did not allow it ({j.reason or j.verdict})"
            await self._decided(call, "refuse", "judge", why, g)
            return GateOutcome(False, why, "judge", g.path, guard=g)

        judge_info: dict[str, Any] | None = None
        if g.route == "judge":  # a security confirm routed here gets the judge's view, never its allow
            j = await self._ask_judge(call)
            await self._judge_usage(j)
            if j.verdict == "allow" and not g.security:
                await self._decided(call, "allow", "judge", j.reason, g)
                return GateOutcome(True, j.reason, "judge", g.path, guard=g)
            judge_info = j.model_dump(mode="json", exclude_none=True, exclude={"usage"})

        return await self.ask_person(call, g, judge_info)

    async def screen_attachments(self, attached: list[dict[str, Any]]) -> frozenset[str]:
        """Before the turn gives its message's attachments to the model: each one that is not an
        image is checked by guard for content that looks like a credential, and such a one asks
        the person (a security confirm, ``approval.pending``) as a write of it would. One the
        person (or an unattended run) denies is withheld: ``attachment.withheld``, and the model
        is told its name only. Answers the ids withheld."""
        t = self.turn
        root, store_dir = self.deps.settings.root, self.deps.settings.store_dir
        held: set[str] = set()
        for a in attached:
            aid, name, media = str(a.get("attachment_id", "")), str(a.get("name", "")), str(a.get("media_type", ""))
            if att.kind(media) == "image":
                continue
            try:
                path = att.blob(root, store_dir, str(a.get("sha256", "")))
                data = await asyncio.to_thread(_head, path, SCREENED_CHARS * 4)
            except (OSError, ValueError):
                continue  # nothing to give: the transcript says its content is no longer kept
            meta = {"attachment_id": aid, "name": name, "media_type": media, "size": int(a.get("size") or 0)}
            req = GuardRequest(sid=t.sid, workspace=str(t.workspace), call=CallSpec(
                call_id=new_id("c"), name=ATTACHMENT_CALL,
                args={**meta, "content": data.decode("utf-8", errors="replace")[:SCREENED_CHARS]}))
            g = await self._guard(req)
            if g.verdict == "allow":
                continue
            # the question and the log name the file, never its content (it may be a secret)
            call = CallSpec(call_id=req.call.call_id, name=ATTACHMENT_CALL, args=meta)
            await self.rec.emit(ev.PolicyDecision(sid=t.sid, turn_id=t.turn_id, call_id=call.call_id,
                                                  verdict=g.verdict, actor=g.actor, reason=g.reason,
                                                  security=g.security, name=call.name))
            allowed = False
            if g.verdict == "ask":
                allowed = (await self.ask_person(call, g, None)).allowed
            if not allowed:
                held.add(aid)
                await self.rec.emit(ev.AttachmentWithheld(sid=t.sid, turn_id=t.turn_id, attachment_id=aid, name=name,
                                                          reason=g.reason))
        return frozenset(held)

    async def _guard(self, req: GuardRequest) -> GuardResult:
        return await infra.call(self.deps, self.turn, self.budget, self.log, "guard",
                                lambda _: self.deps.clients.guard(req))

    async def policy_inputs(self) -> tuple[frozenset[str], bool]:
        """The session's standing approvals and don't-ask switch: read once (one round trip), then
        kept for the turn's next calls until a doorbell or a renewal says they may have changed."""
        t = self.turn
        if t.policy_inputs is None:
            base = keys.session(t.sid)
            async with self.deps.redis.pipeline(transaction=False) as pipe:
                pipe.smembers(base + keys.STANDING)
                pipe.hget(base, "dont_ask")
                standing, dont_ask = await pipe.execute()
            t.policy_inputs = (frozenset(standing), dont_ask == "1")
        return t.policy_inputs

    async def _decided(self, call: CallSpec, verdict: str, actor: str, reason: str,
                       g: GuardResult | None = None) -> None:
        t = self.turn
        # The preview was recorded with guard's decision of this call; it is not repeated here.
        await self.rec.emit(ev.PolicyDecision(sid=t.sid, turn_id=t.turn_id, call_id=call.call_id,
                                              verdict=verdict, actor=actor, reason=reason, name=call.name,
                                              path=g.path if g else None))

    async def _ask_judge(self, call: CallSpec) -> JudgeResult:
        t = self.turn
        plan = self.plan()
        sandbox = self.deps.settings.sandbox
        sandboxed = sandbox.mode != "none"
        network = sandbox.network or call.args.get("network") is True
        program = call.args.get("program")
        if call.name == "write_program" and isinstance(program, dict):  # the program's own network
            network = sandbox.network or program.get("network") is True
        mcp = self.deps.settings.mcp.server_of(call.name)
        if mcp is not None:  # an HTTP server runs outside the sandbox, with whatever it can reach
            sandboxed = sandboxed and mcp[0].url is None
            network = mcp[0].url is not None or mcp[0].network or sandbox.network
        # a run's 'continue' goes on with the task it was given (the session's task stays that one)
        task = (t.info.get("task") or t.text) if t.via == "run" else t.text
        req = JudgeRequest(
            sid=t.sid, workspace=str(t.workspace), call=call, task=task,
            plan=Plan(steps=plan.steps, marks=plan.marks) if plan else None,
            sandboxed=sandboxed, network=network,
        )
        try:
            # Unreachable, the judge is waited for like guard (the turn ends ``unavailable`` past
            # the bound); an error it answers goes to the person with what it said.
            return await infra.call(self.deps, t, self.budget, self.log, "the judge",
                                    lambda _: self.deps.clients.judge(req))
        except CoxError as exc:
            return JudgeResult(verdict="error", reason=f"the judge failed: {exc.detail}", kind="unavailable")

    async def _judge_usage(self, j: JudgeResult) -> None:
        """A model judge's request is one of the turn's model requests: a ``usage`` event."""
        if not j.usage:
            return
        fields = {k: j.usage.get(k, 0) for k in ("input_tokens", "output_tokens", "cache_read_tokens",
                                                 "cache_write_tokens", "cost")}
        model = str(j.usage.get("model") or "judge")
        await self.rec.emit(ev.Usage(**self.rec.e(), purpose="judge", model=model, **fields),
                            ops=usage.totals_ops(fields))
        await self.deps.clients.usage_seen({"model": model, "purpose": "judge", **fields})

    async def ask_person(self, call: CallSpec, g: GuardResult | None, judge_info: dict[str, Any] | None, *,
                         reason: str | None = None, security: bool | None = None) -> GateOutcome:
        """Open an approval and wait for its answer (or Stop/steer, which dismisses it).

        Leads saved meanwhile wait: the approval stays open (the person's question stays
        answerable) and the loop applies them at the boundary after this call. Turning the
        don't-ask switch on answers a pending approval that is not a security confirm. Time spent
        here does not count against the turn's time limit.
        """
        t = self.turn
        aid = new_id("a")
        sec = bool(g is not None and g.security) if security is None else security
        why = reason or (g.reason if g else "")
        key = standing_key(call.name, call.args, g.path if g else None)
        record = {
            "approval_id": aid, "call_id": call.call_id, "name": call.name, "args": call.args,
            "security": sec, "reason": why, "judge": judge_info, "turn_id": t.turn_id,
            "state": "pending", "standing_key": key, "preview": g.preview if g else None,
        }
        pending = ev.ApprovalPending(sid=t.sid, turn_id=t.turn_id, approval_id=aid, call_id=call.call_id, security=sec,
                                     judge=judge_info, name=call.name, args=call.args, reason=why,
                                     preview=g.preview if g else None)
        if self.run is not None and self.run.get("unattended") is True:
            # Nobody answers an unattended run: what would wait for a person is declined at once,
            # in the step that records it (the log keeps the question and its answer).
            record.update(state="resolved", decision="deny", scope="once", actor="run")
            await self.rec.emit(
                pending,
                ev.ApprovalResolved(sid=t.sid, turn_id=t.turn_id, approval_id=aid, decision="deny", actor="run",
                                    scope="once", reason=UNATTENDED),
                ops=[("hset", keys.APPROVALS, aid, json.dumps(record, ensure_ascii=False))],
            )
            said = (f"declined: this run is unattended, so nobody answers what would ask a person "
                    f"({why or call.name})")
            await self._decided(call, "refuse", "run", said, g)
            return GateOutcome(False, said, "run", g.path if g else None, guard=g)
        ttl_s = self.deps.settings.approval.link_ttl_s
        if ttl_s > 0:
            link_key = await approval_links.runner_key(self.deps.redis)
            token = approval_links.sign(link_key, t.sid, aid, int((time.time() + ttl_s) * 1000))
            pending.answer_url = record["answer_url"] = approval_links.url(self.deps.settings.gateway.public_url, token)
        await self.rec.emit(pending, ops=[("hset", keys.APPROVALS, aid, json.dumps(record, ensure_ascii=False))])
        self.open_approval = aid
        base = keys.session(t.sid)
        redis = self.deps.redis
        started = time.monotonic()
        timeout_s = self.deps.settings.approval.timeout_s
        try:
            while True:
                t.bell.clear()
                raw = await redis.hget(base + keys.APPROVALS, aid)
                a = json.loads(raw) if raw else {}
                state = a.get("state")
                if state == "resolved":
                    break
                if t.stopping or state == "dismissed":
                    await self.dismiss("the turn was stopped")
                    raise StopRequested(t.stop_reason or "stop")
                if not sec and (await self.policy_inputs())[1]:  # re-read after any doorbell
                    await self.answer(aid, "allow", actor="dont_ask", reason="the don't-ask switch is on")
                    continue
                wait_s = APPROVAL_POLL_S
                if timeout_s > 0:
                    left = started + timeout_s - time.monotonic()
                    if left <= 0:
                        # declined, as a person's Deny would be; a person's answer that came first wins
                        await self.answer(aid, "deny", actor="timeout",
                                          reason=f"nobody answered within [approval] timeout_s ({timeout_s:g} s)")
                        continue
                    wait_s = min(wait_s, left)
                try:
                    await asyncio.wait_for(t.bell.wait(), wait_s)
                except TimeoutError:
                    pass
        finally:
            self.budget.waited += time.monotonic() - started
        self.open_approval = None
        decision = a.get("decision", "deny")
        actor = a.get("actor") or "person"
        message = a.get("message")
        if decision == "allow" and a.get("scope") == "turn" and key and (not sec or key == STANDING_NETWORK):
            t.turn_standing.add(key)
        said = f"allowed by {_who(actor)}" if decision == "allow" else f"denied by {_who(actor)}"
        await self._decided(call, "allow" if decision == "allow" else "refuse", actor, said, g)
        return GateOutcome(decision == "allow", said, actor, g.path if g else None, message=message, guard=g)

    async def answer(self, aid: str, decision: str, *, actor: str, reason: str) -> bool:
        """Answer an approval on the runner's side (don't-ask, dismissal); False if it was answered already."""
        t = self.turn
        try:
            await self.deps.store.fns.answer(sid=t.sid, principal="", aid=aid, decision=decision, scope="once",
                                             message="", owner=self.deps.owner, actor=actor, why=reason)
        except Resolved:
            return False
        return True

    async def dismiss(self, reason: str) -> None:
        """Close the pending approval of a turn that is ending (Stop, steer, shutdown): never left open."""
        aid, self.open_approval = self.open_approval, None
        if aid is not None:
            await self.answer(aid, "deny", actor="policy", reason=reason)


def _head(path: Any, n: int) -> bytes:
    with open(path, "rb") as f:
        return f.read(n)


def _who(actor: str) -> str:
    if actor == "timeout":
        return "nobody in time ([approval] timeout_s)"
    return "the don't-ask switch" if actor == "dont_ask" else "the person"
