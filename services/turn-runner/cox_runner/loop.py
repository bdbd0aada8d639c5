"""The turn loop (DESIGN "A turn"): model request, tool calls, safe boundaries, limits, plan.

One :class:`TurnLoop` runs one turn to its end and returns an :class:`Ending`; the drive
(``drive.py``) records it and starts whatever waits next. There is no response-round cap: the
loop runs until the model answers, an error stops progress, a limit ends it, or Stop/steer.

Safe boundaries are after each model response and after each tool call. At a boundary with a
Lead saved (read from Redis, so a late doorbell never makes a Lead miss one), the in-flight action
has finished; the unstarted calls of the response are skipped (each still gets a result), the
Leads become user messages and the next request goes out. An approval that is pending stays
open while Leads wait (ADR-0067). An approval answered with a message is a newer instruction too:
the message is recorded right after the call's result and the rest of that response is skipped
(reason ``approval``). Before the turn's final work Lead admission closes atomically with the
check for pending Leads: a Lead saved before is applied and the turn goes on.

Whatever ends a turn, every call it opened is closed with a result first (``_close``), and an
approval it left open is dismissed: the transcript never holds a call without its result.

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
import contextlib
import hashlib
import json
import re
import time
from collections.abc import Awaitable, Coroutine
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

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
from coxswain import keys, safefs, textdiff
from coxswain.errors import CoxError, Fenced
from coxswain.models import CallSpec, KeepRequest

from . import cmdversions, gate, tools, transcript
from .errors import LeaseLost, StopRequested
from .turn import STOP_OUTCOME, Turn

if TYPE_CHECKING:
    from .service import Runner

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
OBSERVED_BATCH = 50


@dataclass
class Ending:
    outcome: str
    finish_reason: str | None = None
    detail: str | None = None
    provider_finish_reason: str | None = None


class _EndTurn(Exception):
    def __init__(self, ending: Ending) -> None:
        super().__init__(ending.outcome)
        self.ending = ending


SKIP_FOR_OUTCOME = {"output_limit": "truncated", "hard_budget": "limit", "spend_limit": "limit", "stuck": "limit",
                    "canceled": "canceled", "error": "error"}
"""The ``tool.skipped`` reason for calls a turn never started, by how the turn ended."""


class TurnLoop:
    def __init__(self, runner: Runner, turn: Turn, carried: transcript.Builder | None = None) -> None:
        self.runner = runner
        self.turn = turn
        self.carried = carried
        """The transcript as the previous turn of the same drive left it (None: rebuild from the log)."""
        self.settings = runner.settings
        self.limits = runner.settings.limits
        self.log = runner.log.bind(sid=turn.sid, turn_id=turn.turn_id)
        self.history = transcript.Builder()
        self.plan: dict[str, Any] | None = None
        self.plan_carried = False
        self.tool_calls = 0
        self.actions = 0
        self.tokens = 0
        self.spend = 0.0
        self.waited = 0.0
        """Seconds spent waiting for the person (approvals, soft-limit checkpoints): not work time."""
        self.soft_passed: set[str] = set()
        self.malformed_in_row = 0
        self.repeats: list[str] = []
        self.titled = False
        self._tainted: list[str] = []
        self.pending_user: list[tuple[str, str]] = []
        """User messages recorded but not yet in a model request: (text, via)."""
        self.open: dict[str, ToolCallPart] = {}
        """Calls of the latest response without a result yet; closed on every way out of the turn."""
        self.open_approval: str | None = None
        self._last_output = ""
        self._deferred: list[ev._Event] = []
        """Events recorded with the next ``emit`` (one Redis call instead of two)."""
        self._leads_hint = 0
        self._observed_hint = 0
        """What the last ``emit`` saw waiting: Leads and operator observations."""

    # ------------------------------------------------------------------ recording
    async def emit(self, *events: ev._Event, ops: list[tuple[str, str, str, str]] | None = None) -> None:
        """Record events (and small state writes) fenced by this turn's token, after any deferred."""
        flat: list[str] = []
        for op in ops or []:
            flat.extend(op)
        batch = [*self._deferred, *events]
        self._deferred.clear()
        try:
            res = await self.runner.store.call(
                "cox_emit", self.turn.sid,
                [self.turn.sid, self.turn.token, self.runner.owner, str(len(ops or [])), *flat,
                 *(ev.body(e) for e in batch)],
            )
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        self._leads_hint = int(res.get("leads") or 0)
        self._observed_hint = int(res.get("observed") or 0)

    def defer(self, event: ev._Event) -> None:
        """Record ``event`` together with the next one: it is known now, but nothing waits on it
        being in the log before the next event is (a call's start and its policy decision; the
        last text chunk and the complete response)."""
        self._deferred.append(event)

    def _e(self) -> dict[str, Any]:
        return {"sid": self.turn.sid, "turn_id": self.turn.turn_id}

    def elapsed(self) -> float:
        """Seconds of work so far: wall time minus time spent waiting for the person."""
        return time.monotonic() - self.turn.started - self.waited

    # ------------------------------------------------------------------ control
    async def guarded(self, aw: Coroutine[Any, Any, T] | Awaitable[T]) -> T:
        """Await ``aw`` unless Stop/steer comes first; then cancel it and raise StopRequested."""
        t = self.turn
        if t.stopping:
            if asyncio.iscoroutine(aw):
                aw.close()
            raise StopRequested(t.stop_reason or "stop")
        task: asyncio.Future[T] = asyncio.ensure_future(aw)
        stopper = asyncio.ensure_future(t.stop_event.wait())
        try:
            racing: list[asyncio.Future[Any]] = [task, stopper]
            await asyncio.wait(racing, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            task.cancel()
            stopper.cancel()
            raise
        stopper.cancel()
        if task.done():
            return task.result()
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
        raise StopRequested(t.stop_reason or "stop")

    # ------------------------------------------------------------------ the turn
    async def run(self) -> Ending:
        """Run the turn to its end. Whatever ends it, every call it opened gets a result first."""
        self.log.info("turn.begin", model=self.turn.model)
        try:
            await self._load()
            ending = await self._loop()
        except _EndTurn as end:
            ending = end.ending
        except StopRequested as stop:
            ending = Ending(STOP_OUTCOME.get(stop.reason, "stopped"), detail=f"{stop.reason} requested")
        except (LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # an internal failure still closes the turn's calls
            self.log.error("turn.failed", error=repr(exc), exc_info=exc)
            ending = Ending("error", detail=f"internal error: {exc!r}")
        await self._close(ending)
        return ending

    def handed_on(self) -> transcript.Builder:
        """The transcript with everything this turn recorded, for the drive's next turn."""
        for text, via in self.pending_user:
            self.history.user(text, via)
        self.pending_user.clear()
        return self.history

    async def _close(self, ending: Ending) -> None:
        if self._deferred:
            await self.emit()
        if self.open_approval is not None:
            await gate.dismiss(self, self.open_approval, f"the turn ended ({ending.outcome})")
        if self.open:
            reason = self.turn.skip_reason if ending.outcome == "stopped" else SKIP_FOR_OUTCOME.get(
                ending.outcome, "canceled")
            await self._skip(list(self.open.values()), reason)

    async def _load(self) -> None:
        """The transcript so far: carried from this drive's previous turn (the lease was held from
        that turn to this one, so nobody else wrote to the conversation), else from the log."""
        t = self.turn
        if self.carried is not None:
            self.history = self.carried
            self.history.user(t.text, t.via)
        else:
            # read_events flushes the outbox and reads the log up to the session's seq.
            self.history = transcript.build(await self.runner.read_events(t.sid))
        await self.runner.models.load(t.model)
        info = await self.runner.redis.hgetall(keys.session(t.sid))
        t.info = info
        plan_raw = info.get("plan")
        self.plan = json.loads(plan_raw) if plan_raw else None
        if self.plan and self.plan.get("turn_id") != t.turn_id:
            marks = sorted(set(self.plan.get("marks", [])))
            if len(marks) < len(self.plan["steps"]):
                from_turn = self.plan.get("turn_id") or ""
                self.plan = {**self.plan, "marks": marks, "turn_id": t.turn_id}
                self.plan_carried = True
                await self.emit(ev.PlanCarried(**self._e(), from_turn=from_turn, steps=self.plan["steps"],
                                               marks=marks),
                                ops=[("hset", "", "plan", json.dumps(self.plan, ensure_ascii=False))])
            else:
                self.plan = None
        self.titled = bool(info.get("title_source")) or info.get("auto_title") != "1"

    def instructions(self) -> str:
        text = SYSTEM.format(workspace=self.turn.workspace.name or ".")
        if self.plan:
            marks = set(self.plan.get("marks", []))
            lines = [f"{i}. [{'x' if i in marks else ' '}] {s}" for i, s in enumerate(self.plan["steps"], 1)]
            head = ("The plan so far (carried from an unfinished turn; go on from the next unmarked step, "
                    "or rewrite it with plan_write):" if self.plan_carried else "The plan:")
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
                await self._skip(calls, "truncated")
                if await self._continue_for_leads():
                    continue
                return Ending("output_limit", finish_reason=finish, provider_finish_reason=raw_finish,
                              detail="the response was cut off by the output limit; its tool calls were not run")

            if not self.titled and text.strip():
                await self._title()

            if not calls:
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
        t = self.turn
        for text, via in self.pending_user:
            self.history.user(text, via)
        self.pending_user.clear()
        messages = self.history.request_messages(self.instructions())
        if self.history.synthesized:
            self.log.warning("transcript.unanswered_calls", count=self.history.synthesized)
        model = self.runner.models.get(t.model)
        params = ModelRequestParameters(function_tools=list(tools.TOOLS), allow_text_output=True)
        settings = self.runner.models.settings(t.model)
        remaining = self.limits.seconds - self.elapsed()
        try:
            response = await self.guarded(asyncio.wait_for(self._stream(model, messages, params, settings),
                                                           max(remaining, 0.001)))
        except TimeoutError:
            await self.emit(ev.LimitHard(**self._e(), limit="seconds", value=round(self.elapsed(), 3)))
            raise _EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s "
                                                        "reached while the model was answering")) from None
        except (StopRequested, LeaseLost, asyncio.CancelledError, _EndTurn, CoxError):
            raise
        except Exception as exc:  # any provider failure ends the turn with its reason
            self.log.warning("model.failed", error=repr(exc))
            raise _EndTurn(Ending("error", detail=f"model request failed: {exc}")) from exc

        calls = [p for p in response.parts if isinstance(p, ToolCallPart)]
        text = "".join(p.content for p in response.parts if isinstance(p, TextPart))
        cost = self._cost(response)
        self.spend += cost
        usage: dict[str, Any] = {"input_tokens": response.usage.input_tokens,
                                 "output_tokens": response.usage.output_tokens}
        if cost:
            usage["cost"] = round(cost, 8)
        self.tokens += response.usage.input_tokens + response.usage.output_tokens
        refs = [ev.ToolCallRef(call_id=c.tool_call_id, name=c.tool_name, args=_args_for_log(c)) for c in calls]
        await self.emit(
            ev.AssistantMsg(**self._e(), text=text, finish_reason=response.finish_reason, usage=usage,
                            tool_calls=refs, provider_finish_reason=_raw_finish(response)),
            ops=[("hset", keys.OPEN_CALLS, c.tool_call_id, c.tool_name) for c in calls],
        )
        self.open = {c.tool_call_id: c for c in calls}
        self.history.assistant(text, [r.model_dump() for r in refs], response.finish_reason)
        if self.tokens >= self.limits.tokens:
            await self._hard("tokens", self.tokens)
        if self.limits.spend is not None and self.spend >= self.limits.spend:
            await self.emit(ev.LimitHard(**self._e(), limit="spend", value=round(self.spend, 8)))
            raise _EndTurn(Ending("spend_limit", detail=f"spend limit of ${self.limits.spend:g} reached "
                                                        f"(${self.spend:.6f})"))
        return response

    def _cost(self, response: ModelResponse) -> float:
        """USD this response cost: configured prices, else genai-prices' data, else zero (unknown)."""
        prices = self.runner.models.prices(self.turn.model)
        u = response.usage
        if prices is not None:
            return (u.input_tokens * prices[0] + u.output_tokens * prices[1]) / 1_000_000
        if response.model_name in (None, "", "script"):
            return 0.0
        try:
            return float(response.cost().total_price)
        except Exception:  # noqa: BLE001 - a model genai-prices does not know costs nothing we can count
            return 0.0

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
                        await self.emit(ev.AssistantDelta(**self._e(), text="".join(buf)))
                        buf.clear()
                        last = now
            if buf:
                self.defer(ev.AssistantDelta(**self._e(), text="".join(buf)))
            return stream.get()

    async def _title(self) -> None:
        """Name the session once, serialised with this turn's own model requests."""
        self.titled = True
        t = self.turn
        first = _first_user_text(self.history.messages) or t.text
        req = ModelRequest(parts=[UserPromptPart(content=first)], instructions=TITLE_PROMPT,
                           metadata={"cox_purpose": "title", "cox_vias": ["send"]})
        try:
            resp = await self.guarded(asyncio.wait_for(model_request(self.runner.models.get(t.model), [req]),
                                                       TITLE_TIMEOUT_S))
        except (StopRequested, LeaseLost, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - a failed title never ends the turn
            self.log.info("title.failed", error=repr(exc))
            return
        title = _clean_title("".join(p.content for p in resp.parts if isinstance(p, TextPart)))
        if not title:
            return
        try:
            await self.runner.store.call("cox_auto_title", t.sid,
                                         [t.sid, t.token, self.runner.owner, title, t.turn_id])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc

    # ------------------------------------------------------------------ tools
    async def _tool_round(self, calls: list[ToolCallPart]) -> None:
        malformed = False
        for i, call in enumerate(calls):
            if self.turn.stopping:
                raise StopRequested(self.turn.stop_reason or "stop")
            if self.tool_calls >= self.limits.tool_calls:
                await self._hard("tool_calls", self.tool_calls)
            if call.tool_name in tools.ACTIONS and self.actions >= self.limits.actions:
                await self._hard("actions", self.actions)
            await self._soft_checks()
            if self.pending_user:
                # the person answered a checkpoint with a message: a newer instruction, before this call
                await self._skip(calls[i:], "approval")
                break
            malformed = await self._one_call(call) or malformed
            self._progress(call, self._last_output)
            # Safe boundary after each tool call.
            if i + 1 < len(calls):
                if self.turn.stopping:
                    raise StopRequested(self.turn.stop_reason or "stop")
                if await self._boundary(calls[i + 1:]):
                    break
        if malformed:
            self.malformed_in_row += 1
            if self.malformed_in_row >= 2:
                raise _EndTurn(Ending("error", detail="the model sent a malformed tool call twice in a row"))
        else:
            self.malformed_in_row = 0
        if await self._leads_due():
            await self._apply_leads()
        self._check_time()

    async def _one_call(self, call: ToolCallPart) -> bool:
        """Run one call to its result. True if the call was malformed."""
        t = self.turn
        try:
            args = call.args_as_dict(raise_if_invalid=True)
        except Exception as exc:  # noqa: BLE001 - any parse failure is a malformed call
            args = None
            problem: str | None = f"arguments are not valid JSON: {exc}"
        else:
            problem = tools.check_args(call.tool_name, args)
        self.defer(ev.ToolCall(**self._e(), call_id=call.tool_call_id, name=call.tool_name,
                               args=args if args is not None else _args_for_log(call)))
        self.tool_calls += 1
        if problem is not None:
            await self._result(call, False, f"Error: malformed tool call: {problem}. Send the call again "
                                            "with valid arguments.")
            return True
        assert args is not None
        spec = CallSpec(call_id=call.tool_call_id, name=call.tool_name, args=args)
        try:
            outcome = await self.guarded(gate.decide(self, spec))
        except StopRequested:
            await gate.dismiss(self, self.open_approval, "the turn was stopped")
            await self._result(call, False, f"Cancelled: {_stopped_by(t.stop_reason)} the turn "
                                            "while this call waited for a decision.")
            raise
        except CoxError as exc:
            await gate.dismiss(self, self.open_approval, "the policy check failed")
            await self._result(call, False, f"Error: the policy check failed ({exc.detail}); the call was not run.")
            return False
        if not outcome.allowed:
            text = f"Refused: {outcome.reason}." if outcome.actor not in ("person", "dont_ask") else \
                "Denied by the person."
            await self._result(call, False, text)
        else:
            await self._execute(call, spec, outcome)
        if outcome.message:
            await self._user_message(outcome.message, f"{call.tool_call_id}-msg")
        return False

    async def _user_message(self, text: str, message_id: str) -> None:
        """An approval's message: a real user message, right after the tool result (ADR 0028)."""
        self.pending_user.append((text, "approval"))
        await self.emit(ev.UserMsg(**self._e(), message_id=message_id, text=text, via="approval"))

    async def _execute(self, call: ToolCallPart, spec: CallSpec, outcome: gate.GateOutcome) -> None:
        t = self.turn
        name, args = spec.name, spec.args
        limit = self.settings.runner.output_limit
        root = t.workspace
        try:
            if name == "read_file":
                text = await asyncio.to_thread(tools.read_file, root, outcome.path or args["path"], limit)
                self._taint(text)
                await self._result(call, True, text)
            elif name == "list_dir":
                text = await asyncio.to_thread(tools.list_dir, root, outcome.path or "")
                await self._result(call, True, text)
            elif name == "write_file":
                self.actions += 1
                await self._write(call, outcome.path or args["path"], args["content"])
            elif name == "run_command":
                if not await self._sandbox_ready(call):
                    return
                self.actions += 1
                timeout = float(args.get("timeout_s") or self.settings.runner.command_timeout_s)
                timeout = min(timeout, max(1.0, self.limits.seconds - self.elapsed()))
                snap = await cmdversions.before(self)
                try:
                    res = await self.guarded(tools.run_command(root, args["command"], timeout, limit,
                                                               self.runner.sandbox, bool(args.get("network"))))
                except StopRequested:
                    await self._result(call, False, f"Cancelled: {_stopped_by(t.stop_reason)} the turn; "
                                                    "the command was killed.",
                                       extra=await cmdversions.after(self, call.tool_call_id, snap), first=True)
                    raise
                self._taint(res.output)
                head = f"exit code {res.exit_code}\n" if res.exit_code is not None else ""
                await self._result(call, res.exit_code == 0 and not res.timed_out, head + res.output,
                                   extra=await cmdversions.after(self, call.tool_call_id, snap), first=True)
            elif name == "respond":
                await self.emit(ev.AgentMessage(**self._e(), text=args["text"]))
                await self._result(call, True, "Delivered to the person.")
            elif name == "plan_write":
                await self._plan_write(call, [str(s) for s in args["steps"]])
            elif name == "plan_step":
                await self._plan_step(call, int(args["step"]))
        except (StopRequested, LeaseLost, asyncio.CancelledError, _EndTurn):
            raise
        except CoxError as exc:
            await self._result(call, False, f"Error: {exc.detail}")
        except (OSError, ValueError) as exc:
            await self._result(call, False, f"Error: {exc}")

    async def _sandbox_ready(self, call: ToolCallPart) -> bool:
        """Fail closed: a command whose sandbox cannot start is refused (recorded), never run bare."""
        sandbox = self.runner.sandbox
        await sandbox.ready()
        status = sandbox.status()
        if status.available:
            return True
        t = self.turn
        await self.emit(ev.PolicyDecision(**self._e(), call_id=call.tool_call_id, verdict="refuse", actor="sandbox",
                                          reason=f"the command sandbox is unavailable: {status.reason}",
                                          name=call.tool_name))
        self.log.error("sandbox.refused", sid=t.sid, call_id=call.tool_call_id, reason=status.reason)
        await self._result(call, False, f"Refused: the command sandbox is unavailable ({status.reason}); the "
                                        "command was not run. Commands never run outside the sandbox unless the "
                                        "operator sets [sandbox] mode = \"none\".")
        return False

    async def _write(self, call: ToolCallPart, rel: str, content: str) -> None:
        """Keep the previous content, then write atomically. Never cancelled half-way: neither a
        Lead nor Stop interrupts it (the write is not raced against the stop signal)."""
        t = self.turn
        data = content.encode("utf-8", errors="surrogatepass")
        kept = await self.runner.clients.keep(KeepRequest(
            sid=t.sid, workspace=str(t.workspace), path=rel, token=int(t.token), reason="write",
            turn_id=t.turn_id, call_id=call.tool_call_id,
        ))

        def do_write() -> tuple[int, int]:
            old = safefs.read(t.workspace, rel)
            safefs.write(t.workspace, rel, data)
            return textdiff.counts(old, data)

        await self.runner.ensure_lease(t.sid, t.token)  # a stale runner must not write the file
        added, removed = await asyncio.shield(asyncio.to_thread(do_write))
        await self._result(
            call, True, f"Wrote {rel} ({len(data)} bytes, +{added} -{removed}).",
            extra=[ev.VersionKept(**self._e(), path=kept.path, version_id=kept.version_id, store=kept.store),
                   ev.FileWritten(**self._e(), path=rel, added=added, removed=removed)],
            first=True,
        )

    async def _plan_write(self, call: ToolCallPart, steps: list[str]) -> None:
        self.plan = {"steps": steps, "marks": [], "turn_id": self.turn.turn_id}
        self.plan_carried = False
        await self.emit(ev.PlanWrite(**self._e(), steps=steps),
                        ops=[("hset", "", "plan", json.dumps(self.plan, ensure_ascii=False))])
        await self._result(call, True, f"Plan of {len(steps)} steps recorded.")

    async def _plan_step(self, call: ToolCallPart, step: int) -> None:
        if not self.plan:
            await self._result(call, False, "Error: there is no plan; write one with plan_write first.")
            return
        if not 1 <= step <= len(self.plan["steps"]):
            await self._result(call, False, f"Error: the plan has steps 1 to {len(self.plan['steps'])}.")
            return
        marks = sorted(set(self.plan.get("marks", [])) | {step})
        self.plan = {**self.plan, "marks": marks}
        await self.emit(ev.PlanStep(**self._e(), step=step),
                        ops=[("hset", "", "plan", json.dumps(self.plan, ensure_ascii=False))])
        await self._result(call, True, f"Step {step} marked done.")

    async def _result(self, call: ToolCallPart, ok: bool, output: str, extra: list[ev._Event] | None = None,
                      first: bool = False) -> None:
        """Record a call's result. Operator observations waiting in Redis are folded into it, and
        taken off the list in the same atomic call that records it (so a rebuild agrees)."""
        t = self.turn
        raw: list[str] = []
        if self._observed_hint or t.observed_waiting:
            t.observed_waiting = False
            raw = await self.runner.redis.lrange(keys.session(t.sid) + keys.OBSERVED, 0, OBSERVED_BATCH - 1)
        observed: list[dict[str, Any]] = []
        for item in raw or []:
            with contextlib.suppress(ValueError):
                o = json.loads(item)
                observed.append({"command": str(o.get("command", "")), "output": str(o.get("output", ""))})
        result = ev.ToolResult(**self._e(), call_id=call.tool_call_id, ok=ok, output=output,
                               observed=observed or None)
        evs = [*(extra or []), result] if first else [result, *(extra or [])]
        ops = [("hdel", keys.OPEN_CALLS, call.tool_call_id, "")]
        if raw:
            ops.append(("ltrim", keys.OBSERVED, str(len(raw)), "-1"))
        await self.emit(*evs, ops=ops)
        self.open.pop(call.tool_call_id, None)
        self.history.tool_return(call.tool_call_id, output + transcript.fold(observed), call.tool_name)
        self._last_output = output

    async def _skip(self, calls: list[ToolCallPart], reason: str) -> None:
        if not calls:
            return
        evs = [ev.ToolSkipped(**self._e(), call_id=c.tool_call_id, reason=reason) for c in calls]
        await self.emit(*evs, ops=[("hdel", keys.OPEN_CALLS, c.tool_call_id, "") for c in calls])
        for c in calls:
            self.open.pop(c.tool_call_id, None)
            self.history.tool_return(c.tool_call_id, transcript.skip_text(reason), c.tool_name)

    # ------------------------------------------------------------------ boundaries
    def _leads_waiting(self) -> bool:
        """Is a Lead saved? Known from Redis without asking again: every ``emit`` answers how many
        wait, and a Lead saved since rings the doorbell (or shows in the next renewal)."""
        return bool(self._leads_hint) or self.turn.leads_waiting

    async def _leads_due(self) -> bool:
        """Is a newer instruction waiting: a saved Lead, or an approval's message?"""
        return bool(self.pending_user) or self._leads_waiting()

    async def _boundary(self, unstarted: list[ToolCallPart]) -> bool:
        """A safe boundary: with a newer instruction waiting, skip the calls not started (each gets
        a result saying so), then apply the Leads. True if the next model request should go out."""
        if not await self._leads_due():
            return False
        await self._skip(unstarted, "lead" if self._leads_waiting() else "approval")
        await self._apply_leads()
        return True

    async def _apply_leads(self) -> bool:
        """Take the saved Leads (atomically marked applied, recorded as user messages)."""
        t = self.turn
        t.leads_waiting = False
        self._leads_hint = 0
        try:
            res = await self.runner.store.call("cox_take_leads", t.sid, [t.sid, t.token, self.runner.owner, t.turn_id])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        leads = res.get("leads") or []
        for lead in leads if isinstance(leads, list) else []:
            self.pending_user.append((lead["text"], "lead"))
        return bool(self.pending_user)

    async def _continue_for_leads(self) -> bool:
        """Before the turn's final work: close Lead admission, or apply what was saved in time.

        Closing is atomic with the check for pending Leads, so a Lead is either saved before it
        (and applied now: the turn goes on) or refused after it with 409 ``lead_closed``.
        """
        t = self.turn
        if self.pending_user:
            return True
        try:
            res = await self.runner.store.call("cox_close_leads", t.sid, [t.sid, t.token])
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        if res.get("closed"):
            return False
        return await self._apply_leads()

    # ------------------------------------------------------------------ limits
    def _check_time(self) -> None:
        if self.elapsed() >= self.limits.seconds:
            raise _EndTurn(Ending("hard_budget", detail=f"hard time limit of {self.limits.seconds:g}s"))

    async def _hard(self, name: str, value: float) -> None:
        """End the turn at a hard limit (the calls not started get their result on the way out)."""
        await self.emit(ev.LimitHard(**self._e(), limit=name, value=value))
        raise _EndTurn(Ending("hard_budget", detail=f"hard {name} limit reached ({value:g})"))

    async def _soft_checks(self) -> None:
        """A soft limit set lower than its hard one is a checkpoint: the person is asked whether
        the turn goes on (ADR 0035 §4). The don't-ask switch answers yes; no means ``canceled``."""
        values = {"tool_calls": self.tool_calls, "tokens": self.tokens, "actions": self.actions,
                  "seconds": self.elapsed(), "spend": self.spend}
        for name, value in values.items():
            soft = self.limits.soft_value(name)
            hard = self.limits.hard_value(name)
            if name in self.soft_passed or soft is None or value < soft:
                continue
            if hard is not None and soft >= hard:
                continue
            self.soft_passed.add(name)
            shown = round(value, 6) if isinstance(value, float) else value
            await self.emit(ev.LimitSoft(**self._e(), limit=name, value=shown))
            if (await gate.policy_inputs(self))[1]:  # the don't-ask switch answers yes
                continue
            spec = CallSpec(call_id=f"limit-{name}-{self.turn.turn_id}", name="continue",
                            args={"limit": name, "value": shown, "soft": soft, "hard": hard})
            out = await gate.ask_person(self, spec, None, None, security=False,
                                        reason=f"the soft {name} limit ({soft:g}) is reached; go on?")
            if out.message:
                await self._user_message(out.message, f"{spec.call_id}-msg")
            if not out.allowed:
                raise _EndTurn(Ending("canceled", detail=f"the person ended the turn at the soft {name} limit"))

    def _progress(self, call: ToolCallPart, output: str) -> None:
        """Progress guard: the same call with the same result, again and again, is stuck."""
        sig = hashlib.sha256(f"{call.tool_name}\0{call.args_as_json_str()}\0{output}".encode()).hexdigest()
        self.repeats.append(sig)
        del self.repeats[:-100]
        n = self.limits.stuck_repeats
        if len(self.repeats) >= n and len(set(self.repeats[-n:])) == 1:
            raise _EndTurn(Ending("stuck", detail=f"the same call returned the same result {n} times in a row"))

    # ------------------------------------------------------------------ taint
    def _taint(self, text: str) -> None:
        for frag in re.findall(r"[^\s'\"`]{8,}", text)[:500]:
            self._tainted.append(frag[:200])
        del self._tainted[:-2000]

    def tainted_fragments(self) -> list[str]:
        return list(dict.fromkeys(self._tainted))


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


def _stopped_by(reason: str | None) -> str:
    if reason == "steer":
        return "the person steered"
    if reason == "shutdown":
        return "the runner shut down and cancelled"
    return "the person stopped"
