"""cox acp's mapping of coxswain events to ACP session/updates and outcomes to stopReasons
(cli/cox/acp_map.py), and its cwd check, without servers (tests/stack/test_acp.py drives the whole)."""

from __future__ import annotations

from typing import Any

import pytest
from acp import RequestError

from cox.acp import under_root
from cox.acp_map import Mapper, stop_reason


def ev(type_: str, **fields: Any) -> dict[str, Any]:
    return {"type": type_, "seq": 1, "sid": "s_x", **fields}


def test_outcomes_map_to_stop_reasons_and_the_rest_to_none() -> None:
    assert [stop_reason(o) for o in ("completed", "output_limit", "hard_budget", "spend_limit", "stopped")] == [
        "end_turn", "max_tokens", "max_turn_requests", "max_turn_requests", "cancelled"]
    assert [stop_reason(o) for o in ("error", "empty", "crashed", "canceled", "context_full")] == [None] * 5


def test_streamed_text_is_said_once_and_unstreamed_text_whole() -> None:
    m = Mapper(workspace="/r/ws")
    said = [u.content.text for e in (ev("assistant.delta", text="Hel"), ev("assistant.delta", text="lo"),
                                     ev("assistant.msg", text="Hello"), ev("assistant.msg", text="Copied."))
            for u in m.updates(e)]
    assert said == ["Hel", "lo", "Copied."]


def test_own_messages_are_not_echoed_live_but_are_replayed() -> None:
    m = Mapper(workspace="/r/ws", own={"m1"})
    assert m.updates(ev("user.msg", message_id="m1", text="hi")) == []
    (u,) = m.updates(ev("user.msg", message_id="m1", text="hi"), replay=True)
    assert u.session_update == "user_message_chunk" and u.content.text == "hi"


def test_a_tool_call_its_decision_and_result() -> None:
    m = Mapper(workspace="/r/ws")
    (start,) = m.updates(ev("tool.call", call_id="c1", name="edit_file", args={"path": "a.py", "old": "x", "new": "y"}))
    assert (start.session_update, start.kind, start.title, start.status) == ("tool_call", "edit", "Edit a.py", "pending")
    assert start.locations[0].path == "/r/ws/a.py"
    preview = {"path": "a.py", "hunks": [{"lines": [{"op": " ", "text": "keep"}, {"op": "-", "text": "x"},
                                                    {"op": "+", "text": "y"}]}]}
    (allowed,) = m.updates(ev("policy.decision", call_id="c1", verdict="allow", actor="setting", reason="", preview=preview))
    (diff,) = allowed.content
    assert (allowed.status, diff.type, diff.path, diff.old_text, diff.new_text) == (
        "in_progress", "diff", "/r/ws/a.py", "keep\nx", "keep\ny")
    (done,) = m.updates(ev("tool.result", call_id="c1", ok=False, output="no match"))
    assert done.status == "failed" and done.content[0].content.text == "no match"
    (cmd,) = m.updates(ev("tool.call", call_id="c2", name="run_command", args={"command": "curl x", "network": True}))
    assert (cmd.kind, cmd.title) == ("fetch", "`curl x`")
    (refused,) = m.updates(ev("policy.decision", call_id="c2", verdict="refuse", actor="policy", reason="denylist"))
    assert refused.status == "failed" and "denylist" in refused.content[0].content.text
    (skipped,) = m.updates(ev("tool.skipped", call_id="c3", reason="lead"))
    assert skipped.status == "failed" and skipped.content[0].content.text == "skipped (lead)"


def test_plan_usage_title_and_settings() -> None:
    m = Mapper(workspace="/r/ws", context_size=1000, models=["script", "big"])
    (plan,) = m.updates(ev("plan.write", steps=["a", "b", "c"]))
    assert [e.status for e in plan.entries] == ["in_progress", "pending", "pending"]
    (plan,) = m.updates(ev("plan.step", step=1))
    assert [e.status for e in plan.entries] == ["completed", "in_progress", "pending"]
    (usage,) = m.updates(ev("usage", purpose="turn", model="script", input_tokens=300, output_tokens=20, cost=0.5))
    assert (usage.used, usage.size, usage.cost.amount, usage.cost.currency) == (320, 1000, 0.5, "USD")
    assert m.updates(ev("usage", purpose="title", model="script", input_tokens=1, output_tokens=1, cost=0.25)) == []
    (title,) = m.updates(ev("title.set", title="Fix it", source="auto"))
    assert title.session_update == "session_info_update" and title.title == "Fix it"
    mode, model = m.updates(ev("session.updated", changes={"dont_ask": True, "model": "big"}))
    assert mode.current_mode_id == "dont_ask"
    assert model.config_options[0].current_value == "big"
    assert [o.value for o in model.config_options[0].options] == ["script", "big"]


def test_a_cwd_must_be_under_the_root(tmp_path: Any) -> None:
    (tmp_path / "ws").mkdir()
    assert under_root(str(tmp_path / "ws" / "app"), str(tmp_path / "ws")) == "app"
    for cwd in ("/elsewhere", str(tmp_path / "ws"), "relative/path"):
        with pytest.raises(RequestError) as e:
            under_root(cwd, str(tmp_path / "ws"))
        assert e.value.code == -32602
