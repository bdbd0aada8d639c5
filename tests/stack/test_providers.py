"""Real providers through pydantic-ai, against real HTTP model servers (tests/support/fake_providers.py).

The OpenAI-compatible server streams chat-completion chunks with tool calls and a
``finish_reason: "length"`` case; the Anthropic one streams the messages API. Both refuse a
request that shows the model a tool call without its result, so every turn here also checks
that invariant on what the model actually received, live and after a rebuild from the log.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.checks import finished, last_seq, of_type, one
from tests.support.fake_providers import TITLE, FakeModels, Reply
from tests.support.stack import Api, Stack, running


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeModels) -> Iterator[Stack]:
    config = f"""
[model]
default = "fake-openai"

{fake.openai_provider()}

[[model.providers]]
name = "fake-claude"
kind = "anthropic"
base_url = "{fake.url}"
model = "claude-fake-1"
api_key = "sk-ant-test-not-a-key"
max_tokens = 256
"""
    with running(tmp_path_factory.mktemp("providers"), runners=1, config=config) as s:
        yield s


@pytest.fixture(autouse=True)
def no_refusals(fake: FakeModels) -> Iterator[None]:
    before = len(fake.refused)
    yield
    assert fake.refused[before:] == [], "a model was shown a tool call without its result"


def tool_messages(req: dict[str, Any]) -> dict[str, str]:
    return {m["tool_call_id"]: m["content"] for m in req["messages"] if m["role"] == "tool"}


def roles(req: dict[str, Any]) -> list[str]:
    return [m["role"] for m in req["messages"]]


def test_a_turn_with_streamed_tool_calls(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["tools"] = [
        Reply.calls(("list_dir", {"path": "."}), ("run_command", {"command": "echo hi-from-tool"}),
                    text="Let me look."),
        Reply("All good, the folder is empty."),
    ]
    s = api.create("prov-tools")
    assert s["model"] == "fake-openai"
    sid = s["id"]
    api.send(sid, "[case:tools] look around please")
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    assert end["finish_reason"] == "stop" and end["provider_finish_reason"] == "stop"
    first = of_type(evs, "assistant.msg")[0]
    assert first["text"] == "Let me look." and first["provider_finish_reason"] == "tool_calls"
    assert [c["name"] for c in first["tool_calls"]] == ["list_dir", "run_command"]
    assert first["usage"] == {"input_tokens": 50, "output_tokens": 7}
    assert "".join(e["text"] for e in of_type(evs, "assistant.delta") if e["seq"] < first["seq"]) == "Let me look."
    results = of_type(evs, "tool.result")
    assert "hi-from-tool" in results[1]["output"]
    title = one(evs, "title.set")
    assert title["title"] == TITLE and first["seq"] < title["seq"] < of_type(evs, "tool.call")[0]["seq"]

    reqs = fake.for_case("tools")
    assert len(reqs) == 2 and all(r["stream"] for r in reqs)
    assert {t["function"]["name"] for t in reqs[0]["tools"]} >= {"read_file", "write_file", "run_command",
                                                                 "respond", "plan_write", "plan_step"}
    assert reqs[0]["messages"][0]["role"] in ("system", "developer")
    assert "coding agent" in reqs[0]["messages"][0]["content"]
    ids = [c["call_id"] for c in first["tool_calls"]]
    answers = tool_messages(reqs[1])
    assert list(answers) == ids and "hi-from-tool" in answers[ids[1]]
    titles = [r for r in fake.requests if r["_title"] and r["_case"] == "tools"]
    assert len(titles) == 1 and not titles[0].get("stream")


def test_finish_reason_length_runs_no_call_and_ends_output_limit(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["length"] = [Reply.calls(("write_file", {"path": "cut.txt", "content": "never"}),
                                        text="I will now write a long", finish="length")]
    s = api.create("prov-length")
    sid = s["id"]
    api.send(sid, "[case:length] write it")
    end, evs = finished(api, sid)
    assert end["outcome"] == "output_limit"
    assert end["finish_reason"] == "length" and end["provider_finish_reason"] == "length"
    assert one(evs, "tool.skipped")["reason"] == "truncated"
    assert not of_type(evs, "tool.call") and not (Path(s["workspace"]) / "cut.txt").exists()

    # The next turn's request is rebuilt from the log: the truncated call has its result.
    fake.cases["length-next"] = [Reply("Understood.")]
    after = last_seq(api, sid)
    api.send(sid, "[case:length-next] try again, shorter")
    end, _ = finished(api, sid, after=after)
    assert end["outcome"] == "completed"
    req = fake.for_case("length-next")[0]
    call_id = one(evs, "tool.skipped")["call_id"]
    assert "cut off by the output limit" in tool_messages(req)[call_id]
    assert roles(req)[-2:] == ["tool", "user"]


def test_lead_skips_reach_the_model_as_results_then_the_lead(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["lead"] = [
        Reply.calls(("run_command", {"command": "sleep 1.5"}), ("write_file", {"path": "l.txt", "content": "l"})),
        Reply("Doing what the Lead says."),
    ]
    s = api.create("prov-lead")
    sid = s["id"]
    api.send(sid, "[case:lead] start")
    api.wait_type(sid, "tool.call")
    r = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": "use l2.txt instead"})
    assert r.status_code == 202
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    req = fake.for_case("lead")[1]
    first = of_type(evs, "assistant.msg")[0]
    sleep_id, write_id = (c["call_id"] for c in first["tool_calls"])
    answers = tool_messages(req)
    assert answers[write_id].startswith("Skipped: the person sent a newer instruction")
    assert "exit code 0" in answers[sleep_id]
    assert req["messages"][-1] == {"role": "user", "content": "use l2.txt instead"}
    assert roles(req)[-3:] == ["tool", "tool", "user"]


def test_observed_output_is_in_the_next_result_live_and_rebuilt(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["observe"] = [Reply.calls(("run_command", {"command": "sleep 1.5"})), Reply("Noted.")]
    s = api.create("prov-observe")
    sid = s["id"]
    api.send(sid, "[case:observe] wait a bit")
    call = api.wait_type(sid, "tool.call")
    assert api.http.post(f"/v1/sessions/{sid}/observe", json={"command": "echo fact-42"}).status_code == 202
    finished(api, sid)
    live = tool_messages(fake.for_case("observe")[1])[call["call_id"]]
    assert "[The operator ran `echo fact-42` in the workspace; its output:]" in live and "fact-42" in live

    fake.cases["observe-2"] = [Reply("Second turn.")]
    after = last_seq(api, sid)
    api.send(sid, "[case:observe-2] and now?")
    finished(api, sid, after=after)
    rebuilt = tool_messages(fake.for_case("observe-2")[0])[call["call_id"]]
    assert rebuilt == live, "a rebuild from the log shows the model the same result"


def test_stopped_and_denied_calls_have_results_in_the_rebuilt_transcript(stack: Stack, api: Api,
                                                                          fake: FakeModels) -> None:
    fake.cases["stop"] = [Reply.calls(("plan_write", {"steps": ["touch", "list"]})),
                          Reply.calls(("run_command", {"command": "touch z.txt"}), ("list_dir", {"path": "."}))]
    s = api.create("prov-stop")
    sid = s["id"]
    api.send(sid, "[case:stop] touch then list")
    api.wait_type(sid, "approval.pending")
    api.http.post(f"/v1/sessions/{sid}/stop")
    end, evs = finished(api, sid)
    assert end["outcome"] == "stopped"
    ids = [c["call_id"] for c in of_type(evs, "assistant.msg")[-1]["tool_calls"]]

    fake.cases["deny"] = [Reply.calls(("run_command", {"command": "touch q.txt"})), Reply("Redirected.")]
    after = last_seq(api, sid)
    api.send(sid, "[case:deny] try again")
    pending = api.wait_type(sid, "approval.pending", after=after)
    api.http.post(f"/v1/sessions/{sid}/approvals/{pending['approval_id']}",
                  json={"decision": "deny", "message": "do not touch anything; just list"})
    end, evs = finished(api, sid, after=after)
    assert end["outcome"] == "completed"
    first = fake.for_case("deny")[0]
    answers = tool_messages(first)
    assert answers[ids[0]].startswith("Cancelled") and answers[ids[1]].startswith("Cancelled")
    system = first["messages"][0]["content"]
    assert "carried from an unfinished turn" in system and "1. [ ] touch" in system, "the stopped turn's plan"
    second = fake.for_case("deny")[1]
    assert tool_messages(second)[pending["call_id"]] == "Denied by the person."
    assert second["messages"][-1] == {"role": "user", "content": "do not touch anything; just list"}


def test_a_malformed_streamed_call_gets_one_retry(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["malformed"] = [Reply(None, [("read_file", '{"path": ')]),
                               Reply.calls(("list_dir", {"path": "."})), Reply("Fine now.")]
    s = api.create("prov-malformed")
    sid = s["id"]
    api.send(sid, "[case:malformed] read")
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"
    bad = of_type(evs, "tool.result")[0]
    assert bad["ok"] is False and "malformed" in bad["output"]
    assert "malformed" in tool_messages(fake.for_case("malformed")[1])[bad["call_id"]]


def test_an_error_from_the_provider_ends_the_turn_error(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["refuse"] = [Reply("unused", error=400)]
    s = api.create("prov-error")
    sid = s["id"]
    api.send(sid, "[case:refuse] anything")
    end, _ = finished(api, sid)
    assert end["outcome"] == "error" and "model request failed" in end["detail"]
    assert "refused by the test" in end["detail"]


def test_anthropic_streaming_tool_calls_and_max_tokens(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.cases["claude"] = [
        Reply.calls(("run_command", {"command": "echo from-claude"}), text="Checking."),
        Reply("This answer was cut", finish="max_tokens"),
    ]
    s = api.create("prov-claude", model="fake-claude")
    sid = s["id"]
    api.send(sid, "[case:claude] go")
    end, evs = finished(api, sid)
    assert end["outcome"] == "output_limit"
    assert end["finish_reason"] == "length" and end["provider_finish_reason"] == "max_tokens"
    first = of_type(evs, "assistant.msg")[0]
    assert first["text"] == "Checking." and first["provider_finish_reason"] == "tool_use"
    assert "from-claude" in one(evs, "tool.result")["output"]
    assert one(evs, "title.set")["title"] == TITLE
    reqs = fake.for_case("claude", "anthropic")
    assert len(reqs) == 2 and reqs[0]["stream"] is True and reqs[0]["max_tokens"] == 256
    results = [b for b in reqs[1]["messages"][-1]["content"] if b.get("type") == "tool_result"]
    assert [b["tool_use_id"] for b in results] == [first["tool_calls"][0]["call_id"]]
    assert json.dumps(results[0]["content"]).find("from-claude") > 0
