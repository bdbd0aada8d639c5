"""The policy of a call that changes nothing: decided by one function, wherever the call is made.

Guard decides every tool call (docs/design.md, "Policy"). For the calls here the decision needs
nothing but the settings' root, the workspace and the call's path: ``respond`` and the plan tools
touch no file; a program's output read or the program stopped runs nothing new; a read
(``read_file``, ``list_dir``, ``find_files``, ``search_text``) is allowed inside the pin (every
link resolved) unless its path is on the credential denylist. Guard's policy asks this module
first, and the runner asks it itself instead of sending the call to guard: the same function on
the same settings, without a NATS round trip through guard's process for every read (reads are
most of an agent's calls). A call this module does not decide (``None``) goes to guard: every
write, command, program input, MCP call and attachment.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from . import safefs
from .errors import CoxError
from .models import GuardResult

NO_WORKSPACE = frozenset({"respond", "plan_write", "plan_step"})
"""Calls that touch no file: always allowed."""
READS = frozenset({"read_file", "list_dir", "find_files", "search_text"})
"""Calls that read the workspace: their ``path`` (the workspace when absent) is pinned and checked
against the denylist."""
PROGRAM_CONTROL = frozenset({"read_program", "stop_program"})
"""A program's output read, or the program stopped: nothing new runs."""
DECIDED_HERE = NO_WORKSPACE | READS | PROGRAM_CONTROL
"""Every call :func:`decide` answers; any other goes to guard."""

OUTSIDE_ROOT = "the workspace is not under the configured root"


def decide(root: Path | str, workspace: str, name: str, args: Mapping[str, object]) -> GuardResult | None:
    """Guard's decision for a call that changes nothing, or None for any other call."""
    if name in NO_WORKSPACE:
        return GuardResult(verdict="allow", actor="setting", reason="no workspace access")
    if name not in DECIDED_HERE:
        return None
    real = safefs.real_under(root, workspace)
    if real is None:
        return GuardResult(verdict="refuse", actor="policy", reason=OUTSIDE_ROOT)
    if name in PROGRAM_CONTROL:
        return GuardResult(verdict="allow", actor="setting", reason="a program of this session (read or stop)")
    rel = pinned(real, args)
    if isinstance(rel, GuardResult):
        return rel
    return GuardResult(verdict="allow", actor="setting", reason="reading inside the workspace", path=rel)


def pinned(root: Path, args: Mapping[str, object]) -> str | GuardResult:
    """A call's ``path`` (``.`` when absent) relative to the workspace's real path, every link
    resolved; or the refusal when it leaves the workspace or is on the credential denylist."""
    raw = str(args.get("path", "") or ".")
    try:
        rel = safefs.resolve(root, raw)
    except CoxError as exc:
        return GuardResult(verdict="refuse", actor="policy", reason=exc.detail)
    deny = safefs.denied(rel)
    if deny:
        return GuardResult(verdict="refuse", actor="policy", reason=f"{rel} is on the credential denylist ({deny})",
                           path=rel)
    return rel
