"""``cox acp`` against a real stack, driven over stdio by the Agent Client Protocol SDK's own
client classes (``acp.spawn_agent_process`` and a ``Client``), as an editor drives it: initialize,
a new session (and a cwd outside the root refused plainly), a prompt whose turn writes a file and
asks twice (``allow_once``, then ``reject_once`` with the turn going on), updates in order,
``stopReason``; a prompt while busy queued and answered at its own turn's end; a Lead through
``_session/steering``; ``session/cancel`` answering the prompt and the queued one ``cancelled``;
``session/load`` after a restart of ``cox acp`` replaying the same transcript; ``session/list``
and ``session/resume``; the don't-ask mode and the model option."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import shlex
import subprocess
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any, cast

import pytest
from acp import PROTOCOL_VERSION, RequestError, image_block, spawn_agent_process, text_block
from acp.core import ClientSideConnection
from acp.schema import AllowedOutcome, ClientCapabilities, Implementation, RequestPermissionResponse

from tests.support.stack import TOKEN, Api, Stack, script, stack_fixture, tool

stack = stack_fixture("acp", runners=1)


class Editor:
    """An ACP client as an editor is one: it shows every ``session/update`` and answers each
    permission request with the next of ``answers`` (an option id)."""

    def __init__(self, answers: list[str] | None = None) -> None:
        self.updates: list[tuple[str, Any]] = []
        self.answers = list(answers or [])
        self.asked: list[Any] = []

    async def session_update(self, session_id: str, update: Any, **kwargs: Any) -> None:
        self.updates.append((session_id, update))

    async def request_permission(self, options: list[Any], session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, [o.kind for o in options]))
        choice = self.answers.pop(0)
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id=choice))

    def kinds(self, sid: str | None = None) -> list[str]:
        return [u.session_update for s, u in self.updates if sid is None or s == sid]

    def text(self, sid: str) -> str:
        return "".join(u.content.text for s, u in self.updates
                       if s == sid and u.session_update == "agent_message_chunk")

    def tools(self, sid: str) -> list[Any]:
        return [u for s, u in self.updates if s == sid and u.session_update in ("tool_call", "tool_call_update")]


def env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("COX_")}


@contextlib.asynccontextmanager
async def cox_acp(stack: Stack, editor: Editor, tmp: Path, *extra: str,
                  observers: list[Any] | None = None) -> AsyncIterator[ClientSideConnection]:
    errors = (tmp / "stderr").open("ab")
    args = ["-m", "cox", "acp", "--url", stack.url, "--token", TOKEN, "--log", str(tmp / "acp.log"), *extra]
    try:
        async with spawn_agent_process(cast(Any, editor), sys.executable, *args, env=env(),
                                       transport_kwargs={"stderr": errors}, use_unstable_protocol=True,
                                       observers=observers or []) as (conn, _proc):
            init = await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=ClientCapabilities(),
                                         client_info=Implementation(name="test-editor", version="1"))
            assert init.protocol_version == PROTOCOL_VERSION
            yield conn
    finally:
        errors.close()


async def until(pred: Callable[[], bool], what: str, timeout: float = 30.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not pred():
        assert asyncio.get_running_loop().time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.05)


async def test_a_prompt_writes_asks_twice_and_ends_its_turn(stack: Stack, api: Api, tmp_path: Path) -> None:
    editor = Editor(answers=["allow_once", "reject_once"])
    ws = stack.root / "acp-one"
    text = script(
        {"text": "Writing it.", "tools": [tool("write_file", path="out.txt", content="42\n")]},
        {"tools": [tool("run_command", command="touch made.txt")]},
        {"tools": [tool("run_command", command="touch never.txt")]},
        {"text": "Done, one denied."},
        text="write and touch")
    async with cox_acp(stack, editor, tmp_path) as conn:
        with pytest.raises(RequestError) as refused:
            await conn.new_session(cwd=str(tmp_path), mcp_servers=[])
        assert refused.value.code == -32602 and "is not under coxswain's workspace root" in str(refused.value)
        new = await conn.new_session(cwd=str(ws), mcp_servers=[])
        sid = new.session_id
        assert sid.startswith("s_") and api.session(sid)["workspace"] == str(ws)
        assert new.modes is not None and new.modes.current_mode_id == "ask"
        assert new.config_options and new.config_options[0].id == "model"

        done = await conn.prompt(session_id=sid, prompt=[text_block(text)])
        assert done.stop_reason == "end_turn"
        assert (ws / "out.txt").read_text() == "42\n" and (ws / "made.txt").exists()
        assert not (ws / "never.txt").exists(), "reject_once denied the second command"
        (first, kinds1), (second, _) = editor.asked
        assert first.title == "`touch made.txt`" and first.kind == "execute" and second.title == "`touch never.txt`"
        assert kinds1 == ["allow_once", "allow_always", "reject_once"]

        await until(lambda: "Done, one denied." in editor.text(sid), "the last words")
        assert editor.text(sid) == "Writing it.Done, one denied."
        kinds = editor.kinds(sid)
        assert "user_message_chunk" not in kinds, "the editor's own prompt is not echoed back"
        starts = [u for u in editor.tools(sid) if u.session_update == "tool_call"]
        assert [(u.title, u.kind) for u in starts] == [
            ("Write out.txt", "edit"), ("`touch made.txt`", "execute"), ("`touch never.txt`", "execute")]
        assert starts[0].locations[0].path == str(ws / "out.txt")
        by_call: dict[str, list[Any]] = {}
        for u in editor.tools(sid):
            by_call.setdefault(u.tool_call_id, []).append(u)
        write, made, never = (by_call[u.tool_call_id] for u in starts)
        assert [u.status for u in write] == ["pending", "in_progress", "completed"]
        diff = next(c for u in write for c in (u.content or []) if c.type == "diff")
        assert diff.path == str(ws / "out.txt") and diff.new_text == "42\n" and diff.old_text is None
        assert made[-1].status == "completed" and never[-1].status == "failed"
        # in order: the text before its tool call, each call's updates after its start
        assert kinds.index("agent_message_chunk") < kinds.index("tool_call")
        assert "usage_update" in kinds and "session_info_update" in kinds


async def test_busy_prompt_queues_steering_leads_and_cancel_answers_both(stack: Stack, api: Api, tmp_path: Path) -> None:
    editor = Editor()
    ws = stack.root / "acp-busy"
    async with cox_acp(stack, editor, tmp_path) as conn:
        sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
        # a long command; a Lead during it lands at the next boundary and replaces the script
        long = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block(script(
            {"text": "Sleeping.", "tools": [tool("run_command", command="sleep 4")]}, {"text": "not reached"},
            text="first"))]))
        started = await asyncio.to_thread(api.wait_type, sid, "tool.call")
        queued = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("second, queued")]))
        await asyncio.to_thread(api.wait_type, sid, "queue.added", 20.0)
        led = await conn.ext_method("session/steering", {"sessionId": sid,
                                                         "prompt": [{"type": "text", "text": script({"text": "Led."})}]})
        assert led["turnId"] == started["turn_id"]
        assert (await long).stop_reason == "end_turn"
        assert (await queued).stop_reason == "end_turn"
        # The queued prompt waits for its own turn: it starts after the first's ended, by the log
        # (both answers can arrive in one read, and done callbacks ran after the await once: the
        # order the two calls returned in is no contract).
        evs = api.all_events(sid)
        assert [e["via"] for e in evs if e["type"] == "user.msg"] == ["send", "lead", "queue"]
        queued_msg = next(e["message_id"] for e in evs if e["type"] == "user.msg" and e["via"] == "queue")
        first_end = next(e["seq"] for e in evs if e["type"] == "turn.end" and e["turn_id"] == started["turn_id"])
        queued_start = next(e["seq"] for e in evs if e["type"] == "turn.start" and e["message_id"] == queued_msg)
        assert first_end < queued_start, "the queued prompt waits for its own turn"
        assert "Led." in editor.text(sid) and "echo: second, queued" in editor.text(sid)
        assert "not reached" not in editor.text(sid)

        # Stop: the running prompt and the queued one both answer cancelled
        running = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block(script(
            {"text": "slow", "delay_ms": 60_000}, text="third"))]))
        await asyncio.to_thread(api.wait_type, sid, "turn.start", 20.0, evs[-1]["seq"])
        waiting = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block("fourth, queued")]))
        await asyncio.to_thread(api.wait_type, sid, "queue.added", 20.0, evs[-1]["seq"])
        await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(running, 30)).stop_reason == "cancelled"
        assert (await asyncio.wait_for(waiting, 30)).stop_reason == "cancelled"
        assert not api.session(sid)["busy"]
        # a Lead with no turn running is refused, never a new turn
        with pytest.raises(RequestError) as refused:
            await conn.ext_method("session/steering", {"sessionId": sid, "prompt": [{"type": "text", "text": "x"}]})
        assert "no_turn" in str(refused.value)


async def test_load_after_a_restart_replays_the_transcript_resume_and_list(stack: Stack, api: Api,
                                                                          tmp_path: Path) -> None:
    ws = stack.root / "acp-load"
    first = Editor()
    text = script({"text": "Listing.", "tools": [tool("list_dir", path=".")]},
                  {"text": "Planned.", "tools": [tool("plan_write", steps=["look", "fix"]), tool("plan_step", step=1)]},
                  {"text": "All done."}, text="look around")
    async with cox_acp(stack, first, tmp_path) as conn:
        sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
        assert (await conn.prompt(session_id=sid, prompt=[text_block(text)])).stop_reason == "end_turn"
        await until(lambda: "All done." in first.text(sid), "the last words")
        await asyncio.sleep(1.0)  # the title and the last usage follow the words
        plans = [u for s, u in first.updates if u.session_update == "plan"]
        assert [(e.content, e.status) for e in plans[-1].entries] == [("look", "completed"), ("fix", "in_progress")]
        live = [(u.session_update, getattr(u, "tool_call_id", None)) for _, u in first.updates
                if u.session_update != "agent_message_chunk"]

    again = Editor()
    async with cox_acp(stack, again, tmp_path) as conn:
        listed = await conn.list_sessions(cwd=str(ws))
        assert [s.session_id for s in listed.sessions] == [sid] and listed.sessions[0].cwd == str(ws)
        with pytest.raises(RequestError):
            await conn.prompt(session_id=sid, prompt=[text_block("not attached")])
        await conn.load_session(cwd=str(ws), session_id=sid, mcp_servers=[])
        replayed = [(u.session_update, getattr(u, "tool_call_id", None)) for _, u in again.updates
                    if u.session_update not in ("agent_message_chunk", "user_message_chunk")]
        assert replayed == live, "session/load replays what was shown live"
        assert again.text(sid) == first.text(sid)
        assert again.kinds(sid)[0] == "user_message_chunk", "the replay holds the person's message"
        n = len(again.updates)
        await conn.resume_session(cwd=str(ws), session_id=sid, mcp_servers=[])
        await asyncio.sleep(0.5)
        assert len(again.updates) == n, "resume replays nothing"
        done = await conn.prompt(session_id=sid, prompt=[text_block("after the restart")])
        assert done.stop_reason == "end_turn"
        await until(lambda: "echo: after the restart" in again.text(sid), "the new turn's words")

        # modes: the don't-ask switch; config: the model
        await conn.set_session_mode(session_id=sid, mode_id="dont_ask")
        assert api.session(sid)["dont_ask"] is True
        await until(lambda: "current_mode_update" in again.kinds(sid), "the mode update")
        options = await conn.set_config_option(config_id="model", session_id=sid, value="script")
        assert options.config_options[0].current_value == "script"


async def test_a_turn_that_ends_otherwise_is_a_named_error_and_it_logs_to_its_file(stack: Stack, api: Api,
                                                                                     tmp_path: Path) -> None:
    editor = Editor()
    ws = stack.root / "acp-err"
    async with cox_acp(stack, editor, tmp_path) as conn:
        sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
        cut = await conn.prompt(session_id=sid, prompt=[text_block(script({"text": "cut", "finish": "length"}))])
        assert cut.stop_reason == "max_tokens"
        with pytest.raises(RequestError) as failed:
            await conn.prompt(session_id=sid, prompt=[text_block(script({"text": "", "tools": []}))])
        assert failed.value.code == -32010 and str(failed.value).startswith("the turn ended empty")
        assert failed.value.data == {"outcome": "empty", "detail": "the model gave an empty answer"}
        # an image block is an attachment of the message (the script model takes any and ignores it)
        png = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"\0" * 32).decode()
        seen = await conn.prompt(session_id=sid, prompt=[text_block("look at this"), image_block(png, "image/png")])
        assert seen.stop_reason == "end_turn"
        (msg,) = [e for e in api.all_events(sid) if e["type"] == "user.msg" and e["text"] == "look at this"]
        assert [(a["name"], a["media_type"], a["size"]) for a in msg["attachments"]] == [("image-1.png", "image/png", 40)]
        inject = await conn.ext_method("coxswain/steer", {"sessionId": sid, "prompt": [{"type": "text", "text": "hi"}]})
        assert inject["disposition"] == "started"
        await asyncio.to_thread(api.wait_idle, sid)
    log = (tmp_path / "acp.log").read_text()
    assert "cox acp" in log and "prompt" in log, "it logs to its file"


class Waiter(Editor):
    """An editor whose person never answers: an approval is answered elsewhere (the console)."""

    async def request_permission(self, options: list[Any], session_id: str, tool_call: Any,
                                 **kwargs: Any) -> RequestPermissionResponse:
        self.asked.append((tool_call, [o.kind for o in options]))
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


async def test_an_approval_answered_elsewhere_or_a_cancel_withdraws_the_request_and_inject_steers_or_queues(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    editor = Waiter()
    seen: list[dict[str, Any]] = []
    ws = stack.root / "acp-elsewhere"
    async with cox_acp(stack, editor, tmp_path, observers=[lambda e: seen.append(e.message)]) as conn:
        sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
        p = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block(script(
            {"tools": [tool("run_command", command="touch elsewhere.txt")]}, {"text": "Ran."}))]))
        pending = await asyncio.to_thread(api.wait_type, sid, "approval.pending")
        await until(lambda: bool(editor.asked), "the permission request")
        r = api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}", json={"decision": "allow"})
        assert r.status_code == 200, r.text
        assert (await asyncio.wait_for(p, 30)).stop_reason == "end_turn"
        assert (ws / "elsewhere.txt").exists()
        (ask,) = [m for m in seen if m.get("method") == "session/request_permission"]
        await until(lambda: any(m.get("method") == "$/cancel_request" for m in seen), "the withdrawal")
        (withdrawn,) = [m for m in seen if m.get("method") == "$/cancel_request"]
        assert withdrawn["params"] == {"requestId": ask["id"]}

        # session/inject (the proposed steering call): steer is a Lead, queue a queued message
        p = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block(script(
            {"text": "Sleeping.", "tools": [tool("run_command", command="sleep 4")]}, {"text": "not reached"}))]))
        after = api.session(sid)["last_seq"]
        await asyncio.to_thread(api.wait_type, sid, "tool.call", 20.0, after)
        raw = conn._conn
        queued = await raw.send_request("session/inject", {"sessionId": sid, "mode": "queue",
                                                           "prompt": [{"type": "text", "text": "queued by inject"}]})
        assert queued["disposition"] == "queued"
        led = await raw.send_request("session/inject", {"sessionId": sid, "mode": "steer",
                                                        "prompt": [{"type": "text", "text": script({"text": "Led."})}]})
        assert led["leadId"] and led["turnId"]
        assert (await asyncio.wait_for(p, 30)).stop_reason == "end_turn"
        await asyncio.to_thread(api.wait_idle, sid)
        vias = [e["via"] for e in api.all_events(sid) if e["type"] == "user.msg" and e["seq"] > after]
        assert vias == ["send", "lead", "queue"], vias
        await until(lambda: "echo: queued by inject" in editor.text(sid), "the queued message's turn")
        assert "Led." in editor.text(sid) and "not reached" not in editor.text(sid)

        # session/cancel while a permission request waits: the prompt is cancelled, the request
        # dropped, and Stop closes the approval
        p = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block(script(
            {"tools": [tool("run_command", command="touch never.txt")]}, {"text": "not reached"}))]))
        after = api.session(sid)["last_seq"]
        await asyncio.to_thread(api.wait_type, sid, "approval.pending", 20.0, after)
        await until(lambda: len([m for m in seen if m.get("method") == "session/request_permission"]) == 2,
                    "the second permission request")
        await conn.cancel(session_id=sid)
        assert (await asyncio.wait_for(p, 30)).stop_reason == "cancelled"
        second = [m for m in seen if m.get("method") == "session/request_permission"][1]
        await until(lambda: {"requestId": second["id"]} in [m.get("params") for m in seen
                                                            if m.get("method") == "$/cancel_request"],
                    "the second request dropped")
        resolved = await asyncio.to_thread(api.wait_type, sid, "approval.resolved", 20.0, after)
        assert resolved["decision"] == "deny" and not (ws / "never.txt").exists()


async def test_the_gateway_going_away_answers_the_prompt_plainly_and_the_stream_resumes(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    editor = Editor()
    ws = stack.root / "acp-away"
    words = " ".join(f"w{i}" for i in range(40))
    async with cox_acp(stack, editor, tmp_path, "--outage-s", "2") as conn:
        sid = (await conn.new_session(cwd=str(ws), mcp_servers=[])).session_id
        p = asyncio.create_task(conn.prompt(session_id=sid, prompt=[text_block(script(
            {"text": words, "delay_ms": 8000}, text="slowly"))]))
        await until(lambda: bool(editor.text(sid)), "the first words")
        stack.kill("gateway")
        with pytest.raises(RequestError) as away:
            await asyncio.wait_for(p, 30)
        assert away.value.code == -32011 and "has not answered" in str(away.value)
        stack.spawn("gateway", "cox_gateway")
        await asyncio.to_thread(stack.wait_healthy)
        # the stream resumed from the last seq it had: every word once, in order
        await until(lambda: editor.text(sid) == words, "the whole text after the outage", timeout=60)
        await asyncio.to_thread(api.wait_idle, sid, 30.0)
        done = await conn.prompt(session_id=sid, prompt=[text_block("after the outage")])
        assert done.stop_reason == "end_turn"


# acplint 0.1.0 (PyPI) checks against its own copy of the schema, which disagrees with the official
# one that the SDK's types are generated from (schema v1.19.0) in two places: it wants
# protocolVersion as the string "1" (the schema: an integer, uint16) and a config option's "label"
# (the schema: "name"). Those checks fail for every agent that follows the schema; any other
# failure, or an error, is ours. (It also sends session/prompt's blocks as "content", where the
# schema says "prompt", so its prompt checks get -32602: they are left out here.)
ACPLINT_SCHEMA_DISAGREES = {
    "initialize_v1": "protocolVersion: Input should be '1' (got 1)",
    "protocol_version_returned": "Expected protocolVersion='1', got '1'",
    "schema_initialize": "protocolVersion: Input should be '1' (got 1)",
    "new_session": "configOptions → 0 → label: Field required",
    "schema_session_new": "configOptions → 0 → label: Field required",
}


def test_the_acp_linter_from_pypi_finds_nothing_but_its_schema_disagreements(stack: Stack, tmp_path: Path) -> None:
    ws = stack.root / "acp-lint"
    ws.mkdir()
    report = tmp_path / "acplint.json"
    cox = Path(sys.executable).with_name("cox")
    agent_args = shlex.join(["acp", "--url", stack.url, "--token", TOKEN, "--log", str(tmp_path / "acp.log")])
    r = subprocess.run([str(Path(sys.executable).with_name("acplint")), "--agent", str(cox), "--agent-args", agent_args,
                        "--cwd", str(ws), "--timeout", "20", "--output", "json", "--output-file", str(report),
                        "--categories", "initialization", "authentication", "session_lifecycle", "session_modes",
                        "config_options", "cancel", "schema_validation"],
                       capture_output=True, text=True, timeout=180, env=env(), stdin=subprocess.DEVNULL)
    results = json.loads(report.read_text())["results"]
    by_status: dict[str, list[str]] = {}
    for res in results:
        by_status.setdefault(res["status"], []).append(res["name"])
    assert not by_status.get("ERROR"), (by_status, r.stdout[-2000:])
    failed = {res["name"]: res.get("message") or "" for res in results if res["status"] == "FAIL"}
    assert set(failed) == set(ACPLINT_SCHEMA_DISAGREES), failed
    for name, why in ACPLINT_SCHEMA_DISAGREES.items():
        assert why in failed[name], (name, failed[name])
    passed = set(by_status["PASS"])
    assert {"agent_capabilities_present", "agent_info_present", "agent_capabilities_schema_valid", "list_sessions",
            "load_session", "resume_session", "cancel_notification_sent", "cancel_graceful_handling",
            "schema_session_list"} <= passed, passed


async def test_a_client_library_from_pypi_completes_prompts_an_approval_a_cancel_and_carries_on(
        stack: Stack, api: Api, tmp_path: Path) -> None:
    from acp_client import Agent as ThirdParty  # acp-client (PyPI): its own JSON-RPC over stdio, not the SDK

    ws = stack.root / "acp-pypi"
    ws.mkdir()
    asked: list[dict[str, Any]] = []

    async def permission(request: dict[str, Any]) -> str | None:
        asked.append(request)
        return "allow_once"

    command = [sys.executable, "-m", "cox", "acp", "--url", stack.url, "--token", TOKEN,
               "--log", str(tmp_path / "acp.log")]
    agent = ThirdParty(command, cwd=ws, permission=permission)
    try:
        answer = await agent.ask(script({"text": "Touching.", "tools": [tool("run_command", command="touch t.txt")]},
                                        {"text": " Touched."}))
        assert answer == "Touching. Touched."
        assert (ws / "t.txt").exists()
        (request,) = asked
        assert request["toolCall"]["title"] == "`touch t.txt`"
        assert [o["kind"] for o in request["options"]] == ["allow_once", "allow_always", "reject_once"]
        sid = agent.session
        assert sid is not None and api.session(sid)["workspace"] == str(ws)

        slow = asyncio.create_task(agent.ask(script({"text": "slow", "delay_ms": 60_000})))
        after = api.session(sid)["last_seq"]
        await asyncio.to_thread(api.wait_type, sid, "turn.start", 20.0, after)
        slow.cancel()  # the client's cancel: session/cancel
        with contextlib.suppress(asyncio.CancelledError):
            await slow
        end = await asyncio.to_thread(api.wait_type, sid, "turn.end", 30.0, after)
        assert end["outcome"] == "stopped"
        await asyncio.to_thread(api.wait_idle, sid)
        assert await agent.ask("after the cancel") == "echo: after the cancel"
    finally:
        await agent.stop()

    # a new process carries the session on (session/load): it hears the transcript again
    heard: list[dict[str, Any]] = []
    again = ThirdParty(command, cwd=ws, session=sid)
    try:
        await again.start(on_update=heard.append)
        assert again.session == sid
        said = "".join(u["content"]["text"] for u in heard if u.get("sessionUpdate") == "agent_message_chunk")
        assert said.startswith("Touching. Touched.") and said.endswith("echo: after the cancel")
        assert await again.ask("once more") == "echo: once more"
    finally:
        await again.stop()
