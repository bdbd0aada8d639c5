"""Hooks (docs/api.md, "Hooks") on the real stack: a workspace's ``.coxswain/hooks.json`` (and the
config's) run in the command sandbox at PreToolUse, PostToolUse, UserPromptSubmit and Stop.

The hooks are tiny Python scripts written into the test's workspace; the model is the script
model. ``touch`` is not a read-only command, so without hooks the rules judge refuses it and the
person is asked: a hook's ``allow`` is seen by the call running with no approval.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.support.checks import finished, of_type, one
from tests.support.stack import Api, Stack, check_event, script, stack_fixture

CONFIG = """
[model.script]
context_window = 4000

[[hooks.inline.PostToolUse]]
matcher = "list_dir"
hooks = [{ type = "command", command = "echo '{\\"hookSpecificOutput\\": {\\"additionalContext\\": \\"config hook saw list_dir\\"}}'" }]
"""

stack = stack_fixture("hooks", runners=1, config=CONFIG)

PRE = r'''
import json, sys
p = json.load(sys.stdin)
with open("payloads.jsonl", "a") as f:
    f.write(json.dumps(p) + "\n")
cmd = p["tool_input"].get("command", "")
def say(d, why):
    print(json.dumps({"hookSpecificOutput": {"hookEventName": "PreToolUse", "permissionDecision": d,
                                             "permissionDecisionReason": why}}))
if "denied" in cmd:
    say("deny", "no touching denied files in this repo")
elif "asked" in cmd:
    say("ask", "a person should see this one")
elif "allowed" in cmd or "cp " in cmd:
    say("allow", "fine by the hook")
'''


def hooked(stack: Stack, name: str, hooks: dict[str, Any], **scripts: str) -> Path:
    """A workspace whose ``.coxswain/hooks.json`` holds ``hooks`` (and the hook scripts)."""
    ws = stack.root / name
    (ws / ".coxswain").mkdir(parents=True)
    (ws / ".coxswain" / "hooks.json").write_text(json.dumps({"hooks": hooks}))
    for file, text in scripts.items():
        (ws / ".coxswain" / file).write_text(text)
    return ws


def cmd(command: str, timeout: float | None = None) -> dict[str, Any]:
    return {"type": "command", "command": command, **({"timeout": timeout} if timeout else {})}


def touch(path: str) -> dict[str, Any]:
    return {"name": "run_command", "args": {"command": f"touch {path}"}}


def answer(api: Api, sid: str, aid: str, decision: str) -> Any:
    return api.http.post(f"/v1/sessions/{sid}/approvals/{aid}", json={"decision": decision})


def checked(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    for e in evs:
        check_event(e)
    return evs


def test_pre_tool_use_denies_allows_and_asks(stack: Stack) -> None:
    ws = hooked(stack, "hooks-pre", {"PreToolUse": [{"matcher": "run_command", "hooks": [
        cmd("python3 .coxswain/pre.py")]}]}, **{"pre.py": PRE})
    with stack.client() as api:
        sid = api.create("hooks-pre")["id"]
        api.send(sid, script({"tools": [touch("denied.txt")]}, {"tools": [touch("allowed.txt")]},
                             {"tools": [touch("asked.txt")]}, {"text": "Done."}))
        pending = api.wait_type(sid, "approval.pending")
        assert pending["reason"] == "a PreToolUse hook asks the person: a person should see this one"
        assert pending["args"] == {"command": "touch asked.txt"}
        assert answer(api, sid, pending["approval_id"], "allow").status_code == 200
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    calls = {c["args"]["command"]: c["call_id"] for c in of_type(evs, "tool.call")}

    denied = calls["touch denied.txt"]
    assert not (ws / "denied.txt").exists(), "a denied call does not run"
    result = one(evs, "tool.result", call_id=denied)
    assert result["ok"] is False
    assert result["output"] == "Refused: denied by a PreToolUse hook: no touching denied files in this repo."
    d = one(evs, "hook.decision", tool_call_id=denied)
    assert (d["hook_event"], d["decision"], d["tool"], d["matcher"], d["source"], d["failed"]) == \
        ("PreToolUse", "deny", "run_command", "run_command", "workspace", False)
    assert d["command"] == "python3 .coxswain/pre.py" and d["duration_ms"] >= 0
    assert one(evs, "policy.decision", call_id=denied, actor="hook")["verdict"] == "refuse"

    allowed = calls["touch allowed.txt"]
    assert (ws / "allowed.txt").exists(), "a hook's allow skips the judge (which refuses touch) and the person"
    assert one(evs, "hook.decision", tool_call_id=allowed)["decision"] == "allow"
    assert one(evs, "policy.decision", call_id=allowed, actor="hook")["verdict"] == "allow"
    assert one(evs, "tool.result", call_id=allowed)["ok"] is True

    asked = calls["touch asked.txt"]
    assert one(evs, "hook.decision", tool_call_id=asked)["decision"] == "ask"
    assert pending["call_id"] == asked and (ws / "asked.txt").exists(), "allowed by the person, it ran"
    assert len(of_type(evs, "approval.pending")) == 1

    seen = [json.loads(line) for line in (ws / "payloads.jsonl").read_text().splitlines()]
    assert [p["tool_input"]["command"] for p in seen] == ["touch denied.txt", "touch allowed.txt", "touch asked.txt"]
    first = seen[0]
    assert first["hook_event_name"] == "PreToolUse" and first["session_id"] == sid
    assert first["cwd"] == str(ws) and first["tool_name"] == "run_command" and first["tool_use_id"] == denied


def test_a_hook_that_hangs_or_prints_garbage_fails_closed(stack: Stack) -> None:
    ws = hooked(stack, "hooks-fail", {"PreToolUse": [
        {"matcher": "run_command", "hooks": [cmd("sleep 30", timeout=1)]},
        {"matcher": "write_file", "hooks": [cmd("echo 'sure, go ahead'")]},
        {"matcher": "read_file", "hooks": [cmd("exit 1")]},
    ]})
    (ws / "a.txt").write_text("a")
    with stack.client() as api:
        sid = api.create("hooks-fail")["id"]
        api.send(sid, script({"tools": [{"name": "run_command", "args": {"command": "echo hi > ran.txt"}},
                                        {"name": "write_file", "args": {"path": "w.txt", "content": "w"}},
                                        {"name": "read_file", "args": {"path": "a.txt"}},
                                        {"name": "list_dir", "args": {"path": "."}}]},
                             {"text": "Done."}))
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    assert not (ws / "ran.txt").exists() and not (ws / "w.txt").exists()
    by_tool = {d["tool"]: d for d in of_type(evs, "hook.decision") if d["hook_event"] == "PreToolUse"}
    assert set(by_tool) == {"run_command", "write_file", "read_file"}, "list_dir matched no PreToolUse hook"
    for tool, says in (("run_command", "the hook timed out after 1s and was killed"),
                       ("write_file", "the hook's answer is not a JSON object"),
                       ("read_file", "the hook exited with code 1")):
        d = by_tool[tool]
        assert d["decision"] == "deny" and d["failed"] is True and d["reason"].startswith(says), d
        assert "fails denies the call" in d["reason"]
        result = one(evs, "tool.result", call_id=d["tool_call_id"])
        assert result["ok"] is False and result["output"].startswith("Refused: denied by a PreToolUse hook: " + says)
    assert by_tool["run_command"]["duration_ms"] >= 1000
    ls = one(evs, "tool.call", name="list_dir")
    assert one(evs, "tool.result", call_id=ls["call_id"])["ok"] is True
    note = one(evs, "user.msg", text="config hook saw list_dir")
    assert note["seq"] > one(evs, "tool.result", call_id=ls["call_id"])["seq"], "the config's hook ran after the call"
    cfg = one(evs, "hook.decision", tool="list_dir")
    assert (cfg["hook_event"], cfg["source"], cfg["decision"]) == ("PostToolUse", "config", "none")


STOP_ONCE = r'''
import json, sys
p = json.load(sys.stdin)
with open("stops.jsonl", "a") as f:
    f.write(json.dumps(p) + "\n")
if not p["stop_hook_active"]:
    steps = [{"tools": [{"name": "write_file", "args": {"path": "tests-ran.txt", "content": "ok"}}]},
             {"text": "Tests ran."}]
    print(json.dumps({"decision": "block",
                      "reason": "Run the tests before you stop.\n```script\n" + json.dumps(steps) + "\n```"}))
'''


def test_a_stop_hook_continues_the_turn_through_a_lead(stack: Stack) -> None:
    ws = hooked(stack, "hooks-stop", {"Stop": [{"hooks": [cmd("python3 .coxswain/stop.py")]}]},
                **{"stop.py": STOP_ONCE})
    with stack.client() as api:
        sid = api.create("hooks-stop")["id"]
        api.send(sid, script({"text": "All done."}))
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    assert len(of_type(evs, "turn.start")) == 1 and len(of_type(evs, "turn.end")) == 1, "one turn, not a new one"
    stops = of_type(evs, "hook.decision")
    assert [(d["hook_event"], d["decision"]) for d in stops] == [("Stop", "block"), ("Stop", "none")]
    saved = one(evs, "lead.saved")
    assert saved["text"].startswith("Run the tests before you stop.")
    applied = one(evs, "lead.applied")
    assert applied["lead_ids"] == [saved["lead_id"]]
    msg = one(evs, "user.msg", via="lead")
    assert msg["text"] == saved["text"] and stops[0]["seq"] < saved["seq"] < applied["seq"]
    assert (ws / "tests-ran.txt").read_text() == "ok", "the turn went on with the hook's message"
    texts = [m["text"] for m in of_type(evs, "assistant.msg") if m["text"]]
    assert texts == ["All done.", "Tests ran."]
    seen = [json.loads(line) for line in (ws / "stops.jsonl").read_text().splitlines()]
    assert [(p["hook_event_name"], p["stop_hook_active"]) for p in seen] == [("Stop", False), ("Stop", True)]
    assert seen[0]["last_assistant_message"] == "All done."


def test_a_stop_hook_that_always_blocks_is_capped(stack: Stack) -> None:
    hooked(stack, "hooks-stop-cap", {"Stop": [{"hooks": [cmd("echo 'keep going' >&2; exit 2")]}]})
    with stack.client() as api:
        sid = api.create("hooks-stop-cap")["id"]
        api.send(sid, script({"text": "Finished."}))
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    decisions = of_type(evs, "hook.decision")
    assert [d["decision"] for d in decisions] == ["block"] * 3, "[hooks] max_stop_continues = 3, then no more"
    assert [m["text"] for m in of_type(evs, "user.msg") if m["via"] == "lead"] == ["keep going"] * 3
    assert len(of_type(evs, "lead.applied")) == 3 and len(of_type(evs, "turn.end")) == 1


PROMPT = r'''
import json, sys
p = json.load(sys.stdin)
if "forbidden" in p["prompt"]:
    sys.stderr.write("messages about forbidden things are not taken here")
    sys.exit(2)
print("The build is green.")
'''
POST = r'''
import json, sys
p = json.load(sys.stdin)
print(json.dumps({"decision": "block", "reason": "generated file: edit gen.in instead",
                  "seen": p["tool_response"]["output"]}))
'''


def test_user_prompt_submit_blocks_or_adds_context_and_post_tool_use_flags_a_result(stack: Stack) -> None:
    ws = hooked(stack, "hooks-prompt", {
        "UserPromptSubmit": [{"hooks": [cmd("python3 .coxswain/prompt.py")]}],
        "PostToolUse": [{"matcher": "read_file", "hooks": [cmd("python3 .coxswain/post.py")]}],
    }, **{"prompt.py": PROMPT, "post.py": POST})
    (ws / "gen.txt").write_text("generated")
    with stack.client() as api:
        sid = api.create("hooks-prompt")["id"]
        api.send(sid, script({"text": "never"}, text="do the forbidden thing"))
        end, evs = finished(api, sid)
        assert end["outcome"] == "canceled"
        assert end["detail"] == ("a UserPromptSubmit hook blocked the message: "
                                 "messages about forbidden things are not taken here")
        assert not of_type(evs, "assistant.msg"), "no model request was made"
        assert one(evs, "hook.decision")["decision"] == "block"

        after = end["seq"]
        api.send(sid, script({"tools": [{"name": "read_file", "args": {"path": "gen.txt"}}]}, {"text": "Read."}))
        end, evs = finished(api, sid, after=after)
    checked(evs)
    assert end["outcome"] == "completed"
    context = one(evs, "user.msg", text="The build is green.")
    assert context["via"] == "lead"
    read = one(evs, "tool.call", name="read_file")
    result = one(evs, "tool.result", call_id=read["call_id"])
    assert result["ok"] is True and "generated" in result["output"]
    flagged = [m for m in of_type(evs, "user.msg") if "generated file: edit gen.in instead" in m["text"]]
    assert len(flagged) == 1 and flagged[0]["seq"] > result["seq"]
    post = one(evs, "hook.decision", hook_event="PostToolUse")
    assert (post["decision"], post["tool_call_id"]) == ("block", read["call_id"])


def test_the_model_cannot_write_the_hooks_file(stack: Stack) -> None:
    original = {"PreToolUse": [{"matcher": "run_command", "hooks": [cmd("python3 .coxswain/pre.py")]}]}
    ws = hooked(stack, "hooks-protected", original, **{"pre.py": PRE})
    (ws / "evil.json").write_text(json.dumps({"hooks": {}}))
    planted = json.dumps({"hooks": {}})
    with stack.client() as api:
        sid = api.create("hooks-protected")["id"]
        api.send(sid, script({"tools": [
            {"name": "write_file", "args": {"path": ".coxswain/hooks.json", "content": planted}},
            {"name": "edit_file", "args": {"path": ".coxswain/hooks.json", "old": "run_command", "new": "nothing"}},
            {"name": "run_command", "args": {"command": "echo '{}' > .coxswain/hooks.json"}},
            # allowed by the hook (the judge is skipped), but the sandbox mounts the store folder read-only
            {"name": "run_command", "args": {"command": "cp evil.json .coxswain/hooks.json"}},
        ]}, {"text": "Done."}))
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    assert json.loads((ws / ".coxswain" / "hooks.json").read_text()) == {"hooks": original}
    results = [one(evs, "tool.result", call_id=c["call_id"]) for c in of_type(evs, "tool.call")]
    for r in results[:3]:
        assert r["ok"] is False and "holds the workspace's hooks" in r["output"], r
    assert not of_type(evs, "approval.pending"), "refused outright: no person is asked to allow it"
    assert results[3]["ok"] is False and "Read-only file system" in results[3]["output"], results[3]


PRE_COMPACT = r'''
import json, sys
p = json.load(sys.stdin)
with open("compact.json", "w") as f:
    json.dump(p, f)
'''


def test_a_pre_compact_hook_is_told_before_a_compaction(stack: Stack) -> None:
    """The stack's script model has a 4000-token window: reading a 14000-character file fills it."""
    ws = hooked(stack, "hooks-compact", {"PreCompact": [{"hooks": [cmd("python3 .coxswain/compact.py")]}]},
                **{"compact.py": PRE_COMPACT})
    (ws / "big.txt").write_text("word " * 2800)
    with stack.client() as api:
        sid = api.create("hooks-compact")["id"]
        api.send(sid, script({"tools": [{"name": "read_file", "args": {"path": "big.txt"}}]}, {"text": "Read it."}))
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    hook = one(evs, "hook.decision", hook_event="PreCompact")
    assert hook["decision"] == "none" and hook["failed"] is False
    assert hook["seq"] < one(evs, "context.compacted")["seq"]
    told = json.loads((ws / "compact.json").read_text())
    assert (told["hook_event_name"], told["trigger"], told["session_id"]) == ("PreCompact", "auto", sid)


