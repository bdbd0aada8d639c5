"""The judge service: decides ordinary command approvals (DESIGN "Policy").

``kind = "rules"`` (default) approves known read-only commands; ``"none"`` answers that there is
no judge (the person decides). The decision is made in code against ``approve_threshold``.
"""

from __future__ import annotations

from typing import Literal

from coxswain import subjects
from coxswain.models import JudgeRequest, JudgeResult
from coxswain.service import Service

from . import rules


class Judge(Service):
    name = subjects.JUDGE

    async def start(self) -> None:
        await self.add_endpoint("decide", JudgeRequest, self.decide)

    async def decide(self, req: JudgeRequest) -> JudgeResult:
        cfg = self.settings.judge
        if req.call.name != "run_command":
            return JudgeResult(verdict="refuse", score=0.0, reason="the judge only decides commands", kind=cfg.kind)
        if cfg.kind == "none":
            return JudgeResult(verdict="error", reason="no judge is configured", kind="none")
        command = str(req.call.args.get("command", ""))
        v = rules.judge(command)
        score = 1.0 if v.ok else 0.0
        verdict: Literal["allow", "refuse"] = "allow" if score >= cfg.approve_threshold else "refuse"
        return JudgeResult(verdict=verdict, score=score, reason=v.reason, kind="rules")


def main() -> None:
    from coxswain.service import run

    run(Judge, subjects.JUDGE)
