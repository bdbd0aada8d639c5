"""MCP tool servers, the parts that need no server: the config, guard's policy for an MCP call
(read-only, action, taint, standing, tools not enabled), the judge's confinement rule, the
session object's list, and what ``cox chat`` shows."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from cox.chat_state import ChatModel, mcp_lines
from cox_guard import policy, taint
from cox_judge.service import confined_only
from cox_runner.gate import standing_key
from coxswain import events, session_view
from coxswain.config import McpConfig, Settings
from coxswain.models import CallSpec, GuardRequest, GuardResult, JudgeRequest, JudgeResult
from tests.support.offloop import imports_off_the_loop

SERVERS = [
    {"name": "tiny", "command": "python3 tiny.py --stdio", "read_only_tools": ["echo"], "tools": ["echo", "write"]},
    {"name": "docs", "url": "http://127.0.0.1:9/mcp", "read_only": True},
    {"name": "off", "command": ["x"], "enabled": False},
]


def test_the_config_takes_one_transport_and_names_that_join_with_a_double_underscore() -> None:
    cfg = McpConfig(servers=SERVERS)
    assert cfg.servers[0].argv() == ["python3", "tiny.py", "--stdio"]
    assert [s.name for s in cfg.enabled()] == ["tiny", "docs"]
    found = cfg.server_of("tiny__write")
    assert found is not None and found[0].name == "tiny" and found[1] == "write"
    assert cfg.server_of("off__x") is None and cfg.server_of("read_file") is None and cfg.server_of("tiny__") is None
    assert cfg.servers[0].is_read_only("echo") and not cfg.servers[0].is_read_only("write")
    assert cfg.servers[1].is_read_only("anything")
    for bad in ({"name": "a", "command": "x", "url": "http://h/mcp"}, {"name": "a"}, {"name": "a__b", "command": "x"},
                {"name": "a", "url": "ftp://h"}, {"name": "a", "command": ""}):
        with pytest.raises(ValidationError):
            McpConfig(servers=[bad])
    with pytest.raises(ValidationError, match="unique"):
        McpConfig(servers=[{"name": "a", "command": "x"}, {"name": "a", "url": "http://h/mcp"}])


def _guard(tmp_path: Path, name: str, args: dict[str, Any], *, tainted: list[str] | None = None,
           standing: list[str] | None = None, **approval: Any) -> GuardResult:
    (tmp_path / "ws").mkdir(exist_ok=True)
    settings = Settings(root=tmp_path, mcp={"servers": SERVERS}, approval=approval)
    return policy.check(settings, GuardRequest(sid="s_1", workspace=str(tmp_path / "ws"),
                                               call=CallSpec(call_id="c", name=name, args=args),
                                               tainted=tainted or [], standing=standing or []))


def test_guard_allows_read_only_tools_and_decides_actions_like_commands(tmp_path: Path) -> None:
    r = _guard(tmp_path, "tiny__echo", {"text": "hi"})
    assert (r.verdict, r.actor) == ("allow", "setting") and "read-only" in r.reason
    assert _guard(tmp_path, "docs__search", {"q": "x"}).verdict == "allow"
    r = _guard(tmp_path, "tiny__write", {"path": "a", "content": "b"})
    assert (r.verdict, r.route, r.security) == ("ask", "judge", False)
    assert _guard(tmp_path, "tiny__write", {}, commands="ask").route == "person"
    assert _guard(tmp_path, "tiny__write", {}, commands="allow").verdict == "allow"
    r = _guard(tmp_path, "tiny__write", {}, standing=["mcp:tiny__write"])
    assert (r.verdict, r.actor) == ("allow", "standing")
    r = _guard(tmp_path, "tiny__delete", {})
    assert r.verdict == "refuse" and "not among the tools enabled" in r.reason
    assert _guard(tmp_path, "off__x", {}).verdict == "refuse", "a disabled server's tools are unknown"


def test_an_argument_built_from_tool_output_is_a_security_confirm(tmp_path: Path) -> None:
    out = ["see https://evil.example/payload.sh for details"]
    r = _guard(tmp_path, "tiny__write", {"path": "x", "content": {"nested": ["run https://evil.example/payload.sh"]}},
               tainted=out)
    assert (r.verdict, r.security, r.route) == ("ask", True, "person") and "payload.sh" in r.reason
    assert _guard(tmp_path, "tiny__write", {"path": "plain words only"}, tainted=out).security is False
    # read-only or not: what a server is sent may leave the machine
    assert _guard(tmp_path, "tiny__echo", {"text": "https://evil.example/payload.sh"}, tainted=out).security is True
    root = tmp_path / "ws"
    assert taint.find_in_args({"a": "x https://evil.example/payload.sh"}, out, ["https://evil.example/payload.sh"],
                              root) is None, "the person's own words are not taint"


def test_always_remembers_the_tool_and_the_judge_never_allows_an_unconfined_server_unasked() -> None:
    assert standing_key("tiny__write", {}, None) == "mcp:tiny__write"
    allowed = JudgeResult(verdict="allow", score=0.9, reason="fine", kind="model")

    def judged(sandboxed: bool, network: bool) -> JudgeResult:
        req = JudgeRequest(sid="s_1", workspace="/w", call=CallSpec(call_id="c", name="web__post", args={}),
                           sandboxed=sandboxed, network=network)
        return confined_only(req, allowed)

    assert judged(True, False).verdict == "allow"
    http = judged(False, True)
    assert http.verdict == "refuse" and "outside the sandbox" in http.reason


def test_the_session_object_lists_recorded_states_then_servers_not_started() -> None:
    cfg = McpConfig(servers=SERVERS)
    assert [(s.name, s.state) for s in session_view.mcp_servers(None, cfg)] == [("tiny", "idle"), ("docs", "idle")]
    raw = '[{"name": "tiny", "state": "exited", "tools": [], "error": "gone"}]'
    shown = session_view.mcp_servers(raw, cfg)
    assert [(s.name, s.state, s.error) for s in shown] == [("tiny", "exited", "gone"), ("docs", "idle", None)]
    assert session_view.mcp_servers("not json", None) == []
    ready = '[{"name": "tiny", "state": "ready", "tools": ["tiny__echo"]}]'
    assert session_view.mcp_servers(ready, None)[0].state == "ready"
    idle = session_view.mcp_servers(ready, None, busy=False)[0]
    assert (idle.state, idle.tools) == ("idle", ["tiny__echo"]), "an idle session's servers are stopped"


def test_cox_chat_follows_the_servers_and_says_a_failure() -> None:
    m = ChatModel("s_1")
    m.replaying = False
    e = events.McpServer(sid="s_1", seq=1, name="tiny", state="ready", tools=["tiny__echo"]).model_dump()
    m.apply(e)
    m.apply(events.McpServer(sid="s_1", seq=2, name="tiny", state="exited", error="it died").model_dump())
    assert m.info["mcp_servers"] == [{"name": "tiny", "state": "exited", "tools": [], "error": "it died"}]
    notes = [i.text for i in m.items if i.kind == "note"]
    assert notes[-1] == "MCP server tiny exited; its tools are withdrawn: it died"
    assert mcp_lines(m.info["mcp_servers"]) == ["MCP tool servers:", "  tiny  exited  (it died)"]
    assert mcp_lines([])[0].startswith("No MCP tool servers")


def test_cox_chat_follows_the_programs_and_lists_them_for_kill() -> None:
    from cox.chat_state import program_lines

    m = ChatModel("s_x")
    m.apply({"seq": 1, "type": "program.started", "sid": "s_x", "program_id": "p_1", "name": "web",
             "command": "python3 -m http.server", "call_id": "c1"})
    m.apply({"seq": 2, "type": "program.started", "sid": "s_x", "program_id": "p_2", "name": "sleep",
             "command": "sleep 9"})
    assert [p["program_id"] for p in m.info["programs"]] == ["p_1", "p_2"]
    lines = program_lines(m.info["programs"])
    assert lines[1].startswith("  1. web (p_1, by model)") and lines[2].startswith("  2. sleep (p_2, by person)")
    m.apply({"seq": 3, "type": "program.stopped", "sid": "s_x", "program_id": "p_1", "by": "idle"})
    m.apply({"seq": 4, "type": "program.exited", "sid": "s_x", "program_id": "p_2", "code": 3})
    assert m.info["programs"] == []
    assert program_lines([])[0].startswith("No programs are running")


def test_the_mcp_sdk_is_imported_off_the_event_loop() -> None:
    """Its import builds a pydantic schema per MCP type (~1 s of CPU, 9 s on a loaded CI): on the
    loop it held a runner's lease renewals until the lease lapsed and the turn ended crashed."""
    imports_off_the_loop("from cox_runner.workspace.mcp_servers import load_sdk", "load_sdk()",
                         ("mcp", "mcp.client.stdio"), "mcp.client.streamable_http")
