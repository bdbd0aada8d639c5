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

The loop orchestrates parts that never import it: the :class:`~cox_runner.recorder.Recorder`
(events out, open calls, the transcript), the pure :class:`~cox_runner.budget.Budget` (limits),
the :class:`~cox_runner.gate.Gate` (approvals) and the tool handlers
(:data:`cox_runner.handlers.HANDLERS`, one function per tool).

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
import time
from collections.abc import Awaitable, Coroutine
from typing import Any, TypeVar

from pydantic_ai.direct import model_request, model_request_stream
from pydantic_ai.messages import (
    ModelRequest,
    ModelResponse,
    PartDeltaEvent,
    PartStartEvent,
    TextPart,
    TextPartDelta,
    ToolCallPart,
    UserPromptPart,
)
from pydantic_ai.models import ModelRequestParameters

from coxswain import events as ev
from coxswain import hookspec, keys
from coxswain.errors import CoxError, Fenced, describe
from coxswain.ids import new_id
from coxswain.models import CallSpec, Plan

from . import handlers, hooks, instructions, transcript
from .budget import Budget
from .compaction import Compactor
from .deps import Deps
from .errors import LeaseLost, StopRequested
from .gate import Gate, Taint
from .handlers import PlanState, ToolContext
from .model import retry, usage
from .recorder import Recorder
from .turn import SKIP_FOR_OUTCOME, STOP_OUTCOME, Ending, EndTurn, Turn, guarded, stopped_by
from .workspace import tools

T = TypeVar("T")

