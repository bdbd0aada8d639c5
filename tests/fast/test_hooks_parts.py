"""Hooks without servers: reading a hooks.json, matching tool names, parsing a hook's answer
(the Claude Code rules, failing closed), running one in the command sandbox, and guard refusing
the hooks file to every tool call."""

from __future__ import annotations

import asyncio
import json
import shutil
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from cox_guard.policy import check
from cox_runner import hooks
from cox_runner.hooks import Raw, parse_answer
from cox_runner.workspace.sandbox import Sandbox
from coxswain import hookspec
from coxswain.config import HooksConfig, SandboxConfig, Settings
from coxswain.models import CallSpec, GuardRequest


def test_a_claude_code_hooks_file_parses_and_matches_tool_names() -> None:
    spec = hookspec.parse(json.dumps({
        "description": "other keys of a settings file are ignored",
        "hooks": {
            "PreToolUse": [{"matcher": "run_command|write_file",
                            "hooks": [{"type": "command", "command": "check.sh", "timeout": 5}]},
                           {"matcher": "*", "hooks": [{"type": "command", "command": "all.sh"}]},
                           {"matcher": "git__.*", "hooks": [{"type": "command", "command": "mcp.sh"}]}],
            "Stop": [{"hooks": [{"type": "command", "command": "stop.sh"}]}],
        },
    }), "test")
    pre = spec.of("PreToolUse")
    assert pre[0].hooks[0].timeout == 5 and pre[1].hooks[0].timeout is None
    assert pre[0].matches("run_command") and pre[0].matches("write_file")
    assert not pre[0].matches("read_file") and not pre[0].matches("run_command_x"), "the whole name must match"
    assert pre[1].matches("read_file") and pre[1].matches("git__log")
    assert pre[2].matches("git__log") and not pre[2].matches("run_command")
    assert spec.of("Stop")[0].matches(None) and spec.of("PostToolUse") == []
    assert not spec.empty() and hookspec.HooksSpec().empty()


@pytest.mark.parametrize(("raw", "says"), [
    (b"{not json", "is not JSON"),
    (b"[1, 2]", "JSON object"),
    (json.dumps({"hooks": {"PreToolUse": [{"matcher": "(", "hooks": []}]}}), "not a regular expression"),
    (json.dumps({"hooks": {"BeforeTool": []}}), "BeforeTool"),
    (json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "prompt", "command": "x"}]}]}}), "type"),
    (json.dumps({"hooks": {"Stop": [{"hooks": [{"type": "command", "command": ""}]}]}}), "command"),
    (json.dumps({"hooks": {"Stop": [{"hooks": [{"command": "x", "timeout": -1}]}]}}), "timeout"),
    (b" " * (hookspec.MAX_FILE_BYTES + 1), "larger than"),
])
def test_a_bad_hooks_file_is_refused_saying_where_and_why(raw: Any, says: str) -> None:
    with pytest.raises(hookspec.BadHooks) as err:
        hookspec.parse(raw, "the workspace's .coxswain/hooks.json")
    assert "the workspace's .coxswain/hooks.json" in str(err.value) and says in str(err.value), str(err.value)


def test_config_hooks_inline_and_defaults() -> None:
    cfg = HooksConfig.model_validate({"inline": {"PreToolUse": [
        {"matcher": "run_command", "hooks": [{"type": "command", "command": "true"}]}]}})
    assert cfg.enabled and cfg.workspace and cfg.timeout_s == 30 and cfg.max_stop_continues == 3
    assert cfg.inline["PreToolUse"][0].hooks[0].command == "true"
    with pytest.raises(ValueError):
        HooksConfig.model_validate({"inline": {"Nope": []}})


def out(obj: Any, code: int = 0, err: bytes = b"") -> Raw:
    return Raw(code, obj if isinstance(obj, bytes) else json.dumps(obj).encode(), err)


