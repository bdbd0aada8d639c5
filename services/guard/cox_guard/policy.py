"""Guard's policy for one tool call (docs/design.md, "Policy"), as a function of settings + request.

Order, first match wins:

1. Refused outright (no setting, standing approval or person changes it): a path outside the
   workspace pin after resolving every link, the credential denylist (for a command: a word that
   names a denylisted path), a write to a read-only mount, an ``edit_file`` whose ``old`` text
   does not apply to the file as it is (nothing would be written; the reason says why), a write
   (or a command's redirection) to the workspace's hooks file ``<store_dir>/hooks.json``.
2. Security confirms, always the person's (``security=True``; the don't-ask switch and standing
   approvals do not answer them): a protected path (``.git/`` at any depth, the store folder, CI
   definitions, ``scripts/``, ``Makefile`` ...) written by ``write_file``/``edit_file`` or by a command's
   redirection, content that looks like a credential (detect-secrets), a command built from tool
   output (taint, see :mod:`cox_guard.taint`), a command that asks for the network (its
   sandbox has none) unless config or a standing ``network`` approval grants it; the judge is
   asked for its view of a network confirm, which the person sees.
3. Standing approvals: config ``allow_commands`` prefixes and a person's "always this session"
   (a command prefix, or ``write:<path>``).
4. The settings: ``writes = allow|ask``; ``commands = allow|ask|judge`` (judge kind ``none``
   sends the call to the person).

An attachment's content (``attachment``, not a tool: the runner asks before a turn gives a
person's file to the model) that looks like a credential is a security confirm, as a write of it
would be.

An MCP server's tool (``<server>__<tool>``, ``[[mcp.servers]]``): a tool not enabled is refused;
taint in its arguments is a security confirm; a tool configured read-only is then allowed; any
other is an action decided like a command: a standing ``mcp:<server>__<tool>``, then ``commands``.

A write's decision carries a preview of what it would change, computed here from the current
file (for ``edit_file``: with the same edit function the runner writes with), so the approval and
the Changes view can show it. ``find_files`` and ``search_text`` read like ``read_file``: their
``path`` (the workspace when absent) is pinned and checked against the denylist, then allowed.
"""

from __future__ import annotations

import os
from pathlib import Path, PurePosixPath

from coxswain import readpolicy, safefs, shell, textdiff, textedit
from coxswain.config import McpServerConfig, Settings
from coxswain.errors import CoxError
from coxswain.models import ATTACHMENT_CALL, STANDING_NETWORK, GuardRequest, GuardResult

from . import secrets, taint

PROTECTED_ROOT: tuple[str, ...] = (
    ".github/workflows", ".github/actions", ".gitlab-ci.yml", ".gitlab", ".circleci", ".ci", ".buildkite",
    "Jenkinsfile", ".travis.yml", "azure-pipelines.yml", ".drone.yml", "bitbucket-pipelines.yml",
    ".pre-commit-config.yaml", "scripts", "Makefile", "GNUmakefile", "makefile",
)
"""Paths (from the workspace root) whose change could run code outside the turn: CI, build scripts."""
PROTECTED_ANYWHERE: tuple[str, ...] = (".git", ".git-hooks", ".husky")
"""Folder names protected at any depth: a nested repository's hooks run as well as the top one's."""

WRITES = frozenset({"write_file", "edit_file"})


HOOKS_REFUSED = ("{rel} holds the workspace's hooks, which run without asking anyone: only a person "
                 "edits it, outside a turn")


def hooks_file(store_dir: str) -> str:
    """The workspace's hooks file (cox_runner.hooks): refused to every tool call, not a confirm."""
    return f"{store_dir}/hooks.json"


def protected(rel: str, store_dir: str) -> str | None:
    for p in (*PROTECTED_ROOT, store_dir):
        if rel == p or rel.startswith(p + "/"):
            return p
    for part in PurePosixPath(rel).parts:
        if part in PROTECTED_ANYWHERE:
            return part
    return None


def read_only(root: Path, rel: str) -> bool:
    """Whether the file system that would hold ``rel`` is mounted read-only.

    The nearest existing folder on the way to the target decides: a read-only mount may sit
    anywhere under the workspace, not only at its root.
    """
    path = root / rel if rel else root
    while True:
        try:
            st = os.statvfs(path)
            return bool(st.f_flag & os.ST_RDONLY)
        except FileNotFoundError:
            if path == root or path.parent == path:
                return False
            path = path.parent
        except OSError:
            return False