def test_stop_while_a_hook_runs_kills_it_and_closes_the_call(stack: Stack) -> None:
    ws = hooked(stack, "hooks-stop-during", {"PreToolUse": [{"matcher": "run_command", "hooks": [
        cmd("echo started > hook-started.txt; sleep 60", timeout=120)]}]})
    with stack.client() as api:
        sid = api.create("hooks-stop-during")["id"]
        api.send(sid, script({"tools": [touch("never.txt")]}, {"text": "not reached"}))
        call = api.wait_type(sid, "tool.call")
        deadline = time.monotonic() + 20
        while not (ws / "hook-started.txt").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        t0 = time.monotonic()
        assert api.http.post(f"/v1/sessions/{sid}/stop").status_code == 200
        end, evs = finished(api, sid)
        assert time.monotonic() - t0 < 10, "Stop does not wait for the hook"
    checked(evs)
    assert end["outcome"] == "stopped"
    assert not (ws / "never.txt").exists()
    result = one(evs, "tool.result", call_id=call["call_id"])
    assert result["ok"] is False and result["output"].startswith("Cancelled:")
    assert not of_type(evs, "hook.decision"), "a hook killed by Stop decided nothing"


def test_a_hooks_allow_does_not_answer_a_security_confirm(stack: Stack) -> None:
    ws = hooked(stack, "hooks-security", {"PreToolUse": [{"matcher": "write_file", "hooks": [
        cmd("""echo '{"hookSpecificOutput": {"permissionDecision": "allow"}}'""")]}]})
    with stack.client() as api:
        sid = api.create("hooks-security")["id"]
        api.send(sid, script({"tools": [{"name": "write_file", "args": {"path": "Makefile", "content": "all:\n"}},
                                        {"name": "write_file", "args": {"path": "notes.txt", "content": "n"}}]},
                             {"text": "Done."}))
        pending = api.wait_type(sid, "approval.pending")
        assert pending["security"] is True and pending["args"]["path"] == "Makefile"
        assert answer(api, sid, pending["approval_id"], "deny").status_code == 200
        end, evs = finished(api, sid)
    checked(evs)
    assert end["outcome"] == "completed"
    assert not (ws / "Makefile").exists(), "the person denied the protected write the hook allowed"
    assert (ws / "notes.txt").read_text() == "n"
    assert [d["decision"] for d in of_type(evs, "hook.decision")] == ["allow", "allow"]
    assert len(of_type(evs, "approval.pending")) == 1


