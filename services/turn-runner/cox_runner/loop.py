"""The turn loop (docs/design.md, "The turn loop"): model request, tool calls, safe boundaries, limits, plan.

One :class:`TurnLoop` runs one turn to its end and returns an :class:`Ending`; the drive
(``drive.py``) records it and starts whatever waits next. There is no response-round cap: the
loop runs until the model answers, an error stops progress, a limit ends it, or Stop/steer.

Safe boundaries are after each model response and after each tool call. At a boundary with a
Lead saved (read from Redis, so a late doorbell never makes a Lead miss one), the in-flight action
has finished; the unstarted calls of the response are skipped (each still gets a result), the
Leads become user messages and the next request goes out. An approval that is pending stays
open while Leads wait (the person's question stays answerable). An approval answered with a message is a newer instruction too:
the message is recorded right after the call's result and the rest of that response is skipped
(reason ``approval``). Before the turn's final work Lead admission closes atomically with the
check for pending Leads: a Lead saved before is applied and the turn goes on.

Whatever ends a turn, every call it opened is closed with a result first (``_close``), and an
approval it left open is dismissed: the transcript never holds a call without its result.

The loop orchestrates parts that never import it: the :class:`~cox_runner.step.ModelStep` (one
model request and the title), the :class:`~cox_runner.calls.ToolRound` (a response's tool calls),
the :class:`~cox_runner.leads.Leads` (safe boundaries), the :class:`~cox_runner.checkpoints.Checkpoints`
(limits), the :class:`~cox_runner.recorder.Recorder` (events out, open calls, the transcript), the
pure :class:`~cox_runner.budget.Budget`, the :class:`~cox_runner.gate.Gate` (approvals) and the tool
handlers (:data:`cox_runner.handlers.HANDLERS`, one function per tool).

Limits: the hard ones end the turn ``hard_budget`` (``limit.hard``); ``[limits] spend`` ends it
``spend_limit``. A soft limit set lower than its hard one (or a soft spend limit) is a checkpoint:
``limit.soft``, then an approval named ``continue`` that the person answers once per limit and
turn: allow goes on, deny ends the turn ``canceled``, a message is delivered like any approval
message; the don't-ask switch answers it yes. Time waiting for the person does not count
against the time limit. The progress guard ends a turn ``stuck`` when the same call returns the
same result ``stuck_repeats`` times in a row.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any, TypeVar

from pydantic_ai.messages import TextPart, ToolCallPart

from coxswain import attachments as att
from coxswain import events as ev
from coxswain import hookspec, keys
from coxswain.errors import CoxError, describe, logged
from coxswain.ids import new_id
from coxswain.models import Plan

from . import handlers, hooks, instructions, spending, transcript
from .budget import Budget
from .calls import ToolRound
from .checkpoints import Checkpoints
from .compaction import Compactor
from .deps import Deps
from .errors import LeaseLost, StopRequested
from .gate import Gate, Taint
from .handlers import PlanState, ToolContext
from .leads import Leads
from .recorder import CLOSE_LEADS, Recorder
from .step import ModelStep, raw_finish
from .turn import SKIP_FOR_OUTCOME, STOP_OUTCOME, Ending, EndTurn, Turn, guarded
from .workspace import tools

T = TypeVar("T")

SYSTEM = (
    "You are a coding agent working in the folder {workspace}. Use the tools to read, write and "
    "run commands there; paths are relative to that folder. Writes go ahead and the previous "
    "content is kept; commands may need approval. Use respond to tell the person something without "
    "ending your turn. For work of several steps, write a plan with plan_write and mark steps with "
    "plan_step. When you are done, answer with a short summary and no tool call."
)


class TurnLoop:
    def __init__(self, deps: Deps, turn: Turn, carried: transcript.Builder | None = None) -> None:
        self.deps = deps
        self.turn = turn
        self.carried = carried
        """The transcript as the previous turn of the same drive left it (None: rebuild from the log)."""
        self.settings = deps.settings
        self.log = deps.log.bind(sid=turn.sid, turn_id=turn.turn_id)
        self.rec = Recorder(deps, turn)
        self.budget = Budget(deps.settings.limits, started=turn.started)
        self.plan = PlanState()
        self.taint = Taint()
        self.gate = Gate(deps, turn, self.rec, self.budget, self.taint, lambda: self.plan.plan, self.log)
        self.tools = ToolContext(deps=deps, turn=turn, rec=self.rec, budget=self.budget, taint=self.taint,
                                 plan=self.plan, log=self.log, guarded=self.guarded)
        self.files: transcript.AttachmentFiles | None = None
        """Where this turn's transcript takes attachments from (set by the load)."""
        self.agents: str | None = None
        """The workspace's ``AGENTS.md``, read at turn start (given after the system prompt)."""
        self.compactor = Compactor(deps, turn, self.rec, self.budget, self.log, self.instructions, self.guarded)
        self.hooks = hooks.Hooks(deps, turn, self.rec, self.log)
        self.gate.pre_tool = lambda gate, call, g: hooks.gate_pre_tool(self.hooks, gate, call, g)
        self.compactor.pre_compact = self.hooks.pre_compact
        self.checks = Checkpoints(turn, self.rec, self.budget, self.gate)
        self.leads = Leads(deps, turn, self.rec)
        self.step = ModelStep(deps, turn, self.rec, self.budget, self.checks, self.compactor, self.instructions,
                              self.log)
        self.calls = ToolRound(turn, self.rec, self.budget, self.gate, self.hooks, self.tools, self.checks,
                               self.leads)
        self.step.may_defer = self.may_defer
        self.step.may_close = self.may_close

    def may_close(self) -> bool:
        """A response that asks for no call ends the turn unless something newer waits: its record
        may close Lead admission (atomically with the look for a saved Lead, as
        :meth:`Leads.close_or_apply <cox_runner.leads.Leads.close_or_apply>` would a moment later)
        when nothing can come between the two: no Stop hook to run (it may save a Lead), no
        message of an approval waiting, and the session's title asked for already (Leads stay
        admitted while a first turn names its session, as before)."""
        return self.step.titled and not self.rec.pending_user and not self.hooks.has("Stop")

    def may_defer(self, calls: list[ToolCallPart]) -> bool:
        """A response whose first call is a read is recorded with that read's call, decision and
        result (one Redis call and one publish for the step, not two): the read changes nothing,
        so whether it ran or not, the log that a crash leaves is one the takeover can go on from
        (without the response: the model is asked again). Not when the response must be in the
        log before the call runs: with daily budgets (its cost is counted in Redis before
        anything else happens) or a PreToolUse hook for the read (a process that may take its
        time, while the person waits to see the response). A Lead saved while the model answered
        still skips the response's calls when its doorbell arrived in time; one whose doorbell
        came late is seen in the read's reply, and skips the calls after the read."""
        first = calls[0].tool_name
        return (first in tools.READ_ONLY and not self.hooks.has("PreToolUse", first)
                and not spending.active(self.turn.info, self.settings.limits))

    async def guarded(self, aw: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        """Await ``aw`` unless Stop/steer comes first; then cancel it and raise StopRequested."""
        return await guarded(self.turn, aw)

    async def run(self) -> Ending:
        """Run the turn to its end. Whatever ends it, every call it opened gets a result first.
        The final response may be left to the turn's end to record (:attr:`Recorder.closing
        <cox_runner.recorder.Recorder.closing>`): when that finds a Lead waiting, :meth:`resume`."""
        return await self._until_end(self._begin)

    async def resume(self) -> Ending:
        """The turn's end recorded its final response but a Lead was waiting, so it did not end:
        apply the Leads and go on to the turn's (next) end."""
        return await self._until_end(self._apply_leads)

    async def _begin(self) -> Ending:
        await self._load()
        await self._hooks_start()
        await self._programs_gone()
        return await self._loop()

    async def _apply_leads(self) -> Ending:
        await self.leads.apply()
        return await self._loop()

    async def _until_end(self, body: Callable[[], Awaitable[Ending]]) -> Ending:
        try:
            ending = await body()
        except EndTurn as end:
            ending = end.ending
        except StopRequested as stop:
            ending = Ending(STOP_OUTCOME.get(stop.reason, "stopped"), detail=f"{stop.reason} requested")
        except (LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # an internal failure still closes the turn's calls
            self.log.error("turn.failed", error=logged(exc), exc_info=exc)
            ending = Ending("error", detail=f"internal error: {describe(exc)}")
        await self._close(ending)
        return ending

    def handed_on(self) -> transcript.Builder:
        """The transcript with everything this turn recorded, for the drive's next turn."""
        self.rec.take_pending()
        return self.rec.history

    async def _close(self, ending: Ending) -> None:
        rec = self.rec
        await rec.settle()
        if rec.has_deferred and not (rec.closing and not rec.open and self.gate.open_approval is None):
            await rec.emit()
        if self.gate.open_approval is not None:
            await self.gate.dismiss(f"the turn ended ({ending.outcome})")
        if rec.open:
            reason = self.turn.skip_reason if ending.outcome == "stopped" else SKIP_FOR_OUTCOME.get(
                ending.outcome, "canceled")
            await rec.skip(list(rec.open.values()), reason)

    async def _load(self) -> None:
        """The transcript so far: carried from this drive's previous turn (the lease was held from
        that turn to this one, so nobody else wrote to the conversation), else from the log."""
        t = self.turn
        images = self.deps.models.takes_images(t.model)
        pictured = [str(a.get("name", "")) for a in t.attachments if att.kind(str(a.get("media_type", ""))) == "image"]
        refused = bool(pictured) and not images
        held = await self.gate.screen_attachments(t.attachments) if t.attachments and not refused else frozenset()
        files = self.files = transcript.AttachmentFiles(self.deps.settings.root, self.deps.settings.store_dir,
                                                        t.workspace, held, images)
        if self.carried is not None:
            self.rec.history = self.carried
            if t.attachments:  # their files are read: off the loop
                await asyncio.to_thread(self.rec.history.user, t.text, t.via, t.attachments, files)
            else:  # a text part, microseconds: a thread's hop would cost more than the call
                self.rec.history.user(t.text, t.via, t.attachments, files)
        elif t.fresh and not t.attachments and t.info.get("seq"):
            # The session's first turn: the call that began it said so (``fresh``: the session
            # was 'blank', or cox_run made it and began this turn in one call), so of its log the
            # transcript takes this message alone (transcript.build). Made here, it spares a flush
            # of the outbox (another runner may still be publishing the sends it admitted) and a
            # read of JetStream per session.
            self.rec.history = self.deps.events.of_message(t.text, t.via, int(t.info["seq"]), files)
        else:
            # Up to the session's seq as the turn began (when the call that began it handed the
            # session over: its user.msg and turn.start are the last events the transcript needs):
            # the transcript the last drive here left with the events since folded in, or the
            # whole log (the outbox flushed, JetStream read) built.
            seq = t.info.get("seq") if t.info else None
            self.rec.history = await self.deps.events.history(t.sid, int(seq) if seq else None, files)
        if refused:
            # Checked when the message was sent or queued; the session's model changed since (a
            # queued message runs on the model chosen meanwhile). Refused before the model is
            # asked (the transcript loaded first, so the drive's next turn carries it on); the
            # message keeps its attachments in the log.
            raise EndTurn(Ending("error", detail=(
                f"not_accepting: model {t.model!r} does not take images ({', '.join(pictured)}); the session's "
                "model was changed after this message was queued. Nothing was sent to the model; the message "
                "and its attachments are kept: choose a model that takes images and send them again")))
        # A provider's first use imports its SDK (seconds on a loaded machine): a Stop or steer
        # meanwhile ends the turn at once, not when the import is done.
        await self.guarded(self.deps.models.load(t.model))
        found = await instructions.agents_md(t.workspace)
        if found is not None:
            self.agents, digest = found
            self.log.info("agents_md.read", sha256=digest, chars=len(self.agents))
        if not t.info:  # read by the drive as the turn began (every turn but a test's own)
            t.info = await self.deps.redis.hgetall(keys.session(t.sid))
        info = t.info
        plan_raw = info.get("plan")
        plan = Plan(**json.loads(plan_raw)) if plan_raw else None
        if plan is not None and plan.turn_id != t.turn_id:
            marks = sorted(set(plan.marks))
            if len(marks) < len(plan.steps):
                from_turn = plan.turn_id or ""
                self.plan.plan = plan.model_copy(update={"marks": marks, "turn_id": t.turn_id})
                self.plan.carried = True
                await self.rec.emit(ev.PlanCarried(**self.rec.e(), from_turn=from_turn, steps=plan.steps, marks=marks),
                                    ops=[("hset", "", "plan", self.plan.stored())])
            else:
                plan = None
        if plan is not None and not self.plan.carried:
            self.plan.plan = plan
        self.step.titled = bool(info.get("title_source")) or info.get("auto_title") != "1"
        if t.mcp is not None:
            # The drive's first turn starts the session's MCP servers (each bounded by its
            # start_timeout_s); one that fails is an event, never the turn's end.
            await self.guarded(t.mcp.start(t.workspace, tools.command_env(t.workspace)))
            await handlers.mcp_changes(self.rec, t.mcp)

    def instructions(self) -> str:
        text = SYSTEM.format(workspace=self.turn.workspace.name or ".")
        if self.agents:
            text += "\n\nThe project's instructions (AGENTS.md in the workspace):\n" + self.agents
        plan = self.plan.plan
        if plan:
            marks = set(plan.marks)
            lines = [f"{i}. [{'x' if i in marks else ' '}] {s}" for i, s in enumerate(plan.steps, 1)]
            head = ("The plan so far (carried from an unfinished turn; go on from the next unmarked step, "
                    "or rewrite it with plan_write):" if self.plan.carried else "The plan:")
            text += "\n\n" + head + "\n" + "\n".join(lines)
        return text

    async def _loop(self) -> Ending:
        while True:
            self.checks.check_time()
            response = await self.step.run()
            calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
            text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
            finish = response.finish_reason
            provider_finish = raw_finish(response)

            if finish == "length":
                # A truncated response's calls may be cut mid-argument: none of them runs.
                await self.rec.skip(calls, "truncated")
                if await self.leads.close_or_apply():
                    continue
                return Ending("output_limit", finish_reason=finish, provider_finish_reason=provider_finish,
                              detail="the response was cut off by the output limit; its tool calls were not run")

            if not self.step.titled and text.strip():
                await self.title(closes=not calls)

            if not calls:
                if not await self.leads.due():
                    await self._stop_hooks(text)
                if await self.leads.close_or_apply():
                    continue
                if not text.strip():
                    return Ending("empty", finish_reason=finish, provider_finish_reason=provider_finish,
                                  detail="the model gave an empty answer")
                return Ending("completed", finish_reason=finish, provider_finish_reason=provider_finish)

            # Safe boundary after the model response: nothing of it has started yet.
            if await self.leads.boundary(calls):
                continue
            await self.calls.run(calls)
            if not self.step.titled:
                await self.step.title()

    async def title(self, closes: bool) -> None:
        """Name the session after its first response. When that response asked for no call
        (``closes``) and nothing else can come before the turn's end (:meth:`may_close`, now that
        the title is asked), Lead admission closes with the turn's end, which records what the title
        left deferred: one Redis call and one publish for the three, as for any later turn's end."""
        await self.step.title()
        if closes and self.may_close():
            self.rec.defer(ops=[CLOSE_LEADS])

    async def _hooks_start(self) -> None:
        """Load the turn's hooks; on a turn that starts on a message, its UserPromptSubmit hooks."""
        t = self.turn
        try:
            if not self.hooks.nothing_to_load():  # a new Hooks per turn: no sources until loaded
                await asyncio.to_thread(self.hooks.load)
        except hookspec.BadHooks as exc:
            raise EndTurn(Ending("error", detail=f"hooks: {exc}")) from exc
        if t.via not in ("send", "queue", "steer") or not self.hooks.has("UserPromptSubmit"):
            return
        blocked, context = await self.guarded(self.hooks.prompt_submit(t.text))
        if blocked is not None:
            raise EndTurn(Ending("canceled", detail=f"a UserPromptSubmit hook blocked the message: {blocked}"))
        if context:
            await self.rec.user_message(context, f"hook-prompt-{t.turn_id}", "lead", note=True)

    async def _programs_gone(self) -> None:
        """Programs the session lists that do not run on this runner are gone (their runner
        stopped, or the session was taken over): recorded ``program.stopped`` by ``runner``, and
        the model is told before its first request."""
        t = self.turn
        progs = self.deps.programs
        if progs is None:
            return
        gone = await progs.books.gone(t.sid, t.info.get("programs"))
        if not gone:
            return
        evs = [ev.ProgramStopped(**self.rec.e(), program_id=str(g.get("program_id")), by="runner") for g in gone]
        await self.rec.emit(*evs, ops=[progs.listing(t.sid)])
        names = ", ".join(f"{g.get('program_id')} ({g.get('name')}: {g.get('command')})" for g in gone)
        await self.rec.user_message(
            f"[coxswain: the session's programs {names} are gone: the runner that ran them stopped. Start them "
            "again with start_program if they are still needed.]", f"programs-gone-{t.turn_id}", "lead", note=True)

    async def _stop_hooks(self, text: str) -> None:
        """The model would end the turn: a Stop hook that blocks saves its reason as a Lead (the
        person's Lead mechanism), which :meth:`Leads.close_or_apply <cox_runner.leads.Leads.close_or_apply>` then applies."""
        t = self.turn
        if not self.hooks.has("Stop"):
            return
        reason = await self.guarded(self.hooks.stop(text))
        if reason is None:
            return
        try:
            await self.deps.store.fns.lead(sid=t.sid, principal="", lead_id=new_id("l"), text=reason, client_id="",
                                           max_pending=self.settings.lead.max_pending, owner=self.deps.owner,
                                           want_turn=t.turn_id)
        except CoxError as exc:  # Leads closed (Stop) or too many waiting: the turn ends as it would
            self.log.warning("hook.stop_lead_refused", error=exc.detail)
