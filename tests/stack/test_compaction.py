"""Long turns on a real stack: automatic compaction (script model and real providers through the
fake HTTP servers, which record what the model received and refuse a call without its result),
compaction when the server refuses anything over its window, a failed summary's fallback, and
the person's compaction between turns (docs/api.md, Compaction)."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.checks import finished, last_seq, of_type
from tests.support.fake_providers import SUMMARY, FakeModels, Reply
from tests.support.stack import Api, Stack, running, script, tool

WINDOW = 4000
BIG = "".join(f"line {i:03d} of the big file\n" for i in range(28))  # ~700 characters
LEAD = "LEAD-ONE: keep going, and mention tabs in the summary"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory, fake: FakeModels) -> Iterator[Stack]:
    config = f"""
[model]
default = "script"

[model.script]
context_window = {WINDOW}

{fake.openai_provider()}
context_window = {WINDOW}

[[model.providers]]
name = "fake-openai-unknown-window"
kind = "openai"
base_url = "{fake.url}/v1"
model = "fake-model"
api_key = "sk-test-not-a-key"

[[model.providers]]
name = "fake-claude"
kind = "anthropic"
base_url = "{fake.url}"
model = "claude-fake-1"
api_key = "sk-ant-test-not-a-key"
max_tokens = 256
context_window = {WINDOW}
"""
    with running(tmp_path_factory.mktemp("compaction"), runners=1, config=config) as s:
        yield s


@pytest.fixture(autouse=True)
def no_refusals(fake: FakeModels) -> Iterator[None]:
    before = len(fake.refused)
    fake.window = None
    fake.summary_error = None
    yield
    assert fake.refused[before:] == [], "a model was shown a tool call without its result"


def _lead_after(api: Api, sid: str, results: int) -> None:
    """Send the Lead once ``results`` tool results are in."""
    n = 0
    after = 0
    deadline = time.monotonic() + 60
    while n < results:
        assert time.monotonic() < deadline, "the turn did not get that far"
        for e in api.events(sid, after=after, wait=2):
            after = e["seq"]
            n += e["type"] == "tool.result"
            assert e["type"] != "turn.end", e
    r = api.http.post(f"/v1/sessions/{sid}/lead", json={"text": LEAD})
    assert r.status_code == 202, r.text


def test_a_60_call_script_turn_compacts_and_completes(stack: Stack, api: Api) -> None:
    steps: list[dict[str, Any]] = [{"tools": [tool("write_file", path="big1.txt", content=BIG[::-1])]},
                                   {"tools": [tool("plan_write", steps=["read it", "finish"])]},
                                   {"tools": [tool("plan_step", step=1)]},
                                   {"tools": [tool("write_file", path="big0.txt", content=BIG)]}]
    # two files in turn: the same call with the same result three times in a row would be stuck
    steps += [{"tools": [tool("read_file", path=f"big{i % 2}.txt")], "tokens": 20 + 5 * i} for i in range(60)]
    steps.append({"text": "Done."})
    s = api.create("compact-script")
    sid = s["id"]
    api.send(sid, script(*steps, text="read the big file sixty times"))
    _lead_after(api, sid, 8)
    end, evs = finished(api, sid, timeout=120)
    assert end["outcome"] == "completed", end
    assert len(of_type(evs, "tool.result", "tool.skipped")) == 64
    compacted = of_type(evs, "context.compacted")
    assert compacted, "a 60-call turn in a 4000-token window compacts"
    for c in compacted:
        assert c["after_tokens"] < c["before_tokens"] and c["turn_id"] == end["turn_id"]
        assert c["summary"].startswith("Summary by the script model") and c["dropped"] == 0
        assert c["through_seq"] < c["seq"]
    assert of_type(evs, "assistant.msg")[-1]["text"] == "Done.", "the script went on where it was"
    summaries = [u for u in of_type(evs, "usage") if u["purpose"] == "compaction"]
    assert len(summaries) == len(compacted), "every summary request is a usage event"

    # The next turn rebuilds the transcript from the log: the compacted one, which fits.
    after = last_seq(api, sid)
    api.send(sid, script({"text": "second turn"}))
    end, evs = finished(api, sid, after=after)
    assert end["outcome"] == "completed"
    assert not of_type([e for e in evs if e["seq"] > after], "context.compacted"), "the rebuilt one fits"


def _long_case(fake: FakeModels, name: str, calls: int = 60) -> None:
    replies = [Reply.calls(("plan_write", {"steps": ["read it", "finish"]})),
               Reply.calls(("plan_step", {"step": 1})),
               Reply.calls(("write_file", {"path": "big0.txt", "content": BIG})),
               Reply.calls(("write_file", {"path": "big1.txt", "content": BIG[::-1]}))]
    replies += [Reply.calls(("read_file", {"path": f"big{i % 2}.txt"})) for i in range(calls)]
    replies.append(Reply("All read."))
    fake.cases[name] = replies
    fake.stateful.add(name)


def _messages(req: dict[str, Any]) -> list[dict[str, Any]]:
    return list(req["messages"])


def _user_texts(req: dict[str, Any], kind: str) -> list[str]:
    out = []
    for m in _messages(req):
        if m["role"] != "user":
            continue
        c = m["content"]
        if isinstance(c, str):
            out.append(c)
        else:
            out += [b.get("text", "") for b in c if isinstance(b, dict) and b.get("type") == "text"]
    return out


def _system(req: dict[str, Any], kind: str) -> str:
    if kind == "anthropic":
        sys_ = req.get("system")
        return sys_ if isinstance(sys_, str) else " ".join(b.get("text", "") for b in sys_ or [])
    return " ".join(m["content"] for m in _messages(req) if m["role"] in ("system", "developer"))


def _check_after_compaction(fake: FakeModels, case: str, kind: str, original: str) -> dict[str, Any]:
    reqs = fake.for_case(case, kind)
    # The first compaction once the Lead is in the conversation: on a loaded machine the turn can
    # be compacted once before the Lead, sent after some results, reaches its next boundary.
    led = [i for i, r in enumerate(reqs) if LEAD in _user_texts(r, kind)]
    assert led, "the Lead reached the model"

    def summarized(r: dict[str, Any]) -> bool:
        return any("[Summary of the earlier conversation" in t for t in _user_texts(r, kind))

    # A compaction is a request that holds the summary and fewer messages than the one before it:
    # a summary made before the Lead stays in every later request, so holding one is not enough
    # (CI once took the first request after the Lead, compacted long before, for the compaction).
    compacted = [reqs[i] for i in range(max(led[0], 1), len(reqs))
                 if summarized(reqs[i]) and len(_messages(reqs[i])) < len(_messages(reqs[i - 1]))]
    assert compacted, "some request went out compacted after the Lead was in the conversation"
    first = compacted[0]
    texts = _user_texts(first, kind)
    assert original in texts, "the turn's original message, verbatim"
    assert LEAD in texts, "the Lead, verbatim"
    assert "1. [x] read it" in _system(first, kind) and "2. [ ] finish" in _system(first, kind), "the plan, marks"
    before = reqs[reqs.index(first) - 1]
    assert len(json.dumps(first["messages"])) < len(json.dumps(before["messages"])), "it is shorter"
    return first


@pytest.mark.parametrize("kind,model", [("openai", "fake-openai"), ("anthropic", "fake-claude")])
def test_a_provider_turn_compacts_keeping_message_plan_and_lead(stack: Stack, api: Api, fake: FakeModels,
                                                                 kind: str, model: str) -> None:
    case = f"long-{kind}"
    _long_case(fake, case)
    s = api.create(f"compact-{kind}", model=model)
    sid = s["id"]
    text = f"[case:{case}] read the big file sixty times"
    api.send(sid, text)
    _lead_after(api, sid, 8)
    end, evs = finished(api, sid, timeout=120)
    assert end["outcome"] == "completed", end
    assert len(of_type(evs, "tool.result", "tool.skipped")) == 64
    compacted = of_type(evs, "context.compacted")
    assert compacted and all(c["summary"] == SUMMARY for c in compacted)
    _check_after_compaction(fake, case, kind, text)
    assert len(fake.summaries()) >= len(compacted)


def test_a_server_that_refuses_requests_over_its_window_still_completes(stack: Stack, api: Api,
                                                                       fake: FakeModels) -> None:
    fake.window = WINDOW
    refused = len(fake.over_window)
    _long_case(fake, "windowed")
    s = api.create("compact-window", model="fake-openai")
    sid = s["id"]
    api.send(sid, "[case:windowed] read the big file sixty times")
    _lead_after(api, sid, 8)
    end, evs = finished(api, sid, timeout=120)
    assert end["outcome"] == "completed", end
    assert of_type(evs, "context.compacted")
    assert fake.over_window[refused:] == [], "no request went over the window"


def test_a_refusal_for_length_compacts_and_sends_again(stack: Stack, api: Api, fake: FakeModels) -> None:
    """A provider whose window the runner does not know (or underestimates) refuses a request as
    too long: the turn compacts to well under what it sent and sends once more, not `error`."""
    fake.window = WINDOW
    refused = len(fake.over_window)
    _long_case(fake, "unknown-window")
    s = api.create("compact-refused", model="fake-openai-unknown-window")
    sid = s["id"]
    api.send(sid, "[case:unknown-window] read the big file sixty times")
    end, evs = finished(api, sid, timeout=120)
    assert end["outcome"] == "completed", end
    assert len(fake.over_window) > refused, "the server refused at least one request as too long"
    assert of_type(evs, "context.compacted"), "each refusal was answered by a compaction"


def test_a_failed_summary_falls_back_to_dropping_old_outputs(stack: Stack, api: Api, fake: FakeModels) -> None:
    fake.summary_error = 500
    _long_case(fake, "nosummary", calls=30)
    s = api.create("compact-fallback", model="fake-openai")
    sid = s["id"]
    api.send(sid, "[case:nosummary] read the big file thirty times")
    end, evs = finished(api, sid, timeout=120)
    assert end["outcome"] == "completed", end
    compacted = of_type(evs, "context.compacted")
    assert compacted and all(c["summary"] == "" and c["dropped"] > 0 for c in compacted)
    last = fake.for_case("nosummary")[-1]
    tools_out = [m["content"] for m in last["messages"] if m["role"] == "tool"]
    assert any("dropped to fit the context window" in t for t in tools_out)
    assert "of the big file" in tools_out[-1] or "elif gib" in tools_out[-1], "the newest output stays"


def test_a_person_compacts_between_turns_and_not_during_one(stack: Stack, api: Api) -> None:
    s = api.create("compact-manual")
    sid = s["id"]
    steps = [{"tools": [tool("write_file", path=f"f{i}.txt", content=BIG)]} for i in range(3)]
    api.send(sid, script(*steps, {"text": "Wrote them."}, text="MANUAL-ORIGINAL write three files"))
    end, evs = finished(api, sid)
    assert end["outcome"] == "completed"

    r = api.http.post(f"/v1/sessions/{sid}/compact", json={"focus": "the files written"})
    assert r.status_code == 200, r.text
    out = r.json()
    assert out["compacted"] is True and out["summary"].startswith("Summary by the script model")
    assert out["after_tokens"] < out["before_tokens"]
    event = api.wait_type(sid, "context.compacted")
    assert event["turn_id"] is None and event["summary"] == out["summary"]
    used = [e for e in api.all_events(sid) if e["type"] == "usage" and e["purpose"] == "compaction"]
    assert len(used) == 1 and used[0]["seq"] == event["seq"] - 1
    assert api.session(sid)["usage"]["requests"] == len(of_type(api.all_events(sid), "usage"))
    assert event["through_seq"] == end["seq"] or event["through_seq"] >= of_type(evs, "assistant.msg")[-1]["seq"]
    assert not api.session(sid)["busy"]

    # No body at all is fine too; and the next turn starts from the compacted transcript.
    assert api.http.post(f"/v1/sessions/{sid}/compact").status_code == 200
    after = last_seq(api, sid)
    api.send(sid, script({"tools": [tool("read_file", path="f0.txt")]}, {"text": "ok"}, text="next turn"))
    end, _ = finished(api, sid, after=after)
    assert end["outcome"] == "completed"

    # While a turn runs: 409 busy, and nothing recorded.
    after = last_seq(api, sid)
    api.send(sid, script({"tools": [tool("run_command", command="sleep 2")]}, {"text": "slept"}))
    api.wait_type(sid, "tool.call", after=after)
    r = api.http.post(f"/v1/sessions/{sid}/compact", json={})
    assert r.status_code == 409 and r.json()["error"] == "busy", r.text
    _, evs = finished(api, sid, after=after)
    assert not [e for e in of_type(evs, "context.compacted") if e["seq"] > after]