WAIT_FOR_GO = r'''
import os, time
for _ in range(400):
    if os.path.exists("go"):
        break
    time.sleep(0.05)
'''


def test_a_response_is_in_the_log_while_a_pre_tool_use_hook_on_its_read_runs(stack: Stack) -> None:
    """A response whose first call is a read is recorded with the read, unless a hook runs first:
    the person sees the response while the hook takes its time."""
    ws = hooked(stack, "hooks-read", {"PreToolUse": [{"matcher": "list_dir", "hooks": [
        cmd("python3 .coxswain/wait.py")]}]}, **{"wait.py": WAIT_FOR_GO})
    with stack.client() as api:
        sid = api.create("hooks-read", title="hooked read")["id"]  # titled: no title request flushes it
        api.send(sid, script({"text": "looking", "tools": [{"name": "list_dir", "args": {"path": "."}}]},
                             {"text": "Done."}))
        msg = api.wait_type(sid, "assistant.msg", timeout=15)
        assert msg["text"] == "looking" and [c["name"] for c in msg["tool_calls"]] == ["list_dir"]
        assert not of_type(api.all_events(sid), "tool.result"), "seen while the hook still waits"
        (ws / "go").write_text("")
        end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert one(evs, "tool.result", call_id=msg["tool_calls"][0]["call_id"])["ok"] is True
