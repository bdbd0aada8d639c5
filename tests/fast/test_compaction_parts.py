"""Compaction's pure parts: the estimate, the cut, the rewrite, the fallback, and that a
transcript rebuilt from the log with a ``context.compacted`` event is the one the live loop had."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from pydantic_ai import messages as pm
from pydantic_ai.messages import ModelRequest, ModelResponse, ToolCallPart, ToolReturnPart, UserPromptPart

from cox_runner import compaction, transcript
from cox_runner.model.script_model import plan_for
from coxswain.config import ModelConfig, ProviderConfig

SCRIPT = "do it\n```script\n" + json.dumps([{"tools": [{"name": "list_dir", "args": {"path": "."}}]}] * 60) + "\n```"


def _log(calls: int, lead_at: int | None = None, output: str = "x" * 400) -> list[dict[str, Any]]:
    """A log: an earlier turn, then this turn's message and ``calls`` rounds of one call each."""
    evs: list[dict[str, Any]] = []

    def add(**e: Any) -> None:
        evs.append({"seq": len(evs) + 1, **e})

    add(type="user.msg", text="an earlier turn", via="send", message_id="m0")
    add(type="assistant.msg", text="earlier answer", tool_calls=[], finish_reason="stop")
    add(type="user.msg", text=SCRIPT, via="send", message_id="m1")
    for i in range(calls):
        add(type="assistant.msg", text="", finish_reason="tool_call",
            tool_calls=[{"call_id": f"c{i}", "name": "list_dir", "args": {"path": "."}}])
        add(type="tool.call", call_id=f"c{i}", name="list_dir", args={"path": "."})
        add(type="tool.result", call_id=f"c{i}", ok=True, output=f"{i}:{output}")
        if i == lead_at:
            add(type="user.msg", text="LEAD: use tabs", via="lead", message_id="l1")
    return evs


def _dump(b: transcript.Builder) -> list[tuple[object, ...]]:
    b.flush()
    out: list[tuple[object, ...]] = []
    for m in b.messages:
        if isinstance(m, ModelRequest):
            out.append(("req", [(type(p).__name__, getattr(p, "content", None), getattr(p, "tool_call_id", None))
                                for p in m.parts], dict(m.metadata or {})))
        else:
            out.append(("resp", [(type(p).__name__, getattr(p, "tool_call_id", None)) for p in m.parts]))
    return out


def _unanswered(b: transcript.Builder) -> list[str]:
    """Calls without a result right after them, and results without their call."""
    problems: list[str] = []
    open_: set[str] = set()
    for m in b.messages:
        if isinstance(m, ModelResponse):
            if open_:
                problems.append(f"unanswered {open_}")
            open_ = {p.tool_call_id for p in m.parts if isinstance(p, ToolCallPart)}
        else:
            for p in m.parts:
                if isinstance(p, ToolReturnPart):
                    if p.tool_call_id not in open_:
                        problems.append(f"orphan result {p.tool_call_id}")
                    open_.discard(p.tool_call_id)
            if open_:
                problems.append(f"unanswered {open_}")
                open_ = set()
    return problems


TARGET = 1666 + compaction.TOOLS_TOKENS
"""The budget the transcript is compacted to: room for the conversation beside the tool
definitions, which every request carries (and which grow with the tools)."""


def _compact(b: transcript.Builder, summary: str | Exception = "SUMMARY", keep: int = 600,
             target: int = TARGET) -> compaction.Outcome:
    async def make(text: str) -> str:
        if isinstance(summary, Exception):
            return ""
        assert "[agent calls list_dir]" in text
        return summary
    return asyncio.run(compaction.compact(b, keep_tokens=keep, target=target, instructions="sys", make_summary=make))


def _event(out: compaction.Outcome, seq: int) -> dict[str, Any]:
    return {"seq": seq, "type": "context.compacted", "before_tokens": out.before, "after_tokens": out.after,
            "summary": out.summary, "through_seq": out.through_seq, "dropped": out.dropped}


def test_compaction_keeps_the_message_the_leads_and_recent_exchanges_and_a_rebuild_agrees() -> None:
    evs = _log(30, lead_at=5)
    live = transcript.build(evs)
    before = compaction.estimate(live.messages, "sys")
    out = _compact(live)
    assert out.summary == "SUMMARY" and out.dropped == 0 and out.after < before
    head = live.messages[0]
    assert isinstance(head, ModelRequest)
    texts = [p.content for p in head.parts if isinstance(p, UserPromptPart)]
    assert texts[0] == SCRIPT, "the turn's message, verbatim, first"
    assert isinstance(texts[1], str) and texts[1].endswith("SUMMARY") and texts[2] == "LEAD: use tabs"
    assert head.metadata is not None and head.metadata["cox_vias"] == ["send", "summary", "lead"]
    assert isinstance(live.messages[1], ModelResponse), "the kept part starts at a response"
    assert _unanswered(live) == []
    assert "an earlier turn" not in json.dumps(_dump(live)), "the earlier turn is summarized"
    # the script model goes on at the step it had reached
    kept_responses = sum(isinstance(m, ModelResponse) for m in live.messages)
    assert sum(head.metadata["cox_after"]) + kept_responses == 30
    assert plan_for(live.messages).call_prefix == "s30"

    # Rebuilt from the log with the event (and what follows): the same transcript.
    rebuilt = transcript.build([*evs, _event(out, len(evs) + 1)])
    assert _dump(rebuilt) == _dump(live)
    more: list[dict[str, Any]] = [{"seq": len(evs) + 2, "type": "assistant.msg", "text": "", "finish_reason": "tool_call",
             "tool_calls": [{"call_id": "n1", "name": "list_dir", "args": {"path": "."}}]},
            {"seq": len(evs) + 3, "type": "tool.result", "call_id": "n1", "ok": True, "output": "new"}]
    live.assistant("", more[0]["tool_calls"], "tool_call")
    live.tool_return("n1", "new")
    assert _dump(transcript.build([*evs, _event(out, len(evs) + 1), *more])) == _dump(live)


