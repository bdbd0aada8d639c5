"""The judge service: decides ordinary command approvals (docs/design.md, "Policy").

``kind = "rules"`` (default) approves known read-only commands (a real shell parser, see
:mod:`cox_judge.rules`) and leaves MCP tool calls to the person; ``"model"`` asks a model for a structured verdict
(:mod:`cox_judge.model_judge`); ``"none"`` answers that there is no judge, so the person decides.
In every kind the decision is made in code against ``approve_threshold``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from coxswain import rpc, subjects
from coxswain.config import Settings
from coxswain.models import JudgeRequest, JudgeResult
from coxswain.service import Service

from . import rules

if TYPE_CHECKING:
    from .model_judge import ModelJudge


class Judge(Service):
    name = subjects.JUDGE

    def __init__(self, settings: Settings) -> None:
        super().__init__(settings)
        self.model_judge: ModelJudge | None = None
        if settings.judge.kind == "model":
            # pydantic-ai only for a model judge: it is most of a rules judge's start otherwise
            from .model_judge import ModelJudge

            self.model_judge = ModelJudge(settings.judge, settings.model.providers)

    async def start(self) -> None:
        await self.endpoint(rpc.JUDGE_DECIDE, self.decide)

    async def on_stop(self) -> None:
        if self.model_judge is not None:
            await self.model_judge.aclose()

    async def decide(self, req: JudgeRequest) -> JudgeResult:
        cfg = self.settings.judge
        mcp = self.settings.mcp.server_of(req.call.name) is not None
        if req.call.name not in COMMANDS and not mcp:
            return JudgeResult(verdict="refuse", score=0.0, reason="the judge only decides commands", kind=cfg.kind)
        if cfg.kind == "none":
            return JudgeResult(verdict="error", reason="no judge is configured", kind="none")
        if mcp and self.model_judge is None:
            # The rules know programs, not what a server's tool does: a person decides.
            return JudgeResult(verdict="refuse", score=0.0, kind="rules",
                               reason="the rules judge decides commands only; an MCP tool call goes to the person")
        if req.call.name == "write_program" and self.model_judge is None:
            # What input means depends on the program reading it (a shell runs it): a person decides.
            return JudgeResult(verdict="refuse", score=0.0, kind="rules",
                               reason="the rules judge decides commands only; input to a running program goes "
                                      "to the person")
        if self.model_judge is not None:
            result = await self.model_judge.decide(req)
            self.log.info("judge.decided", kind="model", verdict=result.verdict, score=result.score)
        else:
            command = str(req.call.args.get("command", ""))
            v = rules.judge(command)
            score = 1.0 if v.ok else 0.0
            verdict: Literal["allow", "refuse"] = "allow" if score >= cfg.approve_threshold else "refuse"
            result = JudgeResult(verdict=verdict, score=score, reason=v.reason, kind="rules",
                                 answer="allow" if v.ok else "refuse", threshold=cfg.approve_threshold)
        return confined_only(req, result)


COMMANDS = frozenset({"run_command", "start_program", "write_program"})
"""What the judge decides besides MCP calls: a command, a program started, input to a program."""


def confined_only(req: JudgeRequest, result: JudgeResult) -> JudgeResult:
    """The judge allows without asking only what runs confined: in the sandbox, without network.

    Its view is kept (the person sees it); only the verdict changes. What the file system and
    the network let a command reach is what makes "read-only" safe to allow unasked.
    """
    if result.verdict != "allow":
        return result
    if not req.sandboxed and req.call.name not in COMMANDS:
        why = "the MCP server runs outside the sandbox: a person decides"
    elif not req.sandboxed:
        why = "commands run without a sandbox here ([sandbox] mode = \"none\"): a person decides"
    elif req.network:
        why = "the command would run with the network: a person decides"
    else:
        return result
    return result.model_copy(update={"verdict": "refuse", "reason": f"{result.reason}; but {why}"})


def main() -> None:
    from coxswain.service import run

    run(Judge, subjects.JUDGE)
