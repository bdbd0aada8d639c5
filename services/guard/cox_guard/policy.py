"""Guard's policy for one tool call (DESIGN "Policy"), as a pure function of settings + request.

Order: refusals (outside the pin after resolving links, the credential denylist, a read-only
mount) -> security confirms no setting waives (protected paths, credential-looking content, a
command built from tool output) -> standing approvals -> the writes/commands settings.
"""

from __future__ import annotations

import os
from pathlib import Path

from coxswain import safefs
from coxswain.config import Settings
from coxswain.errors import CoxError
from coxswain.models import GuardRequest, GuardResult

from . import secrets

PROTECTED: tuple[str, ...] = (
    ".git", ".github/workflows", ".gitlab-ci.yml", ".circleci", ".ci", ".buildkite", "Jenkinsfile",
    ".travis.yml", "azure-pipelines.yml", ".pre-commit-config.yaml", "scripts", "Makefile", "GNUmakefile",
    ".git-hooks", ".husky",
)
"""Paths whose change could run code outside the turn (hooks, CI, build scripts): always ask."""

NO_WORKSPACE = frozenset({"respond", "plan_write", "plan_step"})


def protected(rel: str, store_dir: str) -> str | None:
    for p in (*PROTECTED, store_dir):
        if rel == p or rel.startswith(p + "/"):
            return p
    return None


def read_only(path: Path) -> bool:
    try:
        st = os.statvfs(path)
    except OSError:
        return False
    return bool(st.f_flag & os.ST_RDONLY)


def check(settings: Settings, req: GuardRequest) -> GuardResult:
    name, args = req.call.name, req.call.args
    if name in NO_WORKSPACE:
        return GuardResult(verdict="allow", actor="setting", reason="no workspace access")
    root = Path(os.path.realpath(req.workspace))
    cfg_root = settings.root
    if root != cfg_root and cfg_root not in root.parents:
        return GuardResult(verdict="refuse", actor="policy", reason="the workspace is not under the configured root")
    if name in ("read_file", "list_dir", "write_file"):
        return _path_call(settings, req, root, name, args)
    if name == "run_command":
        return _command(settings, req, str(args.get("command", "")))
    return GuardResult(verdict="refuse", actor="policy", reason=f"unknown tool {name!r}")


def _path_call(settings: Settings, req: GuardRequest, root: Path, name: str, args: dict[str, object]) -> GuardResult:
    raw = str(args.get("path", "") or ".")
    try:
        rel = safefs.resolve(root, raw)
    except CoxError as exc:
        return GuardResult(verdict="refuse", actor="policy", reason=exc.detail)
    deny = safefs.denied(rel)
    if deny:
        return GuardResult(verdict="refuse", actor="policy", reason=f"{rel} is on the credential denylist ({deny})",
                           path=rel)
    if name != "write_file":
        return GuardResult(verdict="allow", actor="setting", reason="reading inside the workspace", path=rel)
    if not rel:
        return GuardResult(verdict="refuse", actor="policy", reason="cannot write the workspace folder itself")
    if read_only(root):
        return GuardResult(verdict="refuse", actor="policy", reason="the workspace is on a read-only mount", path=rel)
    prot = protected(rel, settings.store_dir)
    if prot:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person", path=rel,
                           reason=f"{rel} is a protected path ({prot}): a security confirm")
    kinds = secrets.find(str(args.get("content", "")))
    if kinds:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person", path=rel,
                           reason=f"the content looks like a credential ({', '.join(kinds)}): a security confirm")
    if f"write:{rel}" in req.standing:
        return GuardResult(verdict="allow", actor="standing", reason="allowed for this session", path=rel)
    if settings.approval.writes == "ask":
        return GuardResult(verdict="ask", actor="setting", route="person", path=rel, reason="writes = ask")
    return GuardResult(verdict="allow", actor="setting", path=rel, reason="writes in the workspace go ahead (kept)")


def _command(settings: Settings, req: GuardRequest, command: str) -> GuardResult:
    if not command.strip():
        return GuardResult(verdict="refuse", actor="policy", reason="empty command")
    tainted = [f for f in req.tainted if len(f) >= 8 and f in command]
    if tainted:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person",
                           reason=f"the command contains text read from tool output ({tainted[0][:60]!r}): "
                                  "a security confirm")
    for prefix in (*settings.approval.allow_commands, *req.standing):
        if prefix and not prefix.startswith("write:") and _starts(command, prefix):
            return GuardResult(verdict="allow", actor="standing", reason=f"standing approval {prefix!r}")
    mode = settings.approval.commands
    if mode == "allow":
        return GuardResult(verdict="allow", actor="setting", reason="commands = allow")
    if mode == "ask" or settings.judge.kind == "none":
        return GuardResult(verdict="ask", actor="setting", route="person",
                           reason="commands = ask" if mode == "ask" else "no judge is configured")
    return GuardResult(verdict="ask", actor="setting", route="judge", reason="commands go to the judge first")


def _starts(command: str, prefix: str) -> bool:
    c = command.strip()
    return c == prefix or c.startswith(prefix + " ")
