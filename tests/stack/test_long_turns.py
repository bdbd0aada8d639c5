"""Long turns, wired into the loop: the edit and search tools, usage and cost, budget warnings,
project instructions (AGENTS.md) and provider retries. Real stacks, real HTTP model servers."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.checks import finished, last_seq, of_type
from tests.support.fake_providers import FakeModels, Reply
from tests.support.flow import result, run_turn
from tests.support.stack import Api, Stack, running, script, stack_fixture, tool

# Stop during a backoff is bounded in time (1.5 s): alone in the serial lane, not beside other stacks.
pytestmark = pytest.mark.serial

PRICED = '''
[[model.providers]]
name = "script-priced"
kind = "script"
input_price = 2.0
output_price = 10.0

[limits]
tool_calls = 10
'''
long_stack = stack_fixture("long", runners=1, config=PRICED)


@pytest.fixture
def lapi(long_stack: Stack) -> Iterator[Api]:
    with long_stack.client() as client:
        yield client


def calls(*tools_: dict[str, object], text: str = "go") -> str:
    return script({"text": "Working.", "tools": list(tools_)}, {"text": "Done."}, text=text)


def test_edit_file_unique_none_several_and_count(long_stack: Stack, lapi: Api) -> None:
    s = lapi.create("long-edit")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "a.py").write_text("x = 1\ny = 1\nz = 2\n")
    evs = run_turn(lapi, sid, calls(
        tool("edit_file", path="a.py", old="z = 2", new="z = 3"),
        tool("edit_file", path="a.py", old="nowhere", new="x"),
        tool("edit_file", path="a.py", old="= 1", new="= 9"),
        tool("edit_file", path="a.py", old="= 1", new="= 5", count=2),
    ))
    ids = [e["call_id"] for e in evs if e["type"] == "tool.call"]
    res = [result(evs, i) for i in ids]
    texts = [r["output"] for r in res]
    assert res[0]["ok"] and "Wrote a.py" in texts[0]
    assert not res[1]["ok"] and "not found" in texts[1], texts[1]
    assert not res[2]["ok"] and "2" in texts[2] and "line" in texts[2].lower(), texts[2]
    assert res[3]["ok"], texts[3]
    assert (ws / "a.py").read_text() == "x = 5\ny = 5\nz = 3\n"
    kept = [e for e in evs if e["type"] == "version.kept" and e["path"] == "a.py"]
    assert len(kept) == 2, "every edit that wrote kept the previous content first"
    changes = lapi.http.get(f"/v1/sessions/{sid}/changes").json()["files"]
    assert any(f["path"] == "a.py" and f["available"] for f in changes), changes


def test_find_search_and_paged_read(long_stack: Stack, lapi: Api) -> None:
    s = lapi.create("long-find")
    sid, ws = s["id"], Path(s["workspace"])
    (ws / "src").mkdir()
    (ws / "src" / "one.py").write_text("def needle():\n    return 1\n")
    (ws / "notes.txt").write_text("".join(f"line {i}\n" for i in range(1, 101)))
    (ws / ".gitignore").write_text("build/\n")
    (ws / "build").mkdir()
    (ws / "build" / "junk.py").write_text("needle\n")
    evs = run_turn(lapi, sid, calls(
        tool("find_files", pattern="**/*.py"),
        tool("search_text", pattern="need+le"),
        tool("read_file", path="notes.txt", offset=50, limit=3),
    ))
    out = [r["output"] for r in of_type(evs, "tool.result")]
    assert "src/one.py" in out[0] and "build/junk.py" not in out[0], out[0]
    assert "src/one.py:1" in out[1] and "build" not in out[1], out[1]
    assert "line 50\nline 51\nline 52" in out[2] and "line 53" not in out[2] and "100" in out[2], out[2]


def test_usage_events_sum_to_the_session_totals_at_the_configured_prices(long_stack: Stack, lapi: Api) -> None:
    s = lapi.create("long-usage", model="script-priced")
    sid = s["id"]
    run_turn(lapi, sid, calls(tool("list_dir", path=".")))
    run_turn(lapi, sid, calls(tool("list_dir", path=".")))
    evs = lapi.all_events(sid)
    usage = of_type(evs, "usage")
    assert {u["purpose"] for u in usage} >= {"turn", "title"}
    assert len([u for u in usage if u["purpose"] == "turn"]) == 4, "two requests per turn"
    totals = lapi.session(sid)["usage"]
    assert totals["requests"] == len(usage)
    assert totals["input_tokens"] == sum(u["input_tokens"] for u in usage) > 0
    assert totals["output_tokens"] == sum(u["output_tokens"] for u in usage) > 0
    for u in usage:
        assert u["cost"] == pytest.approx((u["input_tokens"] * 2.0 + u["output_tokens"] * 10.0) / 1e6)
    assert totals["cost"] == pytest.approx(sum(u["cost"] for u in usage))
    # The gateway's /metrics counts the same requests by model and purpose.
    want = f'cox_model_requests_total{{model="script-priced",purpose="turn"}} {4:.1f}'
    deadline = time.monotonic() + 10
    while want not in (text := lapi.http.get("/metrics").text) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert want in text, [line for line in text.splitlines() if line.startswith("cox_model")]
    assert 'cox_model_cost_usd_total{model="script-priced",purpose="turn"}' in text


def test_one_warning_at_80_percent_then_the_hard_stop(long_stack: Stack, lapi: Api) -> None:
    s = lapi.create("long-warn")
    sid = s["id"]
    steps = [{"text": f"step {i}", "tools": [tool("respond", text=f"progress {i}")]} for i in range(12)]
    after = last_seq(lapi, sid)
    lapi.send(sid, script(*steps))
    end, evs = finished(lapi, sid, after=after)
    assert end["outcome"] == "hard_budget"
    warnings = of_type(evs, "limit.warning")
    assert len(warnings) == 1 and warnings[0]["limit"] == "tool_calls"
    assert warnings[0]["value"] == 8 and warnings[0]["of"] == 10
    lead = [e for e in evs if e["type"] == "user.msg" and e.get("via") == "lead"]
    assert len(lead) == 1 and "8 of 10" in lead[0]["text"]
    assert [e["value"] for e in of_type(evs, "limit.hard")] == [10]


def test_agents_md_reaches_the_model_and_retries_survive_two_429s(tmp_path: Path) -> None:
    with FakeModels() as fake:
        config = f'''
[model]
default = "fake-openai"
retry_max_s = 5

{fake.openai_provider()}
'''
        with running(tmp_path, runners=1, config=config) as st, st.client() as api:
            s = api.create("long-retry")
            sid, ws = s["id"], Path(s["workspace"])
            (ws / "AGENTS.md").write_text("Always answer in haiku. MARKER-7731\n")
            fake.cases["retry"] = [Reply("Answered after two refusals.", fails=2, retry_after=0.2)]
            evs = run_turn(api, sid, "[case:retry] hello")
            digest = hashlib.sha256(b"Always answer in haiku. MARKER-7731\n").hexdigest()
            assert of_type(evs, "turn.start")[0]["agents_md"] == digest, "turn.start records what the model got"
            end = of_type(evs, "turn.end")[0]
            assert end["outcome"] == "completed", end
            retries = of_type(evs, "model.retry")
            assert [r["attempt"] for r in retries] == [1, 2] and all("429" in r["error"] for r in retries)
            assert all(r["delay_s"] >= 0.2 for r in retries), "Retry-After is honoured"
            reqs = fake.for_case("retry")
            assert len([r for r in reqs if not r["_title"]]) == 3
            system = " ".join(str(m.get("content")) for m in reqs[-1]["messages"] if m["role"] in ("system", "developer"))
            assert "MARKER-7731" in system, "AGENTS.md is given to the model after the system prompt"

            # Stop during a long backoff ends the turn at once.
            fake.cases["slow-retry"] = [Reply("never", fails=5, retry_after=4.0)]
            after = last_seq(api, sid)
            api.send(sid, "[case:slow-retry] again")
            retry = api.wait_type(sid, "model.retry", after=after)
            assert api.http.post(f"/v1/sessions/{sid}/stop").status_code == 200
            end = api.wait_type(sid, "turn.end", after=after)
            assert end["outcome"] == "stopped"
            # Stop ended the turn inside the backoff: before the retry was due, and it never went out
            assert end["ts"] < retry["ts"] + retry["delay_s"] * 1000, (retry, end)
            assert len([r for r in fake.for_case("slow-retry") if not r["_title"]]) == 1, "no request after Stop"