def test_pre_tool_use_answers() -> None:
    def pre(raw: Raw) -> tuple[str, str, bool]:
        a = parse_answer("PreToolUse", raw, 30)
        return a.decision, a.reason, a.failed

    hso = {"hookEventName": "PreToolUse", "permissionDecision": "deny", "permissionDecisionReason": "no rm"}
    assert pre(out({"hookSpecificOutput": hso})) == ("deny", "no rm", False)
    assert pre(out({"hookSpecificOutput": {**hso, "permissionDecision": "ask"}})) == ("ask", "no rm", False)
    assert pre(out({"hookSpecificOutput": {**hso, "permissionDecision": "allow"}})) == ("allow", "no rm", False)
    assert pre(out({"decision": "approve", "reason": "fine"})) == ("allow", "fine", False)
    assert pre(out({"decision": "block", "reason": "legacy"})) == ("deny", "legacy", False)
    assert pre(out({"continue": False, "stopReason": "halt"})) == ("deny", "halt", False)
    assert pre(out(b"")) == ("none", "", False)
    assert pre(out({"suppressOutput": True})) == ("none", "", False)
    assert pre(out(b"", code=2, err=b"rm is not allowed\n")) == ("deny", "rm is not allowed", False)
    # fail closed: everything else is a failure (the caller turns it into a deny)
    for raw in (out(b"", code=1, err=b"boom"), out(b"hello there"), out([1]), out({"decision": "maybe"}),
                out({"hookSpecificOutput": {"permissionDecision": "yes"}}), out({"hookSpecificOutput": "x"}),
                out({"reason": 5}), Raw(None, b"", b"", timed_out=True), Raw(None, b"", b"", error="no sandbox")):
        d, reason, failed = pre(raw)
        assert d == "error" and failed and reason, raw
    assert "code 1: boom" in pre(out(b"", code=1, err=b"boom"))[1]
    assert "timed out after 30s" in pre(Raw(None, b"", b"", timed_out=True))[1]


def test_other_events_answers() -> None:
    a = parse_answer("Stop", out({"decision": "block", "reason": "tests fail"}), 5)
    assert (a.decision, a.reason) == ("block", "tests fail")
    assert parse_answer("Stop", out({"decision": "block"}), 5).failed, "a Stop block needs a reason"
    assert parse_answer("Stop", out(b"", code=2, err=b"go on"), 5).decision == "block"
    assert parse_answer("PostToolUse", out({"decision": "approve"}), 5).failed
    post = parse_answer("PostToolUse", out({"hookSpecificOutput": {"additionalContext": "lint: ok"}}), 5)
    assert (post.decision, post.context) == ("none", "lint: ok")
    plain = parse_answer("UserPromptSubmit", out(b"today is Monday\n"), 5)
    assert (plain.decision, plain.context, plain.failed) == ("none", "today is Monday", False)
    assert parse_answer("UserPromptSubmit", out(b"[1]"), 5).failed, "JSON that is not an object is not context"


@pytest.mark.skipif(shutil.which("bwrap") is None, reason="bubblewrap is not installed")
def test_a_hook_runs_in_the_sandbox_with_its_payload_and_is_killed_past_its_timeout(tmp_path: Path) -> None:
    sandbox = Sandbox(SandboxConfig(), ".coxswain")
    if not asyncio.run(sandbox.probe()).available:
        pytest.skip(f"bubblewrap cannot make its namespaces here: {sandbox.status().reason}")
    deps: Any = SimpleNamespace(sandbox=sandbox)
    ws = tmp_path / "ws"
    ws.mkdir()
    script = ("import json, os, sys; p = json.load(sys.stdin); "
              "print(json.dumps({'reason': p['tool_name'] + ' ' + os.environ['CLAUDE_PROJECT_DIR'], "
              "'home': os.path.exists(" + repr(str(tmp_path)) + " + '/outside')}))")
    (tmp_path / "outside").write_text("not for hooks")
    raw = asyncio.run(hooks.run_hook(deps, ws, f"python3 -c {json.dumps(script)}",
                                     json.dumps({"tool_name": "run_command"}).encode(), 20))
    assert raw.code == 0, raw
    said = json.loads(raw.stdout)
    assert said == {"reason": f"run_command {ws}", "home": False}, "the hook sees its workspace, nothing outside"
    t0 = time.monotonic()
    slow = asyncio.run(hooks.run_hook(deps, ws, "sleep 30", b"{}", 0.5))
    assert slow.timed_out and time.monotonic() - t0 < 10, "killed at its timeout"


def test_guard_refuses_the_hooks_file_to_writes_and_redirections(tmp_path: Path) -> None:
    root = tmp_path / "root"
    ws = root / "ws"
    (ws / ".coxswain").mkdir(parents=True)
    settings = Settings(root=root)

    def guard(name: str, **args: Any) -> Any:
        return check(settings, GuardRequest(sid="s", workspace=str(ws), call=CallSpec(call_id="c", name=name,
                                                                                          args=args)))

    for call in (guard("write_file", path=".coxswain/hooks.json", content="{}"),
                 guard("write_file", path="./sub/../.coxswain/hooks.json", content="{}"),
                 guard("run_command", command="echo '{}' > .coxswain/hooks.json")):
        assert call.verdict == "refuse" and "hooks" in call.reason, call
    other = guard("write_file", path=".coxswain/notes.txt", content="x")
    assert other.verdict == "ask" and other.security, "the rest of the store folder stays a security confirm"