def check(settings: Settings, req: GuardRequest) -> GuardResult:
    name, args = req.call.name, req.call.args
    # Calls that change nothing (respond, the plan tools, reads, a program read or stopped): the
    # one function the runner also decides them with, without asking guard.
    decided = readpolicy.decide(settings.root, req.workspace, name, args)
    if decided is not None:
        return decided
    if name == ATTACHMENT_CALL:
        return attachment(str(args.get("name", "")), str(args.get("content", "")))
    root = safefs.real_under(settings.root, req.workspace)
    if root is None:
        return GuardResult(verdict="refuse", actor="policy", reason=readpolicy.OUTSIDE_ROOT)
    if name in WRITES:
        return _write(settings, req, root, name, args)
    if name in ("run_command", "start_program"):
        return _command(settings, req, root, str(args.get("command", "")))
    if name == "write_program":
        return _program_input(settings, req, root, str(args.get("text", "")))
    mcp = settings.mcp.server_of(name)
    if mcp is not None:
        return _mcp(settings, req, root, mcp[0], mcp[1])
    return GuardResult(verdict="refuse", actor="policy", reason=f"unknown tool {name!r}")


def attachment(name: str, content: str) -> GuardResult:
    """A person's attachment, before a turn gives it to the model: content that looks like a
    credential asks the person, as a write of it would (a security confirm)."""
    kinds = secrets.find(content)
    if kinds:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person",
                           reason=f"the attachment {name} looks like it holds a credential ({', '.join(kinds)}): "
                                  "a security confirm before the model gets it")
    return GuardResult(verdict="allow", actor="policy", reason="no credential in the attachment")


def _mcp(settings: Settings, req: GuardRequest, root: Path, server: McpServerConfig, tool: str) -> GuardResult:
    """An MCP server's tool (``<server>__<tool>``): taint (an argument built from tool output) is a
    security confirm; then read-only tools go ahead; any other call is an action decided like a
    command: a standing "always" for the tool, then ``[approval] commands``."""
    name = req.call.name
    if not server.offers(tool):
        return GuardResult(verdict="refuse", actor="policy",
                           reason=f"{tool!r} is not among the tools enabled for the MCP server {server.name!r}")
    # Taint first, read-only or not (as for a read-only command): what a server is sent can
    # leave the machine, so an argument built from tool output is a person's call.
    tainted = taint.find_in_args(req.call.args, req.tainted, req.trusted, root)
    if tainted:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person",
                           reason=f"the MCP call's arguments contain text read from tool output ({tainted[:80]!r}): "
                                  "a security confirm")
    if server.is_read_only(tool):
        return GuardResult(verdict="allow", actor="setting", reason=f"{name} is configured read-only")
    if f"mcp:{name}" in req.standing:
        return GuardResult(verdict="allow", actor="standing", reason="allowed for this session")
    mode = settings.approval.commands
    if mode == "allow":
        return GuardResult(verdict="allow", actor="setting", reason="commands = allow (MCP calls are actions)")
    if mode == "ask":
        return GuardResult(verdict="ask", actor="setting", route="person", reason="commands = ask (an MCP action)")
    if settings.judge.kind == "none":
        return GuardResult(verdict="ask", actor="setting", route="person", reason="no judge is configured")
    return GuardResult(verdict="ask", actor="setting", route="judge", reason="MCP actions go to the judge first")


def _write(settings: Settings, req: GuardRequest, root: Path, name: str, args: dict[str, object]) -> GuardResult:
    rel = readpolicy.pinned(root, args)
    if isinstance(rel, GuardResult):
        return rel
    if not rel:
        return GuardResult(verdict="refuse", actor="policy", reason="cannot write the workspace folder itself")
    if rel == hooks_file(settings.store_dir):
        return GuardResult(verdict="refuse", actor="policy", path=rel, reason=HOOKS_REFUSED.format(rel=rel))
    if read_only(root, rel):
        return GuardResult(verdict="refuse", actor="policy", reason=f"{rel} is on a read-only mount", path=rel)
    try:
        current = safefs.read(root, rel, max_bytes=max(textdiff.MAX_DIFF_INPUT, textedit.MAX_EDIT_BYTES) + 1)
    except CoxError as exc:
        return GuardResult(verdict="refuse", actor="policy", reason=exc.detail, path=rel)
    if name == "edit_file":
        count = args.get("count")
        edit = textedit.edit_bytes(current, str(args.get("old", "")), str(args.get("new", "")),
                                   count if isinstance(count, int) and not isinstance(count, bool) else None, rel)
        if edit.content is None:
            return GuardResult(verdict="refuse", actor="policy", path=rel,
                               reason=f"the edit does not apply, nothing would be written: {edit.error}")
        new_bytes = edit.content.encode("utf-8", errors="surrogatepass")
        content = str(args.get("new", ""))  # what is checked for credentials: the text the edit adds
    else:
        content = str(args.get("content", ""))
        new_bytes = content.encode("utf-8", errors="surrogatepass")
    preview = textdiff.preview(current, new_bytes, rel)

    def result(**kw: object) -> GuardResult:
        return GuardResult(path=rel, preview=preview, **kw)

    prot = protected(rel, settings.store_dir)
    if prot:
        return result(verdict="ask", actor="policy", security=True, route="person",
                      reason=f"{rel} is a protected path ({prot}): a security confirm")
    kinds = secrets.find(content)
    if kinds:
        return result(verdict="ask", actor="policy", security=True, route="person",
                      reason=f"the content looks like a credential ({', '.join(kinds)}): a security confirm")
    if f"write:{rel}" in req.standing:
        return result(verdict="allow", actor="standing", reason="allowed for this session")
    if settings.approval.writes == "ask":
        return result(verdict="ask", actor="setting", route="person", reason="writes = ask")
    return result(verdict="allow", actor="setting", reason="writes in the workspace go ahead (kept)")