SYSTEM = (
    "You are a coding agent working in the folder {workspace}. Use the tools to read, write and "
    "run commands there; paths are relative to that folder. Writes go ahead and the previous "
    "content is kept; commands may need approval. Use respond to tell the person something without "
    "ending your turn. For work of several steps, write a plan with plan_write and mark steps with "
    "plan_step. When you are done, answer with a short summary and no tool call."
)
TITLE_PROMPT = "Give this conversation a title of at most five words. Answer with the title only."
DELTA_FLUSH_CHARS = 256
DELTA_FLUSH_S = 0.05
TITLE_TIMEOUT_S = 120.0
USAGE_SAMPLE = {"model", "purpose", "input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "cost"}
"""The fields of a ``usage`` event the gateways' metrics count."""


class _TooLong(Exception):
    """The provider refused a request as over the model's context window."""


class TurnLoop:
    def __init__(self, deps: Deps, turn: Turn, carried: transcript.Builder | None = None) -> None:
        self.deps = deps
        self.turn = turn
        self.carried = carried
        """The transcript as the previous turn of the same drive left it (None: rebuild from the log)."""
        self.settings = deps.settings
        self.limits = deps.settings.limits
        self.log = deps.log.bind(sid=turn.sid, turn_id=turn.turn_id)
        self.rec = Recorder(deps, turn)
        self.budget = Budget(self.limits, started=turn.started)
        self.plan = PlanState()
        self.taint = Taint()
        self.gate = Gate(deps, turn, self.rec, self.budget, self.taint, lambda: self.plan.plan, self.log)
        self.tools = ToolContext(deps=deps, turn=turn, rec=self.rec, budget=self.budget, taint=self.taint,
                                 plan=self.plan, log=self.log, guarded=self.guarded)
        self.titled = False
        self.agents: str | None = None
        """The workspace's ``AGENTS.md``, read at turn start (given after the system prompt)."""
        self._usage_ops: list[tuple[str, str, str, str]] = []
        self.compactor = Compactor(deps, turn, self.rec, self.budget, self.log, self.instructions, self.guarded)
        self.hooks = hooks.Hooks(deps, turn, self.rec, self.log)
        self.gate.pre_tool = lambda gate, call, g: hooks.gate_pre_tool(self.hooks, gate, call, g)
        self.compactor.pre_compact = self.hooks.pre_compact

    def elapsed(self) -> float:
        """Seconds of work so far: wall time minus time spent waiting for the person."""
        return self.budget.elapsed(time.monotonic())

    async def guarded(self, aw: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        """Await ``aw`` unless Stop/steer comes first; then cancel it and raise StopRequested."""
        return await guarded(self.turn, aw)

    # ------------------------------------------------------------------ the turn
    async def run(self) -> Ending:
        """Run the turn to its end. Whatever ends it, every call it opened gets a result first."""
        self.log.info("turn.begin", model=self.turn.model)
        try:
            await self._load()
            await self._hooks_start()
            ending = await self._loop()
        except EndTurn as end:
            ending = end.ending
        except StopRequested as stop:
            ending = Ending(STOP_OUTCOME.get(stop.reason, "stopped"), detail=f"{stop.reason} requested")
        except (LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # an internal failure still closes the turn's calls
            self.log.error("turn.failed", error=repr(exc), exc_info=exc)
            ending = Ending("error", detail=f"internal error: {describe(exc)}")
        await self._close(ending)
        return ending

    def handed_on(self) -> transcript.Builder:
        """The transcript with everything this turn recorded, for the drive's next turn."""
        self.rec.take_pending()
        return self.rec.history

    async def _close(self, ending: Ending) -> None:
        rec = self.rec
        if rec.has_deferred:
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
        if self.carried is not None:
            self.rec.history = self.carried
            self.rec.history.user(t.text, t.via)
        else:
            # events.read flushes the outbox and reads the log up to the session's seq.
            self.rec.history = transcript.build(await self.deps.events.read(t.sid))
        await self.deps.models.load(t.model)
        found = await asyncio.to_thread(instructions.read_agents_md, t.workspace)
        if found is not None:
            self.agents, digest = found
            self.log.info("agents_md.read", sha256=digest, chars=len(self.agents))
        info = await self.deps.redis.hgetall(keys.session(t.sid))
        t.info = info
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
        self.titled = bool(info.get("title_source")) or info.get("auto_title") != "1"
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
            self._check_time()
            response = await self._model_step()
            calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
            text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
            finish = response.finish_reason
            raw_finish = _raw_finish(response)

            if finish == "length":
                # A truncated response's calls may be cut mid-argument: none of them runs.
                await self.rec.skip(calls, "truncated")
                if await self._continue_for_leads():
                    continue
                return Ending("output_limit", finish_reason=finish, provider_finish_reason=raw_finish,
                              detail="the response was cut off by the output limit; its tool calls were not run")

            if not self.titled and text.strip():
                await self._title()

            if not calls:
                if not await self._leads_due():
                    await self._stop_hooks(text)
                if await self._continue_for_leads():
                    continue
                if not text.strip():
                    return Ending("empty", finish_reason=finish, provider_finish_reason=raw_finish,
                                  detail="the model gave an empty answer")
                return Ending("completed", finish_reason=finish, provider_finish_reason=raw_finish)

            # Safe boundary after the model response: nothing of it has started yet.
            if await self._boundary(calls):
                continue
            await self._tool_round(calls)
            if not self.titled:
                await self._title()

    # ------------------------------------------------------------------ model
    async def _model_step(self) -> ModelResponse:
        try:
            return await self._model_step_once()
        except _TooLong:
            # Refused as over the model's window: compact to well under it and send once more
            # (a second refusal ends the turn ``error`` with the provider's message).
            await self.compactor.after_refusal()
            return await self._model_step_once(last_try=True)

    async def _model_step_once(self, last_try: bool = False) -> ModelResponse:
        t = self.turn
        rec = self.rec
        await handlers.mcp_changes(rec, t.mcp)  # a server that died since: its tools are withdrawn now
        rec.take_pending()
        await self.compactor.before_request()  # keeps the request inside the context window
        messages = rec.history.request_messages(self.instructions())
        if rec.history.synthesized:
            self.log.warning("transcript.unanswered_calls", count=rec.history.synthesized)
        model = self.deps.models.get(t.model)
        offered = [*tools.TOOLS, *(t.mcp.tool_defs() if t.mcp is not None else [])]
        params = ModelRequestParameters(function_tools=offered, allow_text_output=True)
        settings = self.deps.models.settings(t.model)
        remaining = self.limits.seconds - self.elapsed()
        try:
            response = await self.guarded(asyncio.wait_for(self._request(model, messages, params, settings),
                                                           max(remaining, 0.001)))
        except TimeoutError:
            await rec.emit(ev.LimitHard(**rec.e(), limit="seconds", value=round(self.elapsed(), 3)))
            raise EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s "
                                                        "reached while the model was answering")) from None
        except (StopRequested, LeaseLost, asyncio.CancelledError, EndTurn, CoxError):
            raise
        except Exception as exc:  # any provider failure ends the turn with its reason
            if not last_try and retry.too_long(exc):
                self.log.warning("model.too_long", error=repr(exc))
                raise _TooLong from exc
            self.log.warning("model.failed", error=repr(exc))
            raise EndTurn(Ending("error", detail=f"model request failed: {exc}")) from exc

        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        cost = self._cost(response)
        usage: dict[str, Any] = {"input_tokens": response.usage.input_tokens,
                                 "output_tokens": response.usage.output_tokens}
        if cost:
            usage["cost"] = round(cost, 8)
        self.budget.add_response(response.usage.input_tokens + response.usage.output_tokens, cost)
        refs = [ev.ToolCallRef(call_id=c.tool_call_id, name=c.tool_name, args=_args_for_log(c)) for c in calls]
        used = self._usage("turn", response)
        await rec.emit(
            used,
            ev.AssistantMsg(**rec.e(), text=text, finish_reason=response.finish_reason, usage=usage,
                            tool_calls=refs, provider_finish_reason=_raw_finish(response)),
            ops=[*(("hset", keys.OPEN_CALLS, c.tool_call_id, c.tool_name) for c in calls), *self._usage_ops],
        )
        await self.deps.clients.usage_seen(used.model_dump(include=USAGE_SAMPLE))
        rec.open = {c.tool_call_id: c for c in calls}
        rec.history.assistant(text, [r.model_dump() for r in refs], response.finish_reason)
        b = self.budget
        if b.tokens_over():
            await self._hard("tokens", b.tokens)
        await self._warnings()
        if b.spend_over():
            await rec.emit(ev.LimitHard(**rec.e(), limit="spend", value=round(b.spend, 8)))
            raise EndTurn(Ending("spend_limit", detail=f"spend limit of ${self.limits.spend:g} reached "
                                                       f"(${b.spend:.6f})"))
        return response

    def _cost(self, response: ModelResponse) -> float:
        """USD this response counts against the turn's spend (:func:`cox_runner.model.usage.spend_cost`)."""
        return usage.spend_cost(self.deps.models.prices(self.turn.model), response)

    async def _request(self, model: Any, messages: list[Any], params: ModelRequestParameters,
                       settings: Any) -> ModelResponse:
        """One model request, retried while the provider fails in a way worth retrying (429, 5xx,
        time-outs, broken connections): capped exponential backoff with jitter, ``Retry-After``
        honoured, each retry a ``model.retry`` event. Stop and steer end a backoff at once (the
        whole request runs under :meth:`guarded`)."""
        cfg = self.settings.model

        async def on_retry(attempt: int, delay: float, exc: BaseException) -> None:
            said = retry.describe(exc)
            self.log.warning("model.retry", attempt=attempt, delay_s=round(delay, 3), error=said)
            await self.rec.emit(ev.ModelRetry(**self.rec.e(), attempt=attempt, delay_s=round(delay, 3), error=said))

        return await retry.with_retries(lambda: self._stream(model, messages, params, settings),
                                        on_retry=on_retry, retries=cfg.retries, max_s=cfg.retry_max_s)

    def _usage(self, purpose: str, response: ModelResponse) -> ev.Usage:
        """The ``usage`` event of one model request; :attr:`_usage_ops` add it to the session's totals."""
        t = self.turn
        u = usage.usage_of(response, self.settings.model.provider(t.model))
        self._usage_ops = usage.totals_ops(u)
        return ev.Usage(**self.rec.e(), purpose=purpose, model=t.model, **u)

    async def _stream(self, model: Any, messages: list[Any], params: ModelRequestParameters,
                      settings: Any) -> ModelResponse:
        buf: list[str] = []
        last = time.monotonic()
        async with model_request_stream(model, messages, model_settings=settings,
                                        model_request_parameters=params) as stream:
            async for event in stream:
                chunk = None
                if isinstance(event, PartStartEvent) and isinstance(event.part, TextPart):
                    chunk = event.part.content
                elif isinstance(event, PartDeltaEvent) and isinstance(event.delta, TextPartDelta):
                    chunk = event.delta.content_delta
                if chunk:
                    buf.append(chunk)
                    now = time.monotonic()
                    if sum(map(len, buf)) >= DELTA_FLUSH_CHARS or now - last >= DELTA_FLUSH_S:
                        await self.rec.emit(ev.AssistantDelta(**self.rec.e(), text="".join(buf)))
                        buf.clear()
                        last = now
            if buf:
                self.rec.defer(ev.AssistantDelta(**self.rec.e(), text="".join(buf)))
            return stream.get()

    async def _title(self) -> None:
        """Name the session once, serialised with this turn's own model requests."""
        self.titled = True
        t = self.turn
        first = _first_user_text(self.rec.history.messages) or t.text
        req = ModelRequest(parts=[UserPromptPart(content=first)], instructions=TITLE_PROMPT,
                           metadata={"cox_purpose": "title", "cox_vias": ["send"]})
        try:
            resp = await self.guarded(asyncio.wait_for(model_request(self.deps.models.get(t.model), [req]),
                                                       TITLE_TIMEOUT_S))
        except (StopRequested, LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a failed title never ends the turn
            self.log.info("title.failed", error=repr(exc))
            return
        used = self._usage("title", resp)
        await self.rec.emit(used, ops=self._usage_ops)
        await self.deps.clients.usage_seen(used.model_dump(include=USAGE_SAMPLE))
        title = _clean_title("".join(p.content for p in resp.parts if isinstance(p, TextPart)))
        if not title:
            return
        try:
            await self.deps.store.fns.auto_title(sid=t.sid, token=t.token, owner=self.deps.owner, title=title,
                                                 turn_id=t.turn_id)
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc

    # ------------------------------------------------------------------ tools
    async def _tool_round(self, calls: list[ToolCallPart]) -> None:
        malformed = False
        b = self.budget
        for i, call in enumerate(calls):
            if self.turn.stopping:
                raise StopRequested(self.turn.stop_reason or "stop")
            hit = b.call_limit(self._is_action(call.tool_name))
            if hit is not None:
                await self._hard(*hit)
            await self._soft_checks()
            if self.rec.pending_user:
                # the person answered a checkpoint with a message: a newer instruction, before this call
                await self.rec.skip(calls[i:], "approval")
                break
            malformed = await self._one_call(call) or malformed
            await self._warnings()
            if b.stuck(call.tool_name, call.args_as_json_str(), self.rec.last_output):
                n = self.limits.stuck_repeats
                raise EndTurn(Ending("stuck", detail=f"the same call returned the same result {n} times in a row"))
            # Safe boundary after each tool call.
            if i + 1 < len(calls):
                if self.turn.stopping:
                    raise StopRequested(self.turn.stop_reason or "stop")
                if await self._boundary(calls[i + 1:]):
                    break
        if b.malformed_round(malformed):
            raise EndTurn(Ending("error", detail="the model sent a malformed tool call twice in a row"))
        if await self._leads_due():
            await self._apply_leads()
        self._check_time()

    def _is_action(self, name: str) -> bool:
        """Whether a call counts against ``[limits] actions``: a writing tool, a command, or an
        MCP tool not configured read-only."""
        if name in tools.ACTIONS:
            return True
        found = self.settings.mcp.server_of(name)
        return found is not None and not found[0].is_read_only(found[1])

    async def _one_call(self, call: ToolCallPart) -> bool:
        """Run one call to its result. True if the call was malformed."""
        t, rec = self.turn, self.rec
        mcp = self.settings.mcp.server_of(call.tool_name) is not None
        try:
            args = call.args_as_dict(raise_if_invalid=True)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a malformed call
            args = None
            problem: str | None = f"arguments are not valid JSON: {exc}"
        else:
            problem = tools.check_args(call.tool_name, args) if not mcp else \
                None if isinstance(args, dict) else "arguments must be a JSON object"
        rec.defer(ev.ToolCall(**rec.e(), call_id=call.tool_call_id, name=call.tool_name,
                              args=args if args is not None else _args_for_log(call)))
        self.budget.tool_calls += 1
        gone = t.mcp.available(call.tool_name) if mcp and t.mcp is not None else None
        if mcp and (t.mcp is None or gone is not None):
            # withdrawn (its server failed or exited): an error result, not a malformed call
            await handlers.mcp_changes(rec, t.mcp)
            await rec.result(call, False, f"Error: {gone or 'no MCP server is running'}.")
            return False
        if problem is not None:
            await rec.result(call, False, f"Error: malformed tool call: {problem}. Send the call again "
                                          "with valid arguments.")
            return True
        assert args is not None
        spec = CallSpec(call_id=call.tool_call_id, name=call.tool_name, args=args)
        try:
            outcome = await self.guarded(self.gate.decide(spec))
        except StopRequested:
            await self.gate.dismiss("the turn was stopped")
            await rec.result(call, False, f"Cancelled: {stopped_by(t.stop_reason)} the turn "
                                          "while this call waited for a decision.")
            raise
        except CoxError as exc:
            await self.gate.dismiss("the policy check failed")
            await rec.result(call, False, f"Error: the policy check failed ({exc.detail}); the call was not run.")
            return False
        if not outcome.allowed:
            text = f"Refused: {outcome.reason}." if outcome.actor not in ("person", "dont_ask") else \
                "Denied by the person."
            await rec.result(call, False, text)
        else:
            await handlers.execute(self.tools, call, args, outcome)
            await self._post_tool_hooks(call, args)
        if outcome.message:
            # An approval's message: a real user message, right after the tool result (a model
            # heeds a user turn more reliably than a note inside a tool result).
            await rec.user_message(outcome.message, f"{call.tool_call_id}-msg", "approval")
        return False

    # ------------------------------------------------------------------ hooks (cox_runner.hooks)
    async def _hooks_start(self) -> None:
        """Load the turn's hooks; on a turn that starts on a message, its UserPromptSubmit hooks."""
        t = self.turn
        try:
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

    async def _post_tool_hooks(self, call: ToolCallPart, args: dict[str, Any]) -> None:
        if call.tool_call_id in self.rec.open or not self.hooks.has("PostToolUse", call.tool_name):
            return
        note = await self.guarded(self.hooks.post_tool(call.tool_call_id, call.tool_name, args,
                                                       self.rec.last_output, self.rec.last_ok))
        if note:
            await self.rec.user_message(note, f"hook-post-{call.tool_call_id}", "lead", note=True)

    async def _stop_hooks(self, text: str) -> None:
        """The model would end the turn: a Stop hook that blocks saves its reason as a Lead (the
        person's Lead mechanism), which :meth:`_continue_for_leads` then applies."""
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

    # ------------------------------------------------------------------ boundaries
    def _leads_waiting(self) -> bool:
        """Is a Lead saved? Known from Redis without asking again: every ``emit`` answers how many
        wait, and a Lead saved since rings the doorbell (or shows in the next renewal)."""
        return bool(self.rec.leads_hint) or self.turn.leads_waiting

    async def _leads_due(self) -> bool:
        """Is a newer instruction waiting: a saved Lead, or an approval's message?"""
        return bool(self.rec.pending_user) or self._leads_waiting()

    async def _boundary(self, unstarted: list[ToolCallPart]) -> bool:
        """A safe boundary: with a newer instruction waiting, skip the calls not started (each gets
        a result saying so), then apply the Leads. True if the next model request should go out."""
        if not await self._leads_due():
            return False
        await self.rec.skip(unstarted, "lead" if self._leads_waiting() else "approval")
        await self._apply_leads()
        return True

    async def _apply_leads(self) -> bool:
        """Take the saved Leads (atomically marked applied, recorded as user messages)."""
        t = self.turn
        t.leads_waiting = False
        self.rec.leads_hint = 0
        try:
            res = await self.deps.store.fns.take_leads(sid=t.sid, token=t.token, owner=self.deps.owner,
                                                       turn_id=t.turn_id)
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        leads = res.get("leads") or []
        for lead in leads if isinstance(leads, list) else []:
            self.rec.pending_user.append((lead["text"], "lead"))
        return bool(self.rec.pending_user)

    async def _continue_for_leads(self) -> bool:
        """Before the turn's final work: close Lead admission, or apply what was saved in time.

        Closing is atomic with the check for pending Leads, so a Lead is either saved before it
        (and applied now: the turn goes on) or refused after it with 409 ``lead_closed``.
        """
        t = self.turn
        if self.rec.pending_user:
            return True
        try:
            res = await self.deps.store.fns.close_leads(sid=t.sid, token=t.token)
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        if res.get("closed"):
            return False
        return await self._apply_leads()

    # ------------------------------------------------------------------ limits
    def _check_time(self) -> None:
        if self.elapsed() >= self.limits.seconds:
            raise EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s"))

    async def _hard(self, name: str, value: float) -> None:
        """End the turn at a hard limit (the calls not started get their result on the way out)."""
        await self.rec.emit(ev.LimitHard(**self.rec.e(), limit=name, value=value))
        raise EndTurn(Ending("hard_budget", detail=f"hard {name} limit reached ({value:g})"))

    async def _warnings(self) -> None:
        """Warn before a hard limit stops the turn: at ``[limits] warn_at`` of it, once per limit
        and turn, a ``limit.warning`` and a system Lead that joins the turn with its next model
        request (a note: unlike a person's Lead it skips none of the calls already asked for)."""
        for w in self.budget.warnings_due(time.monotonic()):
            shown = f"{w.value:g}" if isinstance(w.value, int) else f"{w.value:.4g}"
            await self.rec.emit(ev.LimitWarning(**self.rec.e(), limit=w.limit, value=w.value, of=w.of))
            await self.rec.user_message(
                f"[coxswain] {shown} of {w.of:g} {w.limit.replace('_', ' ')} used in this turn: wrap up, "
                "or say what you need to finish.", f"warn-{w.limit}-{self.turn.turn_id}", "lead", note=True)

    async def _soft_checks(self) -> None:
        """A soft limit set lower than its hard one is a checkpoint: the person is asked whether
        the turn goes on (docs/design.md, soft limits). The don't-ask switch answers yes; no
        means ``canceled``."""
        for due in self.budget.soft_due(time.monotonic()):
            name, shown, soft, hard = due.limit, due.value, due.soft, due.hard
            await self.rec.emit(ev.LimitSoft(**self.rec.e(), limit=name, value=shown))
            if (await self.gate.policy_inputs())[1]:  # the don't-ask switch answers yes
                continue
            spec = CallSpec(call_id=f"limit-{name}-{self.turn.turn_id}", name="continue",
                            args={"limit": name, "value": shown, "soft": soft, "hard": hard})
            out = await self.gate.ask_person(spec, None, None, security=False,
                                             reason=f"the soft {name} limit ({soft:g}) is reached; go on?")
            if out.message:
                await self.rec.user_message(out.message, f"{spec.call_id}-msg", "approval")
            if not out.allowed:
                raise EndTurn(Ending("canceled", detail=f"the person ended the turn at the soft {name} limit"))


def _raw_finish(response: ModelResponse) -> str | None:
    """The finish reason as the provider sent it (pydantic-ai keeps it in provider_details)."""
    details = response.provider_details or {}
    raw = details.get("finish_reason")
    return str(raw) if raw is not None else response.finish_reason


def _args_for_log(call: ToolCallPart) -> Any:
    try:
        return call.args_as_dict(raise_if_invalid=True)
    except Exception:  # noqa: BLE001
        return call.args if isinstance(call.args, str) else str(call.args)


def _first_user_text(messages: list[Any]) -> str | None:
    for m in messages:
        if isinstance(m, ModelRequest):
            for p in m.parts:
                if isinstance(p, UserPromptPart) and isinstance(p.content, str):
                    return p.content
    return None


def _clean_title(text: str) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line.strip().strip("\"'`#*").strip()[:80]
