"""A response's tool calls, in order (docs/design.md, "The turn loop", step 4).

For each call: the limits first, then the argument check (a malformed call gets an error result;
two malformed rounds in a row end ``error``), the gate (guard, the judge, the person), the
handler, the PostToolUse hooks, and an approval's message as a user message right after the
result. After each call, the progress guard and a safe boundary (:class:`~cox_runner.leads.Leads`).
"""

from __future__ import annotations

from typing import Any

from pydantic_ai.messages import ToolCallPart

from coxswain import events as ev
from coxswain.errors import CoxError
from coxswain.models import CallSpec

from . import handlers
from .budget import Budget
from .checkpoints import Checkpoints
from .errors import StopRequested
from .gate import Gate
from .handlers import ToolContext
from .hooks import Hooks
from .leads import Leads
from .recorder import Recorder, args_for_log
from .turn import Ending, EndTurn, Turn, guarded, stopped_by
from .workspace import tools

RECENT_OUTPUT_CHARS = 2000
"""How much of a program's latest output the gate sees with input to it."""


class ToolRound:
    def __init__(self, turn: Turn, rec: Recorder, budget: Budget, gate: Gate, hooks: Hooks,
                 ctx: ToolContext, checks: Checkpoints, leads: Leads) -> None:
        self.turn = turn
        self.rec = rec
        self.budget = budget
        self.settings = ctx.deps.settings
        self.limits = budget.limits
        self.gate = gate
        self.hooks = hooks
        self.tools = ctx
        self.checks = checks
        self.leads = leads
        self._last: tuple[ToolCallPart, bool] | None = None
        """The round's last call, while it runs, and whether a call before it was malformed."""

    async def run(self, calls: list[ToolCallPart]) -> None:
        malformed = False
        b = self.budget
        for i, call in enumerate(calls):
            if self.turn.stopping:
                raise StopRequested(self.turn.stop_reason or "stop")
            hit = b.call_limit(self._is_action(call.tool_name))
            if hit is not None:
                await self.checks.hard(*hit)
            await self.checks.soft()
            if self.rec.pending_user:
                # the person answered a checkpoint with a message: a newer instruction, before this call
                await self.rec.skip(calls[i:], "approval")
                break
            self.rec.pipelined = call.tool_call_id if self._pipelines(call, calls[i + 1:i + 2]) else None
            self._last = (call, malformed) if i + 1 == len(calls) else None
            try:
                malformed = await self._one_call(call) or malformed
            finally:
                self.rec.pipelined = None
                self.rec.takes_leads = self._last = None
            await self.checks.warnings()
            if b.stuck(call.tool_name, call.args_as_json_str(), self.rec.last_output):
                n = self.limits.stuck_repeats
                raise EndTurn(Ending("stuck", detail=f"the same call returned the same result {n} times in a row"))
            # Safe boundary after each tool call.
            if i + 1 < len(calls):
                if self.turn.stopping:
                    raise StopRequested(self.turn.stop_reason or "stop")
                if await self.leads.boundary(calls[i + 1:]):
                    break
        await self.rec.settle()
        if b.malformed_round(malformed):
            raise EndTurn(Ending("error", detail="the model sent a malformed tool call twice in a row"))
        if self.leads.waiting():  # saved after the last result's record (which took those before)
            await self.leads.apply()
        self.checks.check_time()

    def _goes_on(self, output: str) -> bool:
        """Whether the turn goes on after the round's last call returned ``output``, decided
        before its result is recorded (:attr:`Recorder.takes_leads <cox_runner.recorder.Recorder.takes_leads>`):
        no Stop or steer came, the progress guard will not end the turn on this result, nor the
        malformed-round check on this round. Then the Leads saved while the call ran are taken by
        the result's record; otherwise they wait, as a turn that ends leaves them."""
        assert self._last is not None
        call, malformed = self._last
        return not (self.turn.stopping or self.budget.would_fail_round(malformed)
                    or self.budget.would_stick(call.tool_name, call.args_as_json_str, output))

    def _pipelines(self, call: ToolCallPart, after: list[ToolCallPart]) -> bool:
        """Whether a read's result may be recorded while the next call runs (a group commit:
        :meth:`Recorder.result <cox_runner.recorder.Recorder.result>`): only between two reads
        with no hook on either side (a hook is a program: it runs after what it follows is in
        the log). The last read before anything else waits for every record before it, so a
        write, a command, a hook, the next model request or the turn's end never goes ahead of
        a read's record."""
        if not after:
            return False
        name, nxt = call.tool_name, after[0].tool_name
        return (name in tools.READ_ONLY and nxt in tools.READ_ONLY
                and not self.hooks.has("PostToolUse", name) and not self.hooks.has("PreToolUse", nxt))

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
                              args=args if args is not None else args_for_log(call)))
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
        spec = CallSpec(call_id=call.tool_call_id, name=call.tool_name, args=self._gate_args(call.tool_name, args))
        try:
            outcome = await guarded(self.turn, self.gate.decide(spec))
        except StopRequested:
            await self.gate.dismiss("the turn was stopped")
            await rec.result(call, False, f"Cancelled: {stopped_by(t.stop_reason)} the turn "
                                          "while this call waited for a decision.")
            raise
        except CoxError as exc:
            await self.gate.dismiss("the policy check failed")
            await rec.result(call, False, f"Error: the policy check failed ({exc.detail}); the call was not run.")
            return False
        if self._last is not None and not outcome.message and not self.hooks.has("PostToolUse", call.tool_name):
            # The round's last call: the boundary after it may be its result's own record.
            rec.takes_leads = self._goes_on
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

    def _gate_args(self, name: str, args: dict[str, Any]) -> dict[str, Any]:
        """What the gate sees of a call: for input to a program, the program's command and recent
        output beside the input (guard, the judge and the person decide with them)."""
        if name != "write_program":
            return args
        p = self.tools.deps.programs.find(self.turn.sid, str(args.get("program_id", "")))
        if p is None:
            return args
        return {**args, "program": {"name": p.name, "command": p.command, "network": p.network,
                                    "running": p.running},
                "recent_output": p.tail(RECENT_OUTPUT_CHARS)}

    async def _post_tool_hooks(self, call: ToolCallPart, args: dict[str, Any]) -> None:
        if call.tool_call_id in self.rec.open or not self.hooks.has("PostToolUse", call.tool_name):
            return
        note = await guarded(self.turn, self.hooks.post_tool(call.tool_call_id, call.tool_name, args,
                                                             self.rec.last_output, self.rec.last_ok))
        if note:
            await self.rec.user_message(note, f"hook-post-{call.tool_call_id}", "lead", note=True)
