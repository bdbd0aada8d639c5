"""Leads at a turn's safe boundaries (docs/design.md, "The turn loop", steps 5 and 8).

Safe boundaries are after each model response and after each tool call. At a boundary with a
Lead saved (read from Redis, so a late doorbell never makes a Lead miss one) or an approval's
message waiting, the in-flight action has finished; the unstarted calls of the response are
skipped (each still gets a result), the Leads become user messages and the next request goes
out. Before the turn's final work Lead admission closes atomically with the check for pending
Leads: a Lead saved before is applied and the turn goes on; one after is refused ``lead_closed``.
"""

from __future__ import annotations

from pydantic_ai.messages import ToolCallPart

from coxswain.errors import Fenced

from .deps import Deps
from .errors import LeaseLost
from .recorder import Recorder
from .turn import Turn


class Leads:
    def __init__(self, deps: Deps, turn: Turn, rec: Recorder) -> None:
        self.deps = deps
        self.turn = turn
        self.rec = rec

    def waiting(self) -> bool:
        """Is a Lead saved? Known from Redis without asking again: every ``emit`` answers how many
        wait, and a Lead saved since rings the doorbell (or shows in the next renewal)."""
        return bool(self.rec.leads_hint) or self.turn.leads_waiting

    async def due(self) -> bool:
        """Is a newer instruction waiting: a saved Lead, or an approval's message?"""
        return bool(self.rec.pending_user) or self.waiting()

    async def boundary(self, unstarted: list[ToolCallPart]) -> bool:
        """A safe boundary: with a newer instruction waiting, skip the calls not started (each gets
        a result saying so), then apply the Leads. True if the next model request should go out."""
        if not await self.due():
            return False
        # The skips go with the record that takes the Leads: one call and one publish for the
        # boundary, the Leads in the log with it.
        await self.rec.skip(unstarted, "lead" if self.waiting() else "approval", defer=True)
        await self.apply()
        return True

    async def apply(self) -> bool:
        """Take the saved Leads (atomically marked applied, recorded as user messages), with
        whatever waits to be recorded (:meth:`Recorder.take_leads <cox_runner.recorder.Recorder.take_leads>`)."""
        await self.rec.take_leads()
        return bool(self.rec.pending_user)

    async def close_or_apply(self) -> bool:
        """Before the turn's final work: close Lead admission, or apply what was saved in time.

        Closing is atomic with the check for pending Leads, so a Lead is either saved before it
        (and applied now: the turn goes on) or refused after it with 409 ``lead_closed``.
        """
        t = self.turn
        if self.rec.pending_user:
            return True
        if self.rec.closing:
            if not self.waiting():  # the turn's end records the response and closes (or not)
                return False
            await self.rec.emit()  # a Lead rang meanwhile: record the response now, its close fails
        if self.rec.leads_closed:  # closed by the final response's own record, nothing waiting then
            return False
        try:
            res = await self.deps.store.fns.close_leads(sid=t.sid, token=t.token)
        except Fenced as exc:
            raise LeaseLost(str(exc)) from exc
        if res.get("closed"):
            return False
        return await self.apply()