def test_cox_chat_shows_a_hook_decision_as_a_line_and_on_its_call() -> None:
    from cox.chat_state import ChatModel

    m = ChatModel("s_1")
    m.apply({"type": "tool.call", "seq": 1, "sid": "s_1", "turn_id": "t", "call_id": "c1", "name": "run_command",
             "args": {"command": "rm -rf x"}})
    m.apply({"type": "hook.decision", "seq": 2, "sid": "s_1", "turn_id": "t", "hook_event": "PreToolUse",
             "matcher": "run_command", "command": "python3 .coxswain/pre.py", "decision": "deny",
             "reason": "no rm", "duration_ms": 12, "failed": False, "source": "workspace",
             "tool_call_id": "c1", "tool": "run_command"})
    line = m.items[-1]
    assert line.kind == "note" and line.cls == "bad"
    assert line.text == ("Hook PreToolUse on run_command: deny — no rm "
                         "(workspace hook `python3 .coxswain/pre.py`, 12 ms)")
    assert m.tools["c1"].policy == ["deny by a hook: no rm"]


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_the_console_shows_a_hook_decision(tmp_path: Path) -> None:
    """The console's state module (plain ES module, no DOM) turns the event into a transcript line."""
    import subprocess

    js = Path(__file__).resolve().parents[2] / "services/gateway/cox_gateway/static/js/state.js"
    probe = tmp_path / "probe.mjs"
    probe.write_text(f"""
import * as st from {json.dumps(js.as_uri())};
const Model = st.SessionModel;
const m = new Model("s_1");
m.apply({{type: "hook.decision", seq: 1, sid: "s_1", turn_id: "t", hook_event: "Stop", matcher: "",
         command: "stop.sh", decision: "block", reason: "run the tests", duration_ms: 5, failed: false,
         source: "config"}});
const it = m.items[m.items.length - 1];
console.log(JSON.stringify({{kind: it.kind, text: it.text, cls: it.cls}}));
""")
    run = subprocess.run(["node", str(probe)], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout.strip().splitlines()[-1]) == {
        "kind": "note", "cls": "hook bad",
        "text": "Hook Stop: block — run the tests (config hook `stop.sh`, 5 ms)"}


def test_hooks_come_from_the_config_file_inline_and_the_workspace_in_that_order(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    (ws / ".coxswain").mkdir(parents=True)

    def one(command: str) -> dict[str, Any]:
        return {"hooks": {"PreToolUse": [{"matcher": "run_command", "hooks": [{"type": "command", "command": command}]}]}}

    (tmp_path / "hooks.json").write_text(json.dumps(one("from-file")))
    (ws / ".coxswain" / "hooks.json").write_text(json.dumps(one("from-workspace")))
    settings = Settings(hooks=HooksConfig(file=tmp_path / "hooks.json", inline=one("inline")["hooks"]))

    def loaded(s: Settings) -> list[tuple[str, str]]:
        h = hooks.Hooks(SimpleNamespace(settings=s), SimpleNamespace(workspace=ws), None, None)  # type: ignore[arg-type]
        h.load()
        return [(f.source, f.hook.command) for f in h._found("PreToolUse", "run_command")]

    assert loaded(settings) == [("config", "inline"), ("config", "from-file"), ("workspace", "from-workspace")]
    assert loaded(Settings(hooks=HooksConfig(workspace=False))) == []
    assert loaded(Settings(hooks=HooksConfig(enabled=False, file=tmp_path / "hooks.json"))) == []

    (ws / ".coxswain" / "hooks.json").write_text('{"hooks": {"PreToolUse": [{"matcher": "run_command", "hooks": 1}]}}')
    with pytest.raises(hookspec.BadHooks, match=r"the workspace's \.coxswain/hooks\.json is not a valid hooks file"):
        loaded(Settings())
    (ws / ".coxswain" / "hooks.json").unlink()
    (ws / ".coxswain" / "hooks.json").symlink_to(tmp_path / "hooks.json")
    with pytest.raises(hookspec.BadHooks, match=r"cannot be read.*link"):
        loaded(Settings())
    with pytest.raises(hookspec.BadHooks, match="cannot be read"):
        loaded(Settings(hooks=HooksConfig(workspace=False, file=tmp_path / "missing.json")))