def _denied_word(command: str) -> str | None:
    for word in shell.words(command):
        if word.startswith("-") and "=" not in word:
            continue
        path = word.split("=", 1)[1] if word.startswith("-") else word
        hit = safefs.denied(path.lstrip("~"))
        if hit:
            return f"{word} ({hit})"
    return None


def _program_input(settings: Settings, req: GuardRequest, root: Path, text: str) -> GuardResult:
    """Input to a running program (``write_program``): its own confirm, decided like a command
    (a shell or a REPL runs what it is sent): a denylisted path in it is refused, text read from
    tool output in it is a security confirm; then a standing ``input:<program_id>`` ("always",
    for that program), then ``[approval] commands`` (the judge and the person see the program's
    command and recent output, which the runner adds to the call)."""
    deny = _denied_word(text)
    if deny:
        return GuardResult(verdict="refuse", actor="policy",
                           reason=f"the input names a path on the credential denylist: {deny}")
    tainted = taint.find(text, req.tainted, req.trusted, root)
    if tainted:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person",
                           reason=f"the input contains text read from tool output ({tainted[:80]!r}): "
                                  "a security confirm")
    if f"input:{req.call.args.get('program_id')}" in req.standing:
        return GuardResult(verdict="allow", actor="standing", reason="input to this program is allowed for the session")
    mode = settings.approval.commands
    if mode == "allow":
        return GuardResult(verdict="allow", actor="setting", reason="commands = allow (input to a program)")
    if mode == "ask":
        return GuardResult(verdict="ask", actor="setting", route="person", reason="commands = ask (input to a program)")
    if settings.judge.kind == "none":
        return GuardResult(verdict="ask", actor="setting", route="person", reason="no judge is configured")
    return GuardResult(verdict="ask", actor="setting", route="judge", reason="input to a program goes to the judge first")


def _command(settings: Settings, req: GuardRequest, root: Path, command: str) -> GuardResult:
    if not command.strip():
        return GuardResult(verdict="refuse", actor="policy", reason="empty command")
    deny = _denied_word(command)
    if deny:
        return GuardResult(verdict="refuse", actor="policy",
                           reason=f"the command names a path on the credential denylist: {deny}")
    tainted = taint.find(command, req.tainted, req.trusted, root)
    if tainted:
        return GuardResult(verdict="ask", actor="policy", security=True, route="person",
                           reason=f"the command contains text read from tool output ({tainted[:80]!r}): "
                                  "a security confirm")
    parsed = shell.parse(command)
    for target in parsed.redirect_targets:
        try:
            rel = safefs.resolve(root, target)
        except CoxError:
            continue
        if rel == hooks_file(settings.store_dir):
            return GuardResult(verdict="refuse", actor="policy", path=rel, reason=HOOKS_REFUSED.format(rel=rel))
        prot = protected(rel, settings.store_dir)
        if prot:
            return GuardResult(verdict="ask", actor="policy", security=True, route="person",
                               reason=f"the command writes {rel}, a protected path ({prot}): a security confirm")
    if req.call.args.get("network") is True and not settings.sandbox.network and STANDING_NETWORK not in req.standing:
        return GuardResult(verdict="ask", actor="policy", security=True, route="judge",
                           reason="the command asks for the network (its sandbox has none): a security confirm")
    standing = [p for p in (*settings.approval.allow_commands, *req.standing)
                if p and not p.startswith(("write:", "mcp:", "input:")) and p != STANDING_NETWORK]
    prefix = shell.covered(parsed, standing)
    if prefix is not None:
        return GuardResult(verdict="allow", actor="standing", reason=f"standing approval {prefix!r}")
    mode = settings.approval.commands
    if mode == "allow":
        return GuardResult(verdict="allow", actor="setting", reason="commands = allow")
    if mode == "ask":
        return GuardResult(verdict="ask", actor="setting", route="person", reason="commands = ask")
    if settings.judge.kind == "none":
        return GuardResult(verdict="ask", actor="setting", route="person", reason="no judge is configured")
    return GuardResult(verdict="ask", actor="setting", route="judge", reason="commands go to the judge first")