def test_a_second_compaction_keeps_the_message_and_the_lead_again() -> None:
    evs = _log(30, lead_at=5)
    b = transcript.build(evs)
    first = _compact(b)
    evs.append(_event(first, len(evs) + 1))
    for i in range(30, 50):
        n = len(evs)
        evs += [{"seq": n + 1, "type": "assistant.msg", "text": "", "finish_reason": "tool_call",
                 "tool_calls": [{"call_id": f"c{i}", "name": "list_dir", "args": {"path": "."}}]},
                {"seq": n + 2, "type": "tool.result", "call_id": f"c{i}", "ok": True, "output": "y" * 400}]
    b = transcript.build(evs)
    second = _compact(b, summary="SECOND")
    head = b.messages[0]
    assert isinstance(head, ModelRequest)
    texts = [p.content for p in head.parts if isinstance(p, UserPromptPart)]
    assert texts[0] == SCRIPT and isinstance(texts[1], str) and texts[1].endswith("SECOND") and texts[2] == "LEAD: use tabs" and len(texts) == 3
    assert plan_for(b.messages).call_prefix == "s50"
    assert _dump(transcript.build([*evs, _event(second, len(evs) + 1)])) == _dump(b)


def test_a_failed_summary_drops_the_oldest_outputs_and_a_rebuild_agrees() -> None:
    evs = _log(20)
    b = transcript.build(evs)
    out = _compact(b, summary=RuntimeError("500"), target=TARGET + 500)
    assert out.summary == "" and out.dropped > 0 and out.after <= TARGET + 500
    returns = [p for m in b.messages if isinstance(m, ModelRequest) for p in m.parts if isinstance(p, ToolReturnPart)]
    assert [p.content for p in returns[:out.dropped]] == [compaction.DROPPED_TEXT] * out.dropped
    assert returns[-1].content != compaction.DROPPED_TEXT, "the newest output stays"
    assert _unanswered(b) == []
    assert _dump(transcript.build([*evs, _event(out, len(evs) + 1)])) == _dump(b)


def test_nothing_to_summarize_in_a_fresh_turn() -> None:
    b = transcript.Builder()
    b.user("hello", "send")
    out = _compact(b, target=10_000)
    assert not out.changed


def test_context_windows_by_model() -> None:
    from cox_runner.model.providers import Models

    cfg = ModelConfig(providers=[ProviderConfig(name="a", kind="openai", context_window=1234),
                                 ProviderConfig(name="b", kind="openai"),
                                 ProviderConfig(name="c", kind="script")],
                      script={"context_window": 4000})
    m = Models(cfg)
    assert (m.window("script"), m.window("a"), m.window("b"), m.window("c"), m.window("zz")) == \
        (4000, 1234, None, 4000, None)
    assert ModelConfig().script.context_window == 200_000


def test_the_kept_estimates_equal_the_whole_estimate_as_the_history_grows_is_extended_and_is_replaced() -> None:
    est = compaction.Estimates()
    msgs: list[Any] = [ModelRequest(parts=[UserPromptPart("do it")])]
    for i in range(60):
        msgs.append(ModelResponse(parts=[ToolCallPart("write_file", {"path": f"f{i}", "content": "x" * (40 * i)},
                                                      tool_call_id=f"c{i}")]))
        msgs.append(ModelRequest(parts=[ToolReturnPart("write_file", f"wrote {i}", tool_call_id=f"c{i}")]))
        assert est(msgs, "be brief") == compaction.estimate(msgs, "be brief")
    # A message extended in place (one more part) is counted again, not taken from what was kept.
    msgs[-1].parts.append(UserPromptPart("LEAD: use tabs " * 50))
    assert est(msgs) == compaction.estimate(msgs)
    # A compaction replaces most of the history (121 messages -> 5): what was kept of the old
    # ones is let go, the rest stays.
    fresh: list[Any] = [ModelRequest(parts=[UserPromptPart("summary " * 100)]), *msgs[-4:]]
    assert est(fresh) == compaction.estimate(fresh)
    assert all(a is b for a, b in zip(est._msgs, fresh, strict=True))  # the old ones are let go
    assert est(fresh) == compaction.estimate(fresh)
    assert est.since(3) == compaction.estimate(fresh[3:]) - compaction.TOOLS_TOKENS
    # One in the middle replaced by another object of as many parts (a compaction dropping a
    # tool output): counted again from there.
    fresh[1] = ModelResponse(parts=[pm.TextPart("another answer, longer " * 30)] * len(fresh[1].parts))
    assert est(fresh) == compaction.estimate(fresh)
    # Shorter than the last one (a message dropped at the end) and then grown again.
    assert est(fresh[:2]) == compaction.estimate(fresh[:2])
    assert est(fresh) == compaction.estimate(fresh)
